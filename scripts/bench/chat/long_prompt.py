"""``python -m scripts.bench.chat.long_prompt``: one long prompt at real size. Prepares the chat
benchmark's folder of ``--shape`` (by default ``llama-580m-32k``: 2.3 GB of float32 weights, 32,768
positions) for ``--engine``, serves it with ``TRITON_TIMEOUT_S`` and ``MODEL_SERVER_TIMEOUT`` raised to
``--timeout``, streams one prompt of ``--prompt-tokens`` (time to its first token and to its last),
then sends one prompt past the context (a 400 naming it) and reads ``/ping``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import requests

from app.core.causal_lm_contract import ENGINES
from app.core.settings import PROJECT_ROOT
from scripts.bench import prepared
from scripts.bench.chat import plan, prepare
from scripts.bench.generation.stack_side import serving
from scripts.bench.text.plan import make_texts
from scripts.terminal import positive

DEFAULT_OUT = PROJECT_ROOT / "build" / "bench-chat-long-prompt"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.chat.long_prompt", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the folder, the repository, the cache and logs")
    p.add_argument("--shape", choices=plan.SHAPES, default=plan.SHAPES[-1], help="the benchmark Llama's sizes")
    p.add_argument("--engine", choices=ENGINES, default="openvino", help="[export] engine")
    p.add_argument("--prompt-tokens", type=positive(int), default=8192, help="the long prompt's tokens")
    p.add_argument("--new-tokens", type=positive(int), default=16, help="tokens generated after it")
    p.add_argument("--timeout", type=positive(float), default=900.0, help="seconds the stack and this caller wait")
    return p.parse_args(argv)


def streamed(url: str, text: str, new_tokens: int, timeout_s: float) -> tuple[int, float | None, float, bytes]:
    """One streamed call: its status, seconds to its first bytes and to its end, and its body."""
    body = {"modelname": plan.MODEL, "payload": {"text": text, "max_new_tokens": new_tokens, "stream": True}}
    began, first, answer = time.perf_counter(), None, b""
    with requests.post(f"{url}/invocations", json=body, stream=True, timeout=timeout_s) as response:
        for chunk in response.iter_content(None):
            first = first if first is not None else time.perf_counter() - began
            answer += chunk
    return response.status_code, first, time.perf_counter() - began, answer


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    repository = out / "repository"
    began = time.perf_counter()
    prepare.ready(out, repository, False, True, shape=args.shape, engine=args.engine, weights="fp32", precision="fp32")
    print(f"prepared in {time.perf_counter() - began:.0f} s", flush=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(prepared.sources(out, False) / plan.MODEL / "hf"))

    def count(text: str) -> int:
        return len(tokenizer(text).input_ids)

    long_text = make_texts(count, args.prompt_tokens, 1, seed=5)[0]
    positions = prepare.SHAPES[args.shape][0]["max_position_embeddings"]
    past = " ".join([long_text] * (positions // args.prompt_tokens + 1))
    seconds = f"{args.timeout:g}"
    with serving(repository, out, [("TRITON_TIMEOUT_S", seconds), ("MODEL_SERVER_TIMEOUT", seconds)]) as stack:
        for text in (long_text, past):
            status, first, whole, answer = streamed(stack.url, text, args.new_tokens, args.timeout)
            shown = "—" if first is None else f"{first:.1f} s"
            print(
                f"a prompt of {count(text):,} tokens: HTTP {status}, first bytes after {shown}, all after {whole:.1f} s"
            )
            lines = [line for line in answer.decode(errors="replace").splitlines() if line.strip()]
            print(f"  {lines[-1][:400] if lines else ''}", flush=True)
        ping = requests.get(f"{stack.url}/ping", timeout=30).status_code
        print(f"/ping {ping}")
    print(json.dumps({"shape": args.shape, "engine": args.engine, "prompt_tokens": args.prompt_tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
