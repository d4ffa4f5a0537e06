"""``python -m pipeline``: the same as ``warren-report``."""

import sys

from pipeline.cli import main

sys.exit(main())
