"""``python -m scripts.model_prep.small_models``: see ``scripts.model_prep.small_models.cli``."""

import sys

from scripts.model_prep.small_models.cli import main

sys.exit(main())
