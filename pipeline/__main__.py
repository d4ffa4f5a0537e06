"""``python -m warren.pipeline``: the same as ``warren-report``."""

import sys

from warren.pipeline.cli import main

sys.exit(main())
