"""The stack's side of the chat benchmark: requests through the public port, whole or streamed, and
the long generations a short request is sent beside.

Every body is the JSON envelope (``{"modelname", "payload": {"text", "max_new_tokens"}}``, greedy:
the folder's default; the constrained row's with ``json_schema``), but the tool-calling row's: OpenAI's
chat body with ``tools`` and ``tool_choice: "required"``. A whole answer's tokens are its ``result.generated_tokens``. A streamed one
(``"stream": true``) is read as it comes (``http.client``'s ``read1``, the chunks NGINX passes on),
its server-sent events joined by ``scripts.events.sse_events``; each token's event is
timed on arrival: the time to the first token (from the request's start) and the time between
consecutive tokens (inter-token latency; two events in one chunk are 0 apart, as the caller sees
them)."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from scripts.bench.chat.plan import MODEL, TOOL
from scripts.bench.text.run import JSON_HEADERS
from scripts.events import event_text, sse_events

READ_BYTES = 65536
CANCELLED_METRIC = f'router_generation_cancelled_total{{model="{MODEL}"}}'


def body(text: str, max_new_tokens: int, stream: bool, schema: dict | None = None) -> bytes:
    payload = {"text": text, "max_new_tokens": max_new_tokens, **({"stream": True} if stream else {})}
    if schema is not None:
        payload["json_schema"] = schema
    return json.dumps({"modelname": MODEL, "payload": payload}).encode()


@dataclass(frozen=True)
class Streamed:
    """One streamed answer: its text, its tokens' ids and arrivals (seconds from the request's start)."""

    text: str
    ids: tuple[int, ...]
    arrivals: tuple[float, ...]

    @property
    def ttft_s(self) -> float | None:
        return self.arrivals[0] if self.arrivals else None

    @property
    def gaps_s(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.arrivals)]


def timed_events(parts: Iterator[bytes], began: float) -> Streamed:
    """A stream's text, its tokens and their arrival times (seconds after ``began``); an error event raises."""
    text, ids, arrivals = "", [], []
    for event in sse_events(parts):
        if isinstance(event, dict) and "token" in event:
            arrivals.append(time.perf_counter() - began)
            ids.append(int(event["token"]["id"]))
        text += event_text(event)
    return Streamed(text, tuple(ids), tuple(arrivals))


class Caller:
    """Calls through the public port on one keep-alive connection per thread, each call the next
    prompt. Whole answers (``stream`` False) record their tokens; streamed ones their ``Streamed``.
    ``records`` only grows (an append is atomic): a step reads what it added. A peer server's caller
    changes ``path``, the bodies and how an answer is read (``scripts.bench.chat.llama_cpp``)."""

    path = "/invocations"

    def __init__(
        self,
        port: int,
        texts: Sequence[str],
        max_new_tokens: int,
        stream: bool,
        timeout_s: float,
        schema: dict | None = None,
    ) -> None:
        self.port, self.stream, self.timeout_s, self.schema = port, stream, timeout_s, schema
        self.bodies = self.make_bodies(texts, max_new_tokens)
        self.turn = itertools.count()
        self.local = threading.local()
        self.records: list = []

    def make_bodies(self, texts: Sequence, max_new_tokens: int) -> list[bytes]:
        return [body(text, max_new_tokens, self.stream, self.schema) for text in texts]

    def whole(self, answer: http.client.HTTPResponse) -> dict:
        """A whole answer's ``result`` (``generated_tokens`` counted)."""
        return json.loads(answer.read())["result"]

    def streamed(self, parts: Iterator[bytes], began: float) -> Streamed:
        return timed_events(parts, began)

    def __call__(self) -> None:
        self.records.append(self.send(self.bodies[next(self.turn) % len(self.bodies)]))

    def connection(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        return conn

    def close(self) -> None:
        """This thread's connection closed (a stream in flight is cancelled by the router)."""
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.close()
            self.local.conn = None

    def response(self, payload: bytes) -> tuple[http.client.HTTPResponse, float]:
        conn, began = self.connection(), time.perf_counter()
        try:
            conn.request("POST", self.path, body=payload, headers=JSON_HEADERS)
            answer = conn.getresponse()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if not 200 <= answer.status < 300:
            detail = answer.read()[:200].decode(errors="replace")
            self.close()
            raise RuntimeError(f"HTTP {answer.status}: {detail}")
        return answer, began

    def send(self, payload: bytes, stop: threading.Event | None = None) -> Streamed | dict:
        """One call: a whole answer's ``result``, or a stream's ``Streamed`` (``stop`` set: the stream
        is cut at its next event, the connection closed)."""
        answer, began = self.response(payload)
        try:
            if not self.stream:
                return self.whole(answer)
            return self.streamed(self.parts(answer, stop), began)
        except (OSError, http.client.HTTPException, ValueError, RuntimeError):
            self.close()
            raise

    def parts(self, answer: http.client.HTTPResponse, stop: threading.Event | None) -> Iterator[bytes]:
        while part := answer.read1(READ_BYTES):
            if stop is not None and stop.is_set():
                self.close()
                return
            yield part


class ToolCaller(Caller):
    """Chat bodies through the public port with ``TOOL`` that must call it (``tool_choice``
    ``"required"``) or may (``"auto"``), whole; a record's tokens are its ``usage.completion_tokens``,
    and it says how many calls came back."""

    def __init__(self, *args, choice: str = "required", **kwargs) -> None:
        self.choice = choice
        super().__init__(*args, **kwargs)

    def make_bodies(self, texts: Sequence, max_new_tokens: int) -> list[bytes]:
        return [
            json.dumps(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": max_new_tokens,
                    "tools": [TOOL],
                    "tool_choice": self.choice,
                }
            ).encode()
            for text in texts
        ]

    def whole(self, answer: http.client.HTTPResponse) -> dict:
        found = json.loads(answer.read())
        message = found["choices"][0]["message"]
        calls = len(message.get("tool_calls") or ())
        return {"generated_tokens": found["usage"]["completion_tokens"], "tool_calls": calls}


class LongGenerations:
    """``count`` threads, each sending long streamed generations one after another until ``stop``:
    the load a short request is sent beside. ``started`` waits until each has its first token (all
    ``count`` run in Triton's batch); ``stop`` cuts every stream (their generations are cancelled)."""

    def __init__(self, caller: Caller, count: int) -> None:
        self.caller, self.count = caller, count
        self.halt = threading.Event()
        self.first = threading.Semaphore(0)
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _run(self) -> None:
        announced = False
        while not self.halt.is_set():
            payload = self.caller.bodies[next(self.caller.turn) % len(self.caller.bodies)]
            try:
                answer, _ = self.caller.response(payload)
                for _ in sse_events(self.caller.parts(answer, self.halt)):
                    if not announced:
                        announced = True
                        self.first.release()
            except Exception as error:  # noqa: BLE001 - reported with the row; the load goes on
                self.errors.append(f"{type(error).__name__}: {error}"[:300])
                self.caller.close()
                time.sleep(0.05)
        self.caller.close()

    def start(self, timeout_s: float) -> LongGenerations:
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + timeout_s
        for _ in range(self.count):
            if not self.first.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self.stop()
                raise RuntimeError(f"the long generations had no first token in {timeout_s:.0f} s: {self.errors[:1]}")
        return self

    def stop(self) -> None:
        self.halt.set()
        for thread in self.threads:
            thread.join()


def read_cancelled(page: str) -> float:
    """The router's cancelled generations of the model, from its /metrics page (0 where absent)."""
    return sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith(CANCELLED_METRIC))
