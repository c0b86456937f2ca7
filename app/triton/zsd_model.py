"""Triton python-backend model of a ``zero_shot_object_detection`` model (OWLv2, OWL-ViT, Grounding
DINO): the image decoded and pre-processed as the model's image processor does it
(``clients.zsd_image``), then the detector's graph run over the request's text (``app.core.zsd_contract``).

Copied as ``<model>/1/model.py`` by model preparation; the model's ``model.toml`` (beside this version
folder) names its Hugging Face folder, whose processor config sets the pre-processing.

A request is one image and its labels' tokens. The values are checked here too (the router checks
first; a KServe v2 body reaches here unchanged); an image that does not decode, or tokens out of
bounds, are answered an error that the router reports as a 400.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.core import zsd_contract as contract
from app.core.settings import Settings
from app.core.text_spec import TextModel
from app.triton.responses import Refused, answer_each
from clients import images, zsd_image

PROVIDERS_PARAMETER = "ort_providers"


def check_tokens(
    input_ids: np.ndarray, attention_mask: np.ndarray, text_length: int, vocabulary: int, prompt: bool
) -> None:
    """OWL (``prompt`` false): ``[labels, text length]``, 1 to ``MAX_LABELS`` labels; Grounding DINO: one
    row of 1 to ``text_length`` tokens. Ids within the vocabulary, a 0/1 mask."""
    rows, length = (1, "1 to " + str(text_length)) if prompt else (contract.MAX_LABELS, str(text_length))
    if (
        input_ids.ndim != 2
        or input_ids.shape != attention_mask.shape
        or not (0 < input_ids.shape[1] <= text_length if prompt else input_ids.shape[1] == text_length)
    ):
        raise Refused(
            f"input_ids {list(input_ids.shape)} and attention_mask {list(attention_mask.shape)} must both be "
            f"[{'1' if prompt else 'labels'}, {length}]"
        )
    if not 1 <= len(input_ids) <= rows:
        raise Refused(f"1 to {rows} rows of tokens, got {len(input_ids)}")
    if (input_ids < 0).any() or (input_ids >= vocabulary).any() or not np.isin(attention_mask, (0, 1)).all():
        raise Refused(f"input_ids must lie in [0, {vocabulary}) and attention_mask be 0 or 1")


class Detector:
    """The graph's session and the processor's settings; built once per instance."""

    def __init__(self, text: TextModel, onnx_folder: Path, threads: int, providers: list[str], max_pixels: int) -> None:
        import onnxruntime as ort

        self.processing = zsd_image.read(text.folder, text.model_type)
        self.prompt = text.model_type == contract.GROUNDING_DINO
        config = json.loads((text.folder / "config.json").read_text(encoding="utf-8"))
        self.text_length = text.sequence_length
        self.vocabulary = int(config["text_config"].get("vocab_size") or 30522)
        self.max_pixels = max_pixels
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        usable = [p for p in providers if p in ort.get_available_providers()] or ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(str(onnx_folder / contract.GRAPH_FILE), options, providers=usable)

    def detect(
        self, encoded: bytes, input_ids: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``logits [boxes, columns]`` and ``pred_boxes [boxes, 4]``; an image that does not decode is
        ``InvalidItem``."""
        return self.detect_pixels(images.decode_item(encoded, self.max_pixels), input_ids, attention_mask)

    def detect_pixels(
        self, pixels: np.ndarray, input_ids: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``detect`` of a decoded image (HWC uint8 RGB), the tokens checked."""
        check_tokens(input_ids, attention_mask, self.text_length, self.vocabulary, self.prompt)
        pixels = self.processing.pixel_values(pixels)[np.newaxis]
        feed = {
            contract.PIXEL_VALUES: pixels,
            contract.INPUT_IDS: np.ascontiguousarray(input_ids, dtype=np.int64),
            contract.ATTENTION_MASK: np.ascontiguousarray(attention_mask, dtype=np.int64),
        }
        if self.prompt:  # one image: no padding, every pixel its own; BERT's one segment
            feed[contract.PIXEL_MASK] = np.ones((1, *pixels.shape[2:]), dtype=np.int64)
            feed[contract.TOKEN_TYPE_IDS] = np.zeros_like(feed[contract.INPUT_IDS])
        logits, boxes = self.session.run([contract.LOGITS, contract.PRED_BOXES], feed)
        return logits[0].astype(np.float32), boxes[0].astype(np.float32)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from app.triton.onnx_model import intra_op_threads, volunteer_for_the_oom_killer
        from clients.families import load_spec

        volunteer_for_the_oom_killer()
        config = json.loads(args["model_config"])
        spec = load_spec(Path(args["model_repository"]))
        providers = config.get("parameters", {}).get(PROVIDERS_PARAMETER, {}).get("string_value", "")
        self.detector = Detector(
            spec.text,
            Path(args["model_repository"]) / args["model_version"],
            intra_op_threads(config),
            [p for p in providers.split(",") if p],
            Settings.from_env().max_image_pixels,
        )

    def execute(self, requests: list) -> list:
        def run(given):
            logits, boxes = self.detector.detect(
                given[contract.IMAGE].tobytes(), given[contract.INPUT_IDS], given[contract.ATTENTION_MASK]
            )
            return {contract.LOGITS: logits, contract.PRED_BOXES: boxes}

        names = (contract.IMAGE, contract.INPUT_IDS, contract.ATTENTION_MASK)
        return answer_each(requests, names, run, "detection")

    def finalize(self) -> None:
        self.detector = None
