import sys

from governor.cli import main

sys.exit(main())
