"""``python -m scripts.bench``: see ``scripts.bench.cli``."""

import sys

from scripts.bench.cli import main

sys.exit(main())
