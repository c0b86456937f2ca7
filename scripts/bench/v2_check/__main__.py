"""``python -m scripts.bench.v2_check``: see ``scripts.bench.v2_check.cli``."""

import sys

from scripts.bench.v2_check.cli import main

sys.exit(main())
