"""``python -m scripts.model_prep.small_models``: build the small models' sets (``sets``), once per key.

python -m scripts.model_prep.small_models                  # into $TEST_SMALL_MODELS or build/small-models
python -m scripts.model_prep.small_models --list           # the sets and their models
python -m scripts.model_prep.small_models --rebuild        # build again though the key's folder is there
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scripts.model_prep.small_models import sets


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.model_prep.small_models",
        description="Build the small text models the tests serve (each set's folders and prepared "
        "repository), in a folder named by the content of what builds them; a folder already built is kept.",
    )
    parser.add_argument(
        "--root",
        type=Path,
        help=f"where the keyed folders go (default: ${sets.ROOT_VARIABLE}, else {sets.DEFAULT_ROOT})",
    )
    parser.add_argument("--rebuild", action="store_true", help="build again though this key's folder is complete")
    parser.add_argument("--list", action="store_true", help="print the sets and their models, build nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, model_set in sets.SETS.items():
            prepared = "folders and repository" if model_set.prepared else "folders"
            print(f"{name} ({prepared}): {model_set.about}")
            for model, (family, options) in model_set.models.items():
                print(f"  {model:<18} {family:<22} {options}")
        return 0
    started = time.perf_counter()
    built = sets.ensure(args.root, rebuild=args.rebuild, log=sets.print_now)
    seconds = time.perf_counter() - started
    print(f"small models: {built.path} (key {built.key}; {seconds:.1f} s)", file=sys.stderr)
    return 0
