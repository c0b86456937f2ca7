"""``python -m scripts.bench.preprocessing``: see ``scripts.bench.preprocessing.cli``."""

import sys

from scripts.bench.preprocessing.cli import main

sys.exit(main())
