"""Triton python-backend model of a ``text2text_generation`` model: Hugging Face's ``generate`` over
the version folder's three ONNX graphs (``app.triton.onnx_generate``), batched across callers.

Copied as ``<model>/1/model.py`` by model preparation. The model's ``model.toml`` (beside this
version folder) names its Hugging Face folder, whose ``config.json`` and ``generation_config.json``
configure ``generate`` as they configure it for the PyTorch model.

``execute`` gets the requests Triton's dynamic batcher gathered: every text (row) of every request
is checked (the router checks first; a KServe v2 body reaches here unchanged), then the texts that
ask for the same settings are generated together in one ``generate`` call, their encoder inputs
padded to the longest of them. A text's answer does not depend on the texts it was batched with:
padding is masked, each text's search runs on its own rows, and each text stops at its own deadline
(``timeout_ms``); a request one of whose texts passed its deadline is answered an error naming it.
The settings and ``timeout_ms`` are optional inputs: a KServe v2 body may send the tokens alone, and
each setting it leaves out is the folder's default (as the router's), its deadline ``TRITON_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from app.core.generation_contract import (
    DEADLINE_MARKER,
    MAX_BEAMS,
    MAX_NGRAM,
    MAX_PENALTY,
    OUTPUT_IDS,
    SETTING_NAMES,
    SETTINGS,
    TIMEOUT_MS,
    defaults,
    end_ids,
    inputs,
    new_tokens_limit,
    read_generation_config,
)
from app.core.settings import Settings
from app.core.spec import TRITON_TO_NUMPY
from app.triton.onnx_generate import Deadlines, OnnxSeq2SeqLM, padded, trimmed
from app.triton.responses import error_response, present

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # outside Triton (unit tests call the functions below)
    pb_utils = None

PROVIDERS_PARAMETER = "ort_providers"  # ONNX Runtime's providers, by preference (the target's)


class Refused(ValueError):
    """A row of a request whose values cannot be generated from (the caller's fault: a 400)."""


@dataclass(frozen=True)
class Row:
    """One text of a request: its tokens, its settings, its deadline (``time.monotonic()``)."""

    request: int
    ids: np.ndarray
    settings: tuple
    deadline: float


def check_rows(arrays: Mapping[str, np.ndarray], vocabulary: int, max_new_tokens: int, where: str) -> None:
    """What Triton's config cannot say of a request's values: token ids within the vocabulary, a
    mask of 0 and 1 that keeps at least the first token, settings within their bounds."""
    ids, mask = arrays["input_ids"], arrays["attention_mask"]
    if ids.shape != mask.shape or ids.ndim != 2 or ids.shape[1] == 0:
        raise Refused(f"{where}: input_ids {ids.shape} and attention_mask {mask.shape} must be [texts, tokens] alike")
    if ids.min() < 0 or ids.max() >= vocabulary:
        raise Refused(f"{where}: input_ids must be token ids from 0 to {vocabulary - 1}")
    if not np.isin(mask, (0, 1)).all() or not mask[:, 0].all():
        raise Refused(f"{where}: attention_mask must be 0 or 1, and 1 at each text's first token")
    bounds = {
        "max_new_tokens": (1, max_new_tokens),
        "min_new_tokens": (0, max_new_tokens),
        "num_beams": (1, MAX_BEAMS),
        "no_repeat_ngram_size": (0, MAX_NGRAM),
        "length_penalty": (-MAX_PENALTY, MAX_PENALTY),
        "repetition_penalty": (1e-6, MAX_PENALTY),
        TIMEOUT_MS: (1, 24 * 3600 * 1000),
    }
    for name, (low, high) in bounds.items():
        values = arrays[name]
        if values.shape != (len(ids), 1) or not np.all((values >= low) & (values <= high)):
            raise Refused(f"{where}: {name} must be one value a text, from {low:g} to {high:g}")


# The inputs a request may leave out (the settings and timeout_ms), each with its Triton dtype.
OPTIONAL_DTYPES = {
    tensor["name"]: tensor["dtype"] for tensor in inputs() if tensor["name"] in (*SETTING_NAMES, TIMEOUT_MS)
}


def completed(arrays: Mapping[str, np.ndarray | None], given_defaults: Mapping[str, object]) -> dict[str, np.ndarray]:
    """A request's arrays with each setting it left out (None, or absent) one value a text: the
    default given (the folder's settings, and ``timeout_ms``)."""
    texts = len(arrays["input_ids"]) if arrays.get("input_ids") is not None else 0
    found = {name: array for name, array in arrays.items() if array is not None}
    for name, dtype in OPTIONAL_DTYPES.items():
        if name not in found:
            found[name] = np.full((texts, 1), given_defaults[name], dtype=TRITON_TO_NUMPY[dtype])
    return found


def rows_of(index: int, arrays: Mapping[str, np.ndarray], now: float) -> list[Row]:
    """A request's texts: each one's tokens (its padding dropped) with its settings and deadline."""
    rows = []
    for i, (ids, mask) in enumerate(zip(arrays["input_ids"], arrays["attention_mask"])):
        settings = tuple(arrays[name][i, 0].item() for name in SETTING_NAMES)
        deadline = now + arrays[TIMEOUT_MS][i, 0].item() / 1000.0
        rows.append(Row(index, ids[mask.astype(bool)], settings, deadline))
    return rows


def groups(rows: Sequence[Row], max_rows: int) -> list[list[int]]:
    """The rows' indices by identical settings, in order, at most ``max_rows`` a group."""
    by_settings: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        by_settings.setdefault(row.settings, []).append(i)
    return [ids[start : start + max_rows] for ids in by_settings.values() for start in range(0, len(ids), max_rows)]


class Late(RuntimeError):
    """A request one of whose texts passed its deadline (its message carries ``DEADLINE_MARKER``)."""


def answer(generator: Generator, requests: Sequence[Mapping[str, np.ndarray]], now: float) -> list:
    """Each request's ``output_ids`` (an array), or why it has none: ``Refused`` (its values),
    ``Late`` (a text passed its deadline) or the exception that failed the whole batch."""
    rows: list[Row] = []
    answers: list = [None] * len(requests)
    for index, given in enumerate(requests):
        arrays = completed(given, generator.defaults)
        try:
            check_rows(arrays, generator.vocabulary, generator.max_new_tokens, "request")
        except Refused as refused:
            answers[index] = refused
            continue
        rows.extend(rows_of(index, arrays, now))
    try:
        found, late = generator.generate(rows)
    except Exception as error:  # noqa: BLE001 - every request is answered; the model lives on
        return [given or error for given in answers]
    by_request: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_request.setdefault(row.request, []).append(i)
    for index, mine in by_request.items():
        if any(i in late for i in mine):
            waited = max(rows[i].deadline for i in mine) - now
            answers[index] = Late(f"{DEADLINE_MARKER} of {waited * 1000:.0f} ms")
        else:
            answers[index] = padded([found[i] for i in mine])
    return answers


class Generator:
    """The model and what ``execute`` needs of its folder; built once per instance."""

    def __init__(self, folder: Path, onnx_folder: Path, threads: int, providers: Sequence[str], max_rows: int) -> None:
        self.model = OnnxSeq2SeqLM(folder, onnx_folder, threads, providers)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.vocabulary = int(self.model.config.vocab_size)
        self.ends = end_ids(read_generation_config(folder), config) or (int(self.model.config.eos_token_id),)
        self.pad_id = int(self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0)
        self.max_new_tokens = new_tokens_limit(config)
        self.max_rows = max_rows
        # what a request that leaves a setting out gets: the folder's (as the router sends), and for
        # how long it may generate, Triton's timeout (the router's call to Triton gives up then)
        timeout_ms = round(Settings.from_env().triton_timeout_s * 1000)
        self.defaults = {**defaults(read_generation_config(folder)), TIMEOUT_MS: timeout_ms}

    def generate(self, rows: Sequence[Row], clock=time.monotonic) -> tuple[list[np.ndarray], set[int]]:
        """Each row's ``generate`` answer, and the rows that passed their deadline."""
        answers: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(rows)
        late: set[int] = set()
        for group in groups(rows, self.max_rows):
            longest = max(len(rows[i].ids) for i in group)
            ids = np.full((len(group), longest), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(group), longest), dtype=np.int64)
            for r, i in enumerate(group):
                ids[r, : len(rows[i].ids)] = rows[i].ids
                mask[r, : len(rows[i].ids)] = 1
            settings = dict(zip(SETTING_NAMES, rows[group[0]].settings))
            deadlines = Deadlines([rows[i].deadline for i in group], clock)
            with torch.no_grad():
                found = self.model.generate(
                    input_ids=torch.from_numpy(ids),
                    attention_mask=torch.from_numpy(mask),
                    do_sample=False,  # and one sequence a text, as token ids: whatever the folder's config says
                    num_return_sequences=1,
                    return_dict_in_generate=False,
                    max_time=None,
                    stopping_criteria=[deadlines],
                    **settings,
                ).numpy()
            for r, i in enumerate(group):
                answers[i] = trimmed(found[r], self.ends)
                if deadlines.passed[r]:
                    late.add(i)
        return answers, late


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from app.triton.onnx_model import intra_op_threads, limit_torch_threads, volunteer_for_the_oom_killer
        from clients.families import load_spec

        volunteer_for_the_oom_killer()
        config = json.loads(args["model_config"])
        spec = load_spec(Path(args["model_repository"]))
        providers = config.get("parameters", {}).get(PROVIDERS_PARAMETER, {}).get("string_value", "")
        threads = intra_op_threads(config)
        limit_torch_threads(threads)
        self.generator = Generator(
            spec.text.folder,
            Path(args["model_repository"]) / args["model_version"],
            threads,
            [p for p in providers.split(",") if p],
            max(1, int(config.get("max_batch_size", 1))),
        )
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self._warm_up()

    def _warm_up(self) -> None:
        """One short generation before the model says READY: the first caller does not pay for ONNX
        Runtime's first runs."""
        ids = np.array([self.generator.ends[0]], dtype=np.int64)
        settings = {**{s.name: s.default for s in SETTINGS}, "max_new_tokens": 2}
        self.generator.generate([Row(0, ids, tuple(settings[name] for name in SETTING_NAMES), time.monotonic() + 60)])

    def execute(self, requests: list) -> list:
        given = [
            {name: present(pb_utils.get_input_tensor_by_name(request, name)) for name in self.input_names}
            for request in requests
        ]
        answers = []
        for found in answer(self.generator, given, time.monotonic()):
            if isinstance(found, np.ndarray):
                answers.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(OUTPUT_IDS, found)]))
            elif isinstance(found, Refused):
                answers.append(error_response(str(found), pb_utils.TritonError.INVALID_ARG))
            elif isinstance(found, Late):
                answers.append(error_response(str(found), pb_utils.TritonError.UNAVAILABLE))
            else:
                answers.append(error_response(f"generation failed: {found.__class__.__name__}: {found}"))
        return answers

    def finalize(self) -> None:
        self.generator = None
