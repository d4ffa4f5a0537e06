"""``python -m warren``: the same as ``warren-server``."""

import sys

from warren.broker.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
