"""``python -m scripts.soak``: see ``scripts.soak.cli``."""

import sys

from scripts.soak.cli import main

sys.exit(main())
