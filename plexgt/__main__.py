import sys

from plexgt.cli import entry

sys.exit(entry())
