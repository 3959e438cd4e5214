import sys

from plexgt.cli import main

sys.exit(main())
