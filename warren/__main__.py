"""``python -m warren``: the same as ``warren-server``."""

import sys

from warren.broker.server.main import main

if __name__ == "__main__":
    sys.exit(main())
