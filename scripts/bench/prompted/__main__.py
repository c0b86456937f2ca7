"""``python -m scripts.bench.prompted``: see ``scripts.bench.prompted``."""

import sys

from scripts.bench.prompted.run import main

sys.exit(main())
