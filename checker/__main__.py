"""``python -m checker`` and ``torchrun -m checker``."""

import sys

from checker.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
