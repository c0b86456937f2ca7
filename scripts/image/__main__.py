"""``python -m scripts.image``: see ``scripts.image.cli``."""

import sys

from scripts.image.cli import main

sys.exit(main())
