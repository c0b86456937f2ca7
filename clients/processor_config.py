"""An image processor's settings as ``save_pretrained`` writes them: ``preprocessor_config.json``, else
``processor_config.json``'s ``image_processor`` (as transformers 5 saves a processor's), read by the
families that reproduce a Hugging Face image processor in numpy (``clients.sam_image``,
``clients.owl_image``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class ProcessingError(ValueError):
    """A processor config that a family does not reproduce (the message names the file)."""


def read(folder: Path, writer: str) -> tuple[Path, Mapping[str, Any]]:
    """The settings' file and the image processor's settings; none is an error naming ``writer``
    (what writes the file: ``SamProcessor.save_pretrained``)."""
    path = next((folder / name for name in PROCESSOR_FILES if (folder / name).is_file()), None)
    if path is None:
        raise ProcessingError(f"{folder}: no {' or '.join(PROCESSOR_FILES)} ({writer} writes it)")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ProcessingError(f"{path}: not valid JSON: {error}") from None
    return path, settings.get("image_processor", settings)
