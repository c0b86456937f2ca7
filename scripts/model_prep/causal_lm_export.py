"""A ``text_generation`` model's export: a Hugging Face decoder-only folder to the one ONNX graph its
Triton model steps over (``decoder.onnx``, ``app.core.causal_lm_contract``), checked, and its Triton
model for any target (the python backend; the target picks ONNX Runtime's providers).

The folder's model is loaded with ``AutoModelForCausalLM`` (eager attention, float32, eval mode; its
own weights, or seeded random ones of its ``config.json``) and exported by ``causal_lm_graph.export``
into a cache keyed by the weights and the folder (``build/onnx/<model>/<key>/``), then checked as the
other exports are, each check printed:

- ``onnx.checker`` on the graph;
- ONNX Runtime against torch at a later step (batch 2, a past of 3 tokens, the second row left-padded)
  and at the prompt's step (an empty past): the logits and every layer's keys and values, the max
  difference held to ``TOLERANCE``;
- greedy generation over the graph (ONNX Runtime: a left-padded batch of two prompts, positions
  counted over the attention mask as ``generate`` counts them, ``CHECK_NEW_TOKENS`` new tokens, each
  row ending at the folder's end-of-sequence ids) against the PyTorch model's ``generate(...,
  do_sample=False)``, token for token.

An architecture (config.json's ``model_type``) outside ``ARCHITECTURES`` is still tried: where its
load, its export or any check fails, preparation stops with one line naming the folder, the
model_type and what failed. A graph over protobuf's 2 GB keeps its weights in one file beside it
(``decoder.onnx.data``), linked into the version folder with it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

import app.triton
from app.core.causal_lm_contract import (
    ATTENTION_MASK,
    ENGINE_KEY,
    ENGINES,
    GRAPH_FILE,
    INPUT_IDS,
    IR_FILE,
    IR_WEIGHTS,
    LAST_POSITION,
    LOGITS,
    LOGITS_POSITIONS,
    POSITION_IDS,
    PRECISION_KEY,
    PRECISIONS,
    WEIGHT_FORMATS,
    WEIGHTS_KEY,
    cache_names,
)
from app.core.spec import ModelSpec
from scripts.model_prep import causal_lm_graph, weights
from scripts.model_prep.causal_lm_checks import (
    CHECK_NEW_TOKENS,
    cut,
    end_ids,
    first_line,
    greedy_generate,
    min_agreement,
    positions,
    prompts,
    refusal,
)
from scripts.model_prep.onnx_export import OPSET, REPORT_FILE, ExportError, sha256_of
from scripts.model_prep.recipes import Tolerance

TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
PAST_TOKENS = 3  # the later step is checked after this many tokens
GRAPH_REVISION = 1  # causal_lm_graph's wrapper: a graph cached by another revision is exported again
DATA_FILE = f"{GRAPH_FILE}.data"  # the weights of a graph over 2 GB, beside it
CHECKED = "greedy generation over the graph equals generate()"


def load_model(spec: ModelSpec, choice: weights.WeightsChoice) -> nn.Module:
    """The folder's causal LM with its own weights, or seeded random ones of its config."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    folder = spec.text.folder
    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # its lines would cut the step's own line, and a refusal's
    try:
        if choice.source == weights.FILE:
            model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32)
        else:
            torch.manual_seed(choice.seed)
            config = AutoConfig.from_pretrained(str(folder))
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    except (OSError, ValueError, KeyError, ImportError) as error:
        config = json.loads((folder / "config.json").read_text())
        if "auto_map" in config:
            raise refusal(
                spec, "its modeling code is the folder's own (config.json auto_map, trust_remote_code), not run here"
            ) from None
        raise refusal(spec, f"transformers cannot load it as a causal LM ({first_line(error)})") from None
    finally:
        if bar:
            logging.enable_progress_bar()
    return model.float().eval()


def export(spec: ModelSpec, model: nn.Module, folder: Path) -> None:
    """The graph into ``folder``; a failed export is a refusal naming what failed."""
    try:
        causal_lm_graph.export(model, folder / GRAPH_FILE)
    # The exporter's failures have no one type (torch.onnx's own, or the model's Python that does not
    # trace: TypeError, AttributeError, ...): each becomes the refusal of one line that names it.
    except Exception as error:  # noqa: BLE001
        raise refusal(spec, f"its export to ONNX failed ({first_line(error)})") from None
    model.eval()
    if any(path.name != GRAPH_FILE for path in folder.iterdir()):
        one_data_file(folder / GRAPH_FILE)


def one_data_file(path: Path) -> None:
    """A graph whose weights the exporter wrote beside it, one file a tensor (over 2 GB), with them
    in one file instead (``DATA_FILE``)."""
    import onnx

    graph = onnx.load(str(path))
    for stale in path.parent.iterdir():
        stale.unlink()
    onnx.save_model(graph, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=DATA_FILE)


def graph_files(folder: Path) -> list[str]:
    """The files the version folder links: the graph, its weights beside it (over 2 GB), and the
    OpenVINO IR where the engine is OpenVINO's (a cache folder is one engine's: ``config_digest``)."""
    optional = (DATA_FILE, IR_FILE, IR_WEIGHTS)
    return [GRAPH_FILE, *(name for name in optional if (folder / name).is_file())]


def engine_of(spec: ModelSpec) -> tuple[str, str, str]:
    """``[export] engine``, ``weights`` and ``precision``: what steps the running batch (``ENGINES``;
    onnxruntime when not said), the weights' format (``WEIGHT_FORMATS``) and the arithmetic
    (``PRECISIONS``); ONNX Runtime's engine takes fp32 alone."""
    engine = spec.export.get(ENGINE_KEY, ENGINES[0])
    if engine not in ENGINES:
        raise ExportError(f"[{spec.name}] [export] {ENGINE_KEY} = {engine!r}: one of {', '.join(map(repr, ENGINES))}")
    chosen = []
    for key, values in ((WEIGHTS_KEY, WEIGHT_FORMATS), (PRECISION_KEY, tuple(PRECISIONS))):
        taken = values if engine == "openvino" else values[:1]
        given = spec.export.get(key, values[0])
        if given not in taken:
            needs = f' with [export] {ENGINE_KEY} = "openvino"' if given in values else ""
            raise ExportError(f"[{spec.name}] [export] {key} = {given!r}: one of {', '.join(map(repr, values))}{needs}")
        chosen.append(given)
    min_agreement(spec)  # refused now, not after the export
    return engine, chosen[0], chosen[1]


def runtime_errors() -> tuple[type[Exception], ...]:
    """What ONNX Runtime raises for a graph it cannot load or run (its own classes derive from Exception)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return (RuntimeError, ValueError, state.Fail, state.InvalidArgument, state.InvalidGraph, state.NotImplemented)


def _run(spec: ModelSpec, session, feed: dict) -> list[np.ndarray]:
    try:
        return session.run(None, feed)
    except runtime_errors() as error:
        raise refusal(spec, f"ONNX Runtime cannot run its graph ({first_line(error)})") from None


def check_tensors(spec: ModelSpec, model: nn.Module, session) -> None:
    """The graph's inputs and outputs are the contract's, in order (a model that reads no positions,
    ALiBi's, has a graph without ``position_ids``)."""
    layers = causal_lm_graph.layers_of(model)
    want = (
        [INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *cache_names(layers, "past"), LOGITS_POSITIONS],
        [LOGITS, *cache_names(layers, "present")],
    )
    got = [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]
    if got != want:
        missing = [name for name in want[0] + want[1] if name not in got[0] + got[1]]
        raise refusal(
            spec,
            f"its graph's tensors are not the contract's (app.core.causal_lm_contract): "
            f"{'it has no ' + ', '.join(missing) if missing else f'inputs {got[0]}, outputs {got[1]}'}",
        )


def _feed(model: nn.Module, inputs: tuple, kept=LAST_POSITION) -> dict[str, np.ndarray]:
    names = [INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *cache_names(causal_lm_graph.layers_of(model), "past")]
    return {**{name: np.asarray(tensor) for name, tensor in zip(names, inputs)}, LOGITS_POSITIONS: np.asarray(kept)}


def compare_steps(spec: ModelSpec, model: nn.Module, session) -> tuple[dict, dict]:
    """ONNX Runtime against torch at a later step and at the prompt's step: the logits and the keys
    and values (all layers), the max abs differences and their limits."""
    diffs: dict[str, float] = {}
    limits: dict[str, float] = {}
    cases = {  # a later step's last logits; the prompt's step, every position's (its log-probabilities)
        f"past {PAST_TOKENS}": (causal_lm_graph.sample_inputs(model, past=PAST_TOKENS), LAST_POSITION),
        "past 0, the prompt": (causal_lm_graph.sample_inputs(model, past=0, new=5), tuple(range(5))),
    }
    step = causal_lm_graph.Step(model).eval()
    for case, (inputs, kept) in cases.items():
        with torch.no_grad():
            reference = [tensor.numpy() for tensor in step(*inputs, causal_lm_graph.kept(*kept))]
        found = _run(spec, session, _feed(model, inputs, kept))
        shapes = [list(r.shape) for r in reference], [list(f.shape) for f in found]
        if shapes[0] != shapes[1]:
            raise refusal(spec, f"ONNX Runtime gives the shapes {shapes[1]} at the {case} step, torch {shapes[0]}")
        for name, ours, theirs in (("logits", reference[:1], found[:1]), ("keys and values", reference[1:], found[1:])):
            # the tensor furthest from torch, measured against its own limit
            pairs = [
                (float(np.max(np.abs(r.astype(np.float64) - f))), TOLERANCE.limit(r)) for r, f in zip(ours, theirs)
            ]
            diffs[f"{name} ({case})"], limits[f"{name} ({case})"] = max(pairs, key=lambda pair: pair[0] / pair[1])
    model.eval()
    failed = [f"{n} {diffs[n]:.3g} > {limits[n]:.3g}" for n in diffs if not diffs[n] <= limits[n]]
    if failed:
        raise refusal(spec, "ONNX Runtime differs from torch beyond the tolerance: " + "; ".join(failed))
    return diffs, limits


def greedy_over_graph(
    spec: ModelSpec,
    model: nn.Module,
    session,
    ids,
    mask,
    ends: tuple[int, ...],
    pad: int,
    new_tokens: int = CHECK_NEW_TOKENS,
) -> list[list[int]]:
    """``new_tokens`` greedy steps over the graph, the cache carried from step to step: each row's
    new tokens up to its first end-of-sequence token."""
    mask = mask.numpy()
    feed = _feed(model, (ids, mask, positions(mask), *causal_lm_graph.empty_past(model, len(ids))))
    past = cache_names(causal_lm_graph.layers_of(model), "past")
    done = np.zeros(len(ids), dtype=bool)
    tokens = []
    for _ in range(new_tokens):
        logits, *present = _run(spec, session, feed)
        chosen = np.where(done, pad, logits[:, -1].argmax(-1))
        tokens.append(chosen)
        done |= np.isin(chosen, ends)
        if done.all():
            break
        mask = np.concatenate([mask, np.ones((len(ids), 1), dtype=mask.dtype)], axis=1)
        feed = {
            INPUT_IDS: chosen[:, None].astype(np.int64),
            ATTENTION_MASK: mask,
            POSITION_IDS: positions(mask)[:, -1:],
            LOGITS_POSITIONS: np.asarray(LAST_POSITION),
        }
        feed.update(zip(past, present))
    return cut(np.stack(tokens, axis=1), ends)


def check(spec: ModelSpec, model: nn.Module, folder: Path, seed: int) -> tuple[dict, dict, list]:
    """onnx.checker, ONNX Runtime against torch (a later step, the prompt's step), then greedy
    generation over the graph against ``generate``: the diffs, their limits and the tokens."""
    import onnx
    import onnxruntime as ort

    path = str(folder / GRAPH_FILE)
    try:
        onnx.checker.check_model(path)
    except onnx.checker.ValidationError as error:
        raise refusal(spec, f"onnx.checker refuses its graph ({first_line(error)})") from None
    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except runtime_errors() as error:
        raise refusal(spec, f"ONNX Runtime cannot load its graph ({first_line(error)})") from None
    check_tensors(spec, model, session)
    diffs, limits = compare_steps(spec, model, session)
    ends, pad = end_ids(spec, model)
    ids, mask = prompts(model, pad, seed)
    got = greedy_over_graph(spec, model, session, ids, mask, ends, pad)
    want = greedy_generate(model, ids, mask, ends, pad)
    if got != want:
        raise refusal(spec, f"its export does not equal generate (tokens {got} against {want})")
    return diffs, limits, want


def digest(folder: Path) -> str:
    """One sha256 of the graph's files (source.json's ``onnx_sha256``)."""
    found = hashlib.sha256()
    for name in graph_files(folder):
        found.update(name.encode() + bytes.fromhex(sha256_of(folder / name)))
    return found.hexdigest()


def cached(folder: Path) -> dict | None:
    """A previous export's report where its graph is there, of this opset and wrapper revision."""
    report = folder / REPORT_FILE
    if not report.is_file() or not (folder / GRAPH_FILE).is_file():
        return None
    found = json.loads(report.read_text())
    same = found.get("opset") == OPSET and found.get("graph_revision") == GRAPH_REVISION
    return found if same and found.get("onnx_sha256") == digest(folder) else None


def ensure_export(spec: ModelSpec, choice: weights.WeightsChoice, cache: Path, reexport: bool, step) -> dict:
    """The checked graph of (model, weights) in ``cache`` and its report (from the cache when there)."""
    engine, formats, precision = engine_of(spec)
    if engine == "openvino":
        from scripts.model_prep import causal_lm_openvino

        why = causal_lm_openvino.unsupported(json.loads((spec.text.folder / "config.json").read_text()))
        if why:
            raise refusal(spec, why)
    hit = None if reexport else cached(cache)
    if hit and hit.get(ENGINE_KEY, ENGINES[0]) == engine:
        print(f"[{spec.name}] ONNX export ({choice.describe()}) from the cache: {cache}", flush=True)
        return hit
    with step(spec.name, f"loading the {spec.text.model_type} model ({choice.describe()})"):
        model = load_model(spec, choice)
    partial = cache / "partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with step(spec.name, "exporting the decoder's step (key/value cache in and out) to ONNX"):
        export(spec, model, partial)
    with step(spec.name, "checking the export (onnx.checker, ONNX Runtime vs torch, greedy vs generate)"):
        diffs, limits, tokens = check(spec, model, partial, choice.seed)
    if engine == "openvino":
        from scripts.model_prep import causal_lm_openvino

        quantized = causal_lm_openvino.prepare(spec, model, partial, choice.seed, tokens, step, formats, precision)
    for name in graph_files(partial):
        (partial / name).replace(cache / name)
    shutil.rmtree(partial)
    report = {
        "opset": OPSET,
        "graph_revision": GRAPH_REVISION,
        "model_type": spec.text.model_type,
        "onnx_sha256": digest(cache),
        "max_abs_diff": diffs,
        "tolerance": limits,
        "greedy_tokens": tokens,
        ENGINE_KEY: engine,
        **(quantized if engine == "openvino" else {}),
    }
    (cache / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def write_version(version: Path, cache: Path, link, graphs: bool = True) -> None:
    """The version folder: the graph (not with ``graphs`` False: --config-only) and the python-backend
    model that steps over it (``app/triton/causal_lm_model.py`` as ``model.py``)."""
    source = app.triton.CAUSAL_LM_MODEL
    if not source.is_file():
        raise ExportError(f"{source} is missing: the text_generation family's Triton model")
    version.mkdir(parents=True, exist_ok=True)
    for stale in ("model.onnx", "model.plan", GRAPH_FILE, DATA_FILE, IR_FILE, IR_WEIGHTS):
        (version / stale).unlink(missing_ok=True)
    for name in graph_files(cache) if graphs else ():
        link(cache / name, version / name)
    shutil.copyfile(source, version / "model.py")


class CausalLM:
    """The text_generation family's export (``Family.export``): one checked graph and the decoupled
    python-backend model that steps over it (``steps``: ``scripts.model_prep.steps.STEPS``)."""

    def prepare(self, spec, options, steps) -> dict:
        import sys

        return steps.prepare_generation(spec, options, sys.modules[__name__])


CAUSAL_LM = CausalLM()
