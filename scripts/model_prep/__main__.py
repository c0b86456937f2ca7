"""``python -m scripts.model_prep``: build a Triton model repository; see ``scripts.model_prep.cli``."""

import sys

from scripts.model_prep.cli import main

sys.exit(main())
