"""Run a JSON Lines file through the local stack the way a SageMaker Batch Transform job does
(SplitType Line, BatchStrategy MultiRecord, AssembleWith Line), to try a job before paying for one.

Asks the container's GET /execution-parameters (--concurrency and --max-payload-mb override what it
answers), cuts the input's lines (each an envelope: {"modelname": "bert_base", "payload": {"text":
"Paris is [MASK]."}}) into mini-batches of consecutive lines of at most MaxPayloadInMB each, posts
them as application/jsonlines with up to MaxConcurrentTransforms requests in flight, and writes the
answers in input order to the output file, one line per input line, only when every batch succeeded
(never a partial file). Progress goes to stderr, a summary line to stdout.

    python -m scripts.caller batch-local requests.jsonl answers.jsonl
    python -m scripts.caller batch-local requests.jsonl answers.jsonl --concurrency 4 --max-payload-mb 2

A refused batch is reported with the line number in the input file, and the exit status is 1:

    batch_local: line 137: payload.img is not a decodable image (400 invalid_input)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import requests

from scripts.terminal import positive

JSONLINES = "application/jsonlines"
MIB = 1024 * 1024
PROG = "batch_local"


class JobFailed(Exception):
    """What stops the job; its text is printed after "batch_local: "."""


@dataclass(frozen=True)
class Batch:
    start: int  # the file's line number (1-based) of the batch's first line
    lines: tuple[bytes, ...]

    @property
    def span(self) -> str:
        return f"lines {self.start}-{self.start + len(self.lines) - 1}"


def read_lines(data: bytes) -> list[bytes]:
    """The records of a JSON Lines file: split on "\\n", a final "\\n" optional."""
    return data.removesuffix(b"\n").split(b"\n") if data else []


def split_batches(lines: Sequence[bytes], max_bytes: int) -> list[Batch]:
    """Consecutive lines, each batch's body (every line ending in "\\n") at most ``max_bytes``."""
    batches: list[Batch] = []
    start, size = 0, 0
    for index, line in enumerate(lines):
        if len(line) + 1 > max_bytes:
            raise JobFailed(
                f"line {index + 1} is {len(line) + 1} bytes with its newline, over the payload limit of "
                f"{max_bytes} bytes (MaxPayloadInMB): raise --max-payload-mb; nothing was sent"
            )
        if size + len(line) + 1 > max_bytes:
            batches.append(Batch(start + 1, tuple(lines[start:index])))
            start, size = index, 0
        size += len(line) + 1
    if start < len(lines):
        batches.append(Batch(start + 1, tuple(lines[start:])))
    return batches


def refusal(batch: Batch, status: int, body: bytes) -> str:
    """The server's error for a batch, its line number translated to the file's."""
    try:
        error = json.loads(body)["error"]
        code, message, line = error.get("code", ""), str(error.get("message", "")), error.get("line")
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"{batch.span}: refused with status {status}: {body[:300].decode(errors='replace')}"
    if isinstance(line, int) and 1 <= line <= len(batch.lines):  # the message's own "line N: " goes
        return f"line {batch.start + line - 1}: {re.sub(r'^line [0-9]+:[ ]*', '', message)} ({status} {code})"
    return f"{batch.span}: {message} ({status} {code})"


def post_batch(session: requests.Session, url: str, batch: Batch, timeout: float) -> bytes:
    """The answer's lines (each ending in "\\n"), one per line of the batch."""
    try:
        response = session.post(
            f"{url}/invocations",
            data=b"".join(line + b"\n" for line in batch.lines),
            headers={"Content-Type": JSONLINES, "Accept": JSONLINES},
            timeout=(10, timeout),
        )
    except requests.Timeout:
        raise JobFailed(f"{batch.span}: no answer within {timeout:g} s (--timeout)") from None
    if response.status_code != 200:
        raise JobFailed(refusal(batch, response.status_code, response.content))
    answered = len(read_lines(response.content))
    if answered != len(batch.lines) or not response.content.endswith(b"\n"):
        raise JobFailed(f"{batch.span}: the answer has {answered} lines for {len(batch.lines)} sent")
    return response.content


class Progress:
    """lines done / total, batches, elapsed, lines/s: redrawn in place on a terminal, a line every
    ``every`` seconds otherwise; ended by a final update, a failed job's too."""

    def __init__(self, lines: int, batches: int, stream: IO[str], every: float = 5.0) -> None:
        self.lines, self.batches, self.stream, self.every, self.tty = lines, batches, stream, every, stream.isatty()
        self.began = self.shown = time.monotonic()

    def line(self, lines_done: int, batches_done: int) -> str:
        elapsed = time.monotonic() - self.began
        filled = 24 * lines_done // max(self.lines, 1)
        return (
            f"[{'#' * filled}{'.' * (24 - filled)}] {lines_done}/{self.lines} lines, {batches_done}/{self.batches} "
            f"batches, {elapsed:.1f} s, {lines_done / max(elapsed, 1e-9):.1f} lines/s"
        )

    def update(self, lines_done: int, batches_done: int, final: bool = False) -> None:
        if self.tty:
            self.stream.write("\r" + self.line(lines_done, batches_done) + ("\n" if final else ""))
        elif final or time.monotonic() - self.shown >= self.every:
            self.stream.write(self.line(lines_done, batches_done) + "\n")
            self.shown = time.monotonic()
        self.stream.flush()


def run_batches(url: str, batches: Sequence[Batch], concurrency: int, timeout: float, stream: IO[str]) -> list[bytes]:
    """Every batch's answer, in input order; at most ``concurrency`` requests in flight; progress on
    ``stream``. The first failure stops the batches not yet sent; every failure is raised, in the file's order."""
    progress = Progress(sum(len(b.lines) for b in batches), len(batches), stream)
    answers: dict[int, bytes] = {}
    failures: dict[int, BaseException] = {}
    waiting = iter(enumerate(batches))
    with requests.Session() as session, ThreadPoolExecutor(max_workers=concurrency) as pool:
        session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=concurrency))
        pending: dict = {}

        def send_more() -> None:
            """Up to ``concurrency`` batches in flight; none sent once one has failed."""
            while len(pending) < concurrency and not failures:
                index, batch = next(waiting, (None, None))
                if batch is None:
                    return
                pending[pool.submit(post_batch, session, url, batch, timeout)] = index

        send_more()
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    index = pending.pop(future)
                    if future.exception() is None:
                        answers[index] = future.result()
                    else:
                        failures[index] = future.exception()  # what is in flight finishes; nothing more goes
                send_more()
                progress.update(sum(len(batches[i].lines) for i in answers), len(answers), final=not pending)
        finally:  # Ctrl-C: what is in flight finishes, nothing more is sent
            for future in pending:
                future.cancel()
    refused = [str(failures[i]) for i in sorted(failures) if isinstance(failures[i], JobFailed)]
    if refused:
        raise JobFailed(f"\n{PROG}: ".join(refused))
    if failures:
        raise failures[min(failures)]
    return [answers[i] for i in range(len(batches))]


def execution_parameters(url: str) -> tuple[int, float]:
    """(MaxConcurrentTransforms, MaxPayloadInMB) as the container answers them."""
    response = requests.get(f"{url}/execution-parameters", timeout=10)
    try:
        parameters = response.json() if response.status_code == 200 else {}
        concurrency, max_mb = int(parameters["MaxConcurrentTransforms"]), float(parameters["MaxPayloadInMB"])
        if concurrency < 1 or max_mb <= 0:
            raise ValueError("not positive")
    except (ValueError, TypeError, KeyError):
        raise JobFailed(
            f"GET {url}/execution-parameters answered {response.status_code} "
            f"{response.text[:200]!r}: pass --concurrency and --max-payload-mb"
        ) from None
    return concurrency, max_mb


def write_atomically(path: Path, parts: Iterable[bytes]) -> None:
    """Write to a temporary file beside ``path``, then rename: ``path`` is whole or absent."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as out:
            out.writelines(parts)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.caller batch-local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", type=Path, help="the JSON Lines file: one request envelope per line")
    parser.add_argument("output", type=Path, help="where the answers go, one line per input line, in order")
    parser.add_argument(
        "--endpoint-url",
        default="http://localhost:8080",
        metavar="URL",
        type=lambda url: url.rstrip("/"),
        help="the local stack (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive(int),
        metavar="N",
        help="requests in flight (default: the container's MaxConcurrentTransforms)",
    )
    parser.add_argument(
        "--max-payload-mb",
        type=positive(float),
        metavar="M",
        help="largest request body in MiB, fractions allowed (default: the container's MaxPayloadInMB)",
    )
    parser.add_argument(
        "--timeout",
        type=positive(float),
        default=600.0,
        metavar="SECONDS",
        help="how long one batch may take to answer (default: 600, SageMaker's default)",
    )
    return parser.parse_args(argv)


def job(args: argparse.Namespace) -> str:
    """Run the job; the summary line. Raises JobFailed."""
    if not args.input.is_file():
        raise JobFailed(f"{args.input}: no such file")
    if not args.output.parent.is_dir():
        raise JobFailed(f"{args.output.parent}: no such folder for the output")
    concurrency, max_mb = args.concurrency, args.max_payload_mb
    if concurrency is None or max_mb is None:
        asked = execution_parameters(args.endpoint_url)
        concurrency, max_mb = concurrency or asked[0], max_mb or asked[1]
    batches = split_batches(read_lines(args.input.read_bytes()), int(max_mb * MIB))
    lines = sum(len(b.lines) for b in batches)
    began = time.monotonic()
    answers = run_batches(args.endpoint_url, batches, concurrency, args.timeout, sys.stderr)
    write_atomically(args.output, answers)
    seconds = time.monotonic() - began
    return (
        f"{lines} lines, {len(batches)} batches, {seconds:.1f} s, {lines / max(seconds, 1e-9):.1f} lines/s "
        f"(concurrency {concurrency}, max payload {max_mb:g} MiB) -> {args.output}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(f"{PROG}: {job(args)}", flush=True)
    except JobFailed as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    except requests.ConnectionError as error:
        why = "connection refused" if "refused" in str(error) else type(error).__name__
        print(
            f"{PROG}: no stack answers on {args.endpoint_url} ({why}): start it with `make run`, "
            "or pass --endpoint-url",
            file=sys.stderr,
        )
        return 1
    except requests.RequestException as error:
        print(f"{PROG}: {args.endpoint_url}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0
