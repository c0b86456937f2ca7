"""``python -m scripts.bench.text``: see ``scripts.bench.text.run``."""

import sys

from scripts.bench.text.run import main

sys.exit(main())
