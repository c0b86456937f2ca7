"""A zero-shot detector's ONNX graph checked against the PyTorch model as a caller runs it, with the
tolerances that stay meaningful at the architectures' real sizes.

- Each output within ``TOLERANCE`` of torch (``atol + rtol * max|torch output|``), or, where larger,
  within ``SPREAD_FACTOR`` x PyTorch's own spread on the same input: the largest difference between its
  two attention implementations (``sdpa``, which the reference runs, and ``eager``), where the model
  has both (OWLv2, OWL-ViT). At the tiny sizes of the tests that spread is 1e-7 and the fixed
  tolerance decides; at OWLv2 base/16 on 960 pixels with random weights PyTorch differs from itself
  by 1e-3 on boxes (sigmoids of pre-activations in the hundreds) and ONNX Runtime, whose kernels all
  differ (not only the attention's), by 1.2 to 4.6 times that: a factor of 10 leaves room, a wrong
  graph is off by orders more.
- Grounding DINO's two-stage selection: the decoder's queries are the encoder's proposals of the best
  ``num_queries`` scores (``torch.topk``), each query slot with its own learned embedding, so a
  proposal ranked elsewhere changes that slot's logits and boxes, not only their order. ONNX Runtime's
  encoder drifts about 1e-5 from torch's, enough to swap proposals whose scores tie within it (random
  weights at full size: about one pair an image). The check runs the graph with its ``TopK``'s scores
  and indices as outputs too and compares them: the scores within the tolerance; where the selection
  differs, every place must be a near-tie (torch's two scores there within ``TIE_FACTOR`` x the scores'
  largest drift: a swap needs the two runtimes to disagree on both), and torch is run again with ONNX
  Runtime's selection forced, its outputs compared at the tolerance. A selection that differs beyond a
  near-tie is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from app.core import zsd_contract as contract
from clients import zsd_image
from scripts.model_prep import graph_cache
from scripts.model_prep.onnx_export import ExportError
from scripts.model_prep.recipes import Tolerance

TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
SPREAD_FACTOR = 10.0  # ONNX Runtime against torch: at most this times torch's sdpa against its eager
TIE_FACTOR = 2.0  # a swapped place's two torch scores: at most this times the scores' drift apart
SCORES = "proposal scores (two-stage top-k)"


@contextlib.contextmanager
def selection(forced: np.ndarray | None = None) -> Iterator[list]:
    """``torch.topk`` recorded while the block runs, each call's (scores, indices) appended to the list
    given; with ``forced``, its indices are those (the scores gathered at them)."""
    original = torch.topk
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def topk(scores, k, dim=-1, *args, **kwargs):
        values, indices = original(scores, k, dim, *args, **kwargs)
        if forced is not None:
            indices = torch.as_tensor(forced, dtype=indices.dtype).reshape(indices.shape)
            values = torch.gather(scores, dim, indices)
        seen.append((scores.detach().numpy().copy(), indices.numpy().copy()))
        return values, indices

    torch.topk = topk
    try:
        yield seen
    finally:
        torch.topk = original


def session(path: Path, grounded: bool):
    """ONNX Runtime on the graph; Grounding DINO's with its one ``TopK``'s scores and indices as outputs
    too (the same nodes compute the rest)."""
    import onnx
    import onnxruntime as ort

    if not grounded:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), []
    graph = onnx.load(str(path))
    found = [node for node in graph.graph.node if node.op_type == "TopK"]
    if len(found) != 1:
        raise ExportError(f"the graph has {len(found)} TopK nodes, not the two-stage selection's one")
    names = [found[0].input[0], found[0].output[1]]
    graph.graph.output.extend(
        [
            onnx.helper.make_tensor_value_info(names[0], onnx.TensorProto.FLOAT, None),
            onnx.helper.make_tensor_value_info(names[1], onnx.TensorProto.INT64, None),
        ]
    )
    return ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]), names


def near_ties(scores: np.ndarray, found_scores: np.ndarray, chosen: np.ndarray, found: np.ndarray) -> int:
    """How many places ONNX Runtime's selection ``found`` differs from torch's ``chosen``, each place a
    near-tie of torch's ``scores``; refused where one is not."""
    scores, chosen, found = scores.reshape(-1), chosen.reshape(-1), found.reshape(-1)
    drift = float(np.max(np.abs(scores - found_scores.reshape(-1))))
    places = np.flatnonzero(chosen != found)
    gaps = np.abs(scores[chosen[places]] - scores[found[places]])
    if places.size and gaps.max() > TIE_FACTOR * drift:
        worst = places[np.argmax(gaps)]
        raise ExportError(
            f"ONNX Runtime's two-stage selection differs from torch's at {places.size} of {chosen.size} "
            f"places, not only among near-ties: at {worst} proposal {found[worst]} for {chosen[worst]}, torch "
            f"scores {gaps.max():.3g} apart, past {TIE_FACTOR:g} x the scores' drift {drift:.3g}"
        )
    return int(places.size)


def _logits(want: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Grounding DINO's logits are -inf past the prompt's tokens: the same columns infinite in both, or
    the export is refused; the finite ones compared."""
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(found)):
        raise ExportError("ONNX Runtime's logits are infinite elsewhere than torch's")
    return np.where(finite, want, 0.0), np.where(finite, found, 0.0)


def spread(model, given, want, seen: dict) -> None:
    """``seen[output]``: the largest |sdpa - eager| of torch's outputs so far, where the model runs both."""
    if model.config._attn_implementation != "sdpa":
        return
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            other = model(**given)
    finally:
        model.set_attn_implementation("sdpa")
    for name, a, b in (
        (contract.LOGITS, want.logits, other.logits),
        (contract.PRED_BOXES, want.pred_boxes, other.pred_boxes),
    ):
        a, b = _logits(a.numpy().astype(np.float64), b.numpy())
        seen[name] = max(seen.get(name, 0.0), float(np.max(np.abs(a - b))))


def check(spec, model, processor, path: Path, images, texts, inputs) -> tuple[dict, dict]:
    """onnx.checker; the numpy pixel_values against the processor's on ``images``; ONNX Runtime against
    torch on each image with each of ``texts``; ``inputs``: the graph's inputs, pixel_values first."""
    import onnx

    onnx.checker.check_model(str(path))
    grounded = spec.text.model_type == contract.GROUNDING_DINO
    runtime, selected = session(path, grounded)
    processing = zsd_image.read(spec.text.folder, spec.text.model_type)
    diffs: dict[str, float] = {}
    limits: dict[str, float] = {}
    spreads: dict[str, float] = {}
    swapped = 0
    for image in images:
        ours = processing.pixel_values(image)
        for number, text in enumerate(texts):
            given = processor(images=image, text=text, return_tensors="pt")
            if number == 0:
                graph_cache.difference(
                    "pixel_values (numpy vs processor)",
                    given["pixel_values"][0].numpy(),
                    ours,
                    TOLERANCE,
                    diffs,
                    limits,
                )
            feed = {name: given[name].numpy().astype(np.int64) for name in inputs[1:]}
            feed[contract.PIXEL_VALUES] = ours[np.newaxis]
            logits, boxes, *picked = runtime.run([contract.LOGITS, contract.PRED_BOXES, *selected], feed)
            with selection() as seen, torch.no_grad():
                want = model(**given)
            if grounded:
                graph_cache.difference(SCORES, seen[0][0], picked[0], TOLERANCE, diffs, limits)
                if not np.array_equal(seen[0][1], picked[1]):
                    swapped += near_ties(seen[0][0], picked[0], seen[0][1], picked[1])
                    with selection(picked[1]), torch.no_grad():
                        want = model(**given)
            if number == 0:
                spread(model, given, want, spreads)
            reference, logits = _logits(want.logits.numpy(), logits)
            graph_cache.difference(contract.LOGITS, reference, logits, TOLERANCE, diffs, limits)
            graph_cache.difference(contract.PRED_BOXES, want.pred_boxes, boxes, TOLERANCE, diffs, limits)
    widen(spec.name, limits, spreads, swapped)
    graph_cache.refuse_beyond(spec.name, diffs, limits)
    return diffs, limits


def widen(name: str, limits: dict, spreads: dict, swapped: int) -> None:
    """``limits`` raised to ``SPREAD_FACTOR`` x torch's own spread where that is larger; that spread and
    the swapped near-ties (if any) printed."""
    for output, value in spreads.items():
        limits[output] = max(limits[output], SPREAD_FACTOR * value)
    if spreads:
        shown = ", ".join(f"{output} {value:.3g}" for output, value in spreads.items())
        print(
            f"[{name}] torch's own spread (sdpa vs eager): {shown}; the limits: {SPREAD_FACTOR:g} x that where larger"
        )
    if swapped:
        print(
            f"[{name}] ONNX Runtime's two-stage selection swapped {swapped} near-tied proposals: torch run again "
            "with its selection, compared at the tolerance",
            flush=True,
        )
