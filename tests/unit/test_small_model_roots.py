"""The small-model sets' root shared by checkouts: a build keeps the other keys in use and removes
those unused for a day; and the groups of sets that processes build side by side."""

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


def test_the_groups_built_side_by_side_hold_every_set_once_and_share_no_model():
    found = sets.groups()
    assert sorted(name for group in found for name in group) == sorted(sets.SETS)
    builds = [{sets._same(*model) for name in group for model in sets.SETS[name].models.values()} for group in found]
    assert all(not (a & b) for i, a in enumerate(builds) for b in builds[i + 1 :])
    # the text set's RoBERTa masked LM is the fill_mask set's; the stack's T5 and BART are text2text's
    assert ["text", "fill_mask"] in found and ["text2text", "text2text_stack"] in found
