"""``python -m scripts.bench.generation``: see ``scripts.bench.generation``."""

import sys

from scripts.bench.generation.run import main

sys.exit(main())
