"""``python -m scripts.bench.chat``: see ``scripts.bench.chat``."""

import sys

from scripts.bench.chat.run import main

sys.exit(main())
