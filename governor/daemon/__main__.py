import sys

from governor.daemon.entry import main

sys.exit(main())
