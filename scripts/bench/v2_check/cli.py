"""``python -m scripts.bench.v2_check``: what checking a KServe v2 body costs the router, in-process.

Two requests a client of AWS's SageMaker Triton image sends, built with tritonclient's own helpers:
a good ``bert_base`` v2 JSON body (batch 1, 128 token ids and a mask), and a binary+json body of 8
images for ``resnet`` (8 x 3 x 224 x 224 FP32, 4.8 MB). Each is checked many times against the
model's contract read from the repository's config.pbtxt (what the router reads from Triton once);
printed: microseconds per call for the check alone and with the parsing the check adds (binary+json's
JSON header; a v2 JSON body is parsed to route it anyway), best of several rounds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from app.core.settings import DEFAULT_MAX_BODY_BYTES
from app.router.parsing import BINARY_JSON_TYPE, JSON_HEADER_SIZE, Request, pass_through
from clients.v2_checks import ModelContract, check_request
from scripts.devtools import built_test_repository

BUDGET_US = 100.0


def body(arrays: dict[str, np.ndarray], outputs: Sequence[str], binary: bool) -> tuple[bytes, int | None]:
    tensors = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    wanted = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in outputs]
    return httpclient.InferenceServerClient.generate_request_body(tensors, outputs=wanted)


def per_call_us(call: Callable[[], object], calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - began) / calls)
    return best * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.v2_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, default=None, help="model repository (default: the test models)")
    p.add_argument("--calls", type=int, default=2000, help="calls per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds (the best is printed)")
    args = p.parse_args(argv)
    repository = args.repository or built_test_repository()
    rng = np.random.default_rng(0)

    def contract(model: str) -> ModelContract:
        return ModelContract.from_pbtxt(model, (repository / model / "config.pbtxt").read_text())

    bert = contract("bert_base")
    ids = rng.integers(1000, 2000, (1, 128)).astype(np.int64)
    text, _ = body({"input_ids": ids, "attention_mask": np.ones_like(ids)}, sorted(bert.outputs), binary=False)
    document = json.loads(text)
    resnet = contract("resnet")
    images, size = body(
        {"input": rng.standard_normal((8, 3, 224, 224)).astype(np.float32)}, sorted(resnet.outputs), binary=True
    )
    request = Request(images, BINARY_JSON_TYPE, {JSON_HEADER_SIZE: str(size)}, target_model="resnet")
    parsed = pass_through(request, "")

    def check_images(call=None) -> None:
        call = call or pass_through(request, "")  # the header parse is work the check adds
        check_request(call.header, resnet, call.binary, DEFAULT_MAX_BODY_BYTES)

    rows = [
        ("bert_base v2 JSON, batch 1 (check)", lambda: check_request(document, bert, None, DEFAULT_MAX_BODY_BYTES)),
        ("resnet binary+json, 8 images (check)", lambda: check_images(parsed)),
        ("resnet binary+json, 8 images (header parse + check)", check_images),
    ]
    print(f"{args.rounds} rounds of {args.calls} calls, best round; budget {BUDGET_US:g} us per request")
    worst = 0.0
    for label, run in rows:
        us = per_call_us(run, args.calls, args.rounds)
        worst = max(worst, us)
        print(f"  {label:<52} {us:8.1f} us  ({us / BUDGET_US:.2f} of the budget)")
    print(f"worst {worst:.1f} us: {'within' if worst < BUDGET_US else 'OVER'} the {BUDGET_US:g} us budget")
    return 0
