"""What the ``text_generation`` family's two engines share (``causal_lm_scheduler.Scheduler`` over
ONNX Runtime, ``causal_lm_openvino.OpenVinoScheduler`` over OpenVINO GenAI): the folder's
end-of-sequence ids, vocabulary and positions, the check of each request, the queue it waits in until
the next step takes it, beam search beside the loop, the loop's thread and how a request ends other
than with its last token. Each engine writes its own ``turn`` (newcomers in, one step, tokens out)
and ``_end_all`` (what is running fails)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from app.core.causal_lm_contract import BEAMS_NEUTRAL, MAX_RUNNING_ROWS, MAX_WAITING, context_length
from app.core.generation_contract import end_ids, read_generation_config
from app.core.grammar import GrammarError
from app.triton.causal_lm_beams import BeamSearch
from app.triton.causal_lm_grammar import Grammars
from app.triton.causal_lm_requests import Busy, Cancelled, Closed, Counts, Late, Refused, Request, check
from app.triton.causal_lm_session import Graph

LOG = logging.getLogger(__name__)


class Loop:
    """A request queue stepped by one thread; ``submit`` from any thread, ``close`` to stop.

    ``folder``: the Hugging Face folder (config.json, generation_config.json: the end-of-sequence
    tokens, the positions, the vocabulary, beam search's defaults); ``graph``: its ``decoder.onnx``
    (beam search runs ``generate`` over it), or what opens it at the first beam search; ``max_rows``:
    how many requests step together at most (beams are not counted: they run apart); ``max_waiting``:
    how many may wait for a row beyond them (one more is refused, ``Busy``). ``waited`` is told, for each request, the seconds from
    its arrival to the start of the step that makes its first token (Triton's metrics)."""

    thread_name = "causal-lm-steps"

    def __init__(
        self,
        folder: Path,
        graph: Graph | Callable[[], Graph],
        max_rows: int = MAX_RUNNING_ROWS,
        clock=time.monotonic,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.ends = frozenset(end_ids(read_generation_config(folder), config))
        self.vocabulary = getattr(graph, "vocabulary", None) or int(config["vocab_size"])
        self.context = context_length(config)
        self.max_rows = max(1, max_rows)
        self.max_waiting = max(0, max_waiting)
        self.clock = clock
        self.beams = BeamSearch(folder, graph, clock)
        self.grammars = Grammars(folder, self.vocabulary, self.ends)
        self.waiting: deque[Request] = deque()
        self.condition = threading.Condition()
        self.closing = False
        self.thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        # "shared": rows whose prompt another row ran for them (of their step, or running: OpenAI's n, best_of)
        self.counts = Counts(("finished", "late", "cancelled", "failed", "busy", "steps", "shared"))
        self.waited: Callable[[float], None] | None = None

    def start(self):
        self.thread.start()
        self.beams.start()
        return self

    def check(self, request: Request) -> None:
        """Raises ``Refused`` naming the field of the request's values that cannot be generated from."""
        check(request.ids, request.settings, self.vocabulary, self.context)

    def submit(self, request: Request) -> None:
        """Checks the request (``Refused``, raised here) and queues it: it joins at the next step, or is
        refused (``Busy``, raised here) where ``max_waiting`` requests wait already."""
        self.check(request)
        if int(request.settings["num_beams"]) > 1:
            if request.grammar is not None:
                raise Refused("grammar: beam search (num_beams over 1) takes no grammar")
            for name, neutral in BEAMS_NEUTRAL.items():
                if request.settings.get(name, neutral) != neutral:
                    raise Refused(f"{name}: beam search (num_beams over 1) takes only {neutral}")
            self.beams.submit(request)
            return
        request = self.constrained(request)
        with self.condition:
            if self.closing:
                raise Closed("the model is unloading")
            if len(self.waiting) >= self.max_waiting:
                self.counts["busy"] += 1
                raise Busy(len(self.waiting))
            self.waiting.append(replace(request, arrived=self.clock()))
            self.condition.notify()

    def constrained(self, request: Request) -> Request:
        """The request with its grammar's constraint (``Refused`` naming what llguidance refused)."""
        if request.grammar is None:
            return request
        try:
            return replace(request, constraint=self.grammars.constraint(request.grammar))
        except GrammarError as error:
            raise Refused(f"grammar: {error}") from None

    def _newcomers(self, running: int, block: bool) -> list[Request] | None:
        """The requests that join now, in order, as many as ``max_rows`` leaves room for beside
        ``running`` rows: those past their deadline end (late) and those whose caller left are dropped,
        wherever they are in the queue. Waits while nothing runs or waits (``block``); None once closing."""
        with self.condition:
            if block:
                self.condition.wait_for(lambda: self.closing or self.waiting or running)
            if self.closing:
                return None
            now = self.clock()
            late = [request for request in self.waiting if request.deadline <= now]
            if late:
                self.waiting = deque(request for request in self.waiting if request.deadline > now)
            free = max(0, self.max_rows - running)
            taken = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        for request in late:
            self._end(request, Late(0), "late")
        return [request for request in taken if not self._cancelled(request)]

    def _started(self, request: Request, at: float) -> None:
        """``request``'s first step began ``at``: its wait told to ``waited``."""
        if self.waited is not None:
            try:
                self.waited(max(0.0, at - request.arrived))
            except Exception:
                LOG.exception("telling a request's wait failed")

    def close(self) -> None:
        """Stops the loop after its step; the requests still running or waiting fail (``Closed``)."""
        with self.condition:
            self.closing = True
            self.condition.notify()
        if self.thread.is_alive():
            self.thread.join()
        else:  # never started (the tests' own turns)
            self._end_all(Closed("the model is unloading"), "failed")
        self.beams.close()

    def turn(self, block: bool = True) -> bool:
        raise NotImplementedError

    def _end_all(self, error: Exception, count: str) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while self.turn():
            pass
        self._end_all(Closed("the model is unloading"), "failed")

    def _cancelled(self, request: Request, ending: bool = True) -> bool:
        """Whether the request's caller went away (a sink that cannot say is taken as gone); with
        ``ending``, the request is ended as cancelled."""
        try:
            cancelled = request.sink.cancelled()
        except Exception:
            LOG.exception("asking for cancellation failed")
            cancelled = True
        if cancelled and ending:
            self._end(request, Cancelled("cancelled by its caller"), "cancelled")
        return cancelled

    def _end(self, request: Request, error: Exception, count: str) -> None:
        self.counts[count] += 1
        try:
            request.sink.failed(error)
        except Exception:  # nothing more can be told to that caller
            LOG.exception("ending a stream failed")

    def _end_waiting(self, error: Exception, count: str) -> None:
        """Closing: the requests still waiting end with ``error``."""
        with self.condition:
            waiting, self.waiting = list(self.waiting), deque()
        for request in waiting:
            self._end(request, error, count)
