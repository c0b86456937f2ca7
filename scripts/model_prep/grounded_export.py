"""A ``grounded_segmentation`` chain's preparation: no graph of its own (its Triton model opens its
detector's and segmenter's, where their own preparation writes them), so only its config.pbtxt (the
python backend, the chain's tensors: ``app.core.grounded_contract``), its version folder's model.py
(``app/triton/grounded_model.py``) and its model.toml."""

from __future__ import annotations

import json
import shutil

from app.core.spec import SPEC_FILE
from app.triton import GROUNDED_MODEL
from scripts.model_prep.steps import VERSION, tuning_for
from scripts.model_prep.triton_config import model_config, to_text

WEIGHTS = "the detector's and the segmenter's graphs"


class GroundedExport:
    """The grounded_segmentation family's export (``Family.export``)."""

    def prepare(self, spec, options, steps) -> dict:
        folder = options.repository / spec.name
        (folder / VERSION).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(GROUNDED_MODEL, folder / VERSION / "model.py")
        config = model_config(spec, options.target, tuning_for(spec, options), WEIGHTS)
        (folder / "config.pbtxt").write_text(to_text(config))
        record = {"model": spec.name, "target": options.target, "chain": dict(spec.export)}
        (folder / "source.json").write_text(json.dumps(record, indent=2) + "\n")
        if folder.resolve() != spec.folder.resolve():
            shutil.copyfile(spec.file(SPEC_FILE), folder / SPEC_FILE)
        print(f"[{spec.name}] wrote {folder} ({options.target}: {spec.export})", flush=True)
        return {"model": spec.name, "weights": WEIGHTS, "max_abs_diff": {}}


GROUNDED = GroundedExport()
