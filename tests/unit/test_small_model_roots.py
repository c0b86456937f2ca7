"""The small-model sets' root shared by checkouts: a build keeps the other keys in use and removes
those unused for a day."""

from __future__ import annotations

import os
import time

from scripts.model_prep.small_models import sets


def test_a_build_removes_only_other_keys_unused_for_a_day(tmp_path):
    for key in ("current", "in_use", "old", "old_without_lock"):
        (tmp_path / key / "text").mkdir(parents=True)
        (tmp_path / f"{key}.lock").touch()
    (tmp_path / "old_without_lock.lock").unlink()
    long_ago = time.time() - sets.STALE_S - 60
    os.utime(tmp_path / "old.lock", (long_ago, long_ago))
    os.utime(tmp_path / "old_without_lock", (long_ago, long_ago))

    sets._remove_stale(tmp_path, "current")

    assert sorted(path.name for path in tmp_path.iterdir()) == ["current", "current.lock", "in_use", "in_use.lock"]
