import sys

from governor.daemon.main import main

sys.exit(main())
