"""Multi-model cycles: load, call and unload a text2text and a text_generation archive again and
again on a multi-model endpoint, with the CPUs kept busy, and check that every unload ends in time.

A text_generation model is decoupled: the router reads its answers from a gRPC stream, and Triton does
not unload a model while it counts it in use. The router once dropped a stream after its final answer
but before the call's end; gRPC cancels such a call, and that cancellation, racing the call's own end,
left the model counted in use: its unload waited forever (in 3 of 5 cycles here before the fix, the
streams now read to their end). This loop is how that was found and how its fix is held.

Each cycle: load the T5 archive, call it, unload it; load the Llama archive, call it whole, call it
streamed (read to the end), unload it. Passes when every call answered 200 and every unload within
--unload-timeout seconds, and no python-backend stub is left once every model is unloaded.

    python -m scripts.soak.model_cycles                  # 20 cycles, 2 busy loops (make soak-models)
    python -m scripts.soak.model_cycles --cycles 5 --busy 0
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from scripts.devtools import Stack
from scripts.model_prep.small_models import sets
from scripts.sagemaker.model_archives import multi_model_archive

STUB = "triton_python_backend_stub"
PROMPT = "The quick brown fox"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.soak.model_cycles",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cycles", type=int, default=20, help="load-call-unload cycles of both models (20)")
    parser.add_argument("--busy", type=int, default=2, help="busy loops kept running beside the stack (2)")
    parser.add_argument("--unload-timeout", type=float, default=60.0, help="seconds an unload may take (60)")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="where the archives and logs go (a temporary folder)"
    )
    return parser.parse_args(argv)


def stubs(work: Path) -> int:
    """The python-backend stub processes of the models loaded from ``work`` (0 once none is loaded)."""
    found = subprocess.run(["pgrep", "-f", f"{STUB} {work}"], capture_output=True, text=True, check=False)
    return len(found.stdout.split())


def unload(url: str, name: str, timeout: float) -> tuple[int | str, float]:
    """Unload ``name``: the status (or "timed out") and the seconds it took."""
    began = time.monotonic()
    try:
        status: int | str = requests.delete(f"{url}/models/{name}", timeout=timeout).status_code
    except requests.Timeout:
        status = "timed out"
    return status, time.monotonic() - began


def cycle(url: str, archives: dict[str, Path], timeout: float) -> tuple[list[str], dict[str, float]]:
    """One cycle: what went wrong (empty when nothing did) and each unload's seconds."""
    failed: list[str] = []
    seconds: dict[str, float] = {}
    calls = {
        "translator": [{"payload": {"text": "hello there"}}],
        "writer": [
            {"payload": {"text": PROMPT, "max_new_tokens": 30}},
            {"payload": {"text": PROMPT, "max_new_tokens": 30, "stream": True}},
        ],
    }
    for name, bodies in calls.items():
        loaded = requests.post(f"{url}/models", json={"model_name": name, "url": str(archives[name])}, timeout=180)
        if loaded.status_code != 200:
            failed.append(f"load {name}: {loaded.status_code} {loaded.text[:200]}")
            continue
        for body in bodies:
            answer = requests.post(f"{url}/models/{name}/invoke", json=body, timeout=60)
            if answer.status_code != 200:
                failed.append(f"call {name}: {answer.status_code} {answer.text[:200]}")
        status, seconds[name] = unload(url, name, timeout)
        if status != 200:
            failed.append(f"unload {name}: {status} after {seconds[name]:.1f} s")
    return failed, seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="model-cycles-"))
    built = sets.ensure()
    print("packaging the trained T5 and Llama as multi-model archives ...", flush=True)
    _, t5 = multi_model_archive(built.models("text2text_stack"), "t5_gen", work / "t5", built.cache)
    _, llama = multi_model_archive(built.models("causal"), "llama_trained", work / "llama", built.cache)
    archives = {"translator": t5, "writer": llama}
    (work / "empty").mkdir(exist_ok=True)
    env = {"SAGEMAKER_MULTI_MODEL": "true", "MULTI_MODEL_DIR": str(work / "state")}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    stack = Stack(work / "empty", env_extra=env).start(work)
    failures: list[str] = []
    worst = {name: 0.0 for name in archives}
    try:
        print(f"healthy after {stack.wait_healthy(timeout=180):.1f} s; serve's log: {stack.log_path}", flush=True)
        for index in range(args.cycles):
            failed, seconds = cycle(stack.url, archives, args.unload_timeout)
            worst = {name: max(worst[name], seconds.get(name, 0.0)) for name in worst}
            unloads = "  ".join(f"unload {name} {s:.1f} s" for name, s in seconds.items())
            print(f"cycle {index + 1}/{args.cycles}: {unloads}  {'; '.join(failed) or 'ok'}", flush=True)
            failures += [f"cycle {index + 1}: {line}" for line in failed]
            if any("timed out" in line for line in failed):
                break  # the endpoint still waits on that model: the next cycles would only repeat it
        left = stubs(work)
    finally:
        for process in busy:
            process.kill()
        stack.stop()
    print("slowest unloads: " + ", ".join(f"{name} {s:.1f} s" for name, s in worst.items()))
    print(f"python-backend stubs left with no model loaded: {left}")
    if left:
        failures.append(f"{left} python-backend stubs outlived their models")
    print("PASS" if not failures else "FAIL:\n  " + "\n  ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
