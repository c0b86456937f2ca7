"""``python -m scripts.gpu_check``: see ``scripts.gpu_check.cli``."""

import sys

from scripts.gpu_check.cli import main

sys.exit(main())
