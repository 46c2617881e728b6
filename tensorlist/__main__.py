"""``python -m tensorlist``: the command line (see tensorlist.cli)."""
import sys

from tensorlist.cli import main

if __name__ == "__main__":
    sys.exit(main())
