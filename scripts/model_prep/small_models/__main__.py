"""``python -m scripts.model_prep.small_models``: see ``scripts.model_prep.small_models.cli``."""

import sys

from scripts.model_prep.small_models.cli import main

if __name__ == "__main__":  # not in the processes that build the sets (spawned: they import this module)
    sys.exit(main())
