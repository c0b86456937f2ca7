"""Beam search for the ``text_generation`` scheduler: Hugging Face's own ``generate`` over the same
``decoder.onnx`` (``causal_lm_hf``), one request at a time on a thread of its own (``BeamSearch``).

Why ``generate`` and not a beam search written into the step loop: beam search's answer is defined
by ``generate`` (its candidates of twice the beams, length penalty, early stopping, end-of-sequence
bookkeeping), and the family's promise is ``generate``'s tokens; over the graph it gives them token
for token. Why its own thread: a search of 20 tokens is 21 runs of the graph; between two of them
the step loop runs one step of the batch (``causal_lm_session.Turns``), so streamed requests keep
moving while a search runs, each step slower by one beam step. Beam requests wait for one another.

transformers' ``generate`` is imported, and the graph wrapped for it, at the first beam-search
request (``BeamSearch.model``), not when the model loads: greedy search and sampling, in the step
loop, do without it, and a model that never searches saves its process about 3 s of CPU and 200 MB.
That first request waits for it, unless the folder's own default is beam search
(``generation_config.json``'s ``num_beams`` over 1): then the model's warm-up loads it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from app.triton.causal_lm_requests import Cancelled, Closed, Counts, Late, Request
from app.triton.causal_lm_session import Graph

LOG = logging.getLogger(__name__)
ENDINGS = {Late: "late", Cancelled: "cancelled", Closed: "closed"}


class BeamSearch:
    """Beam-search requests (``num_beams`` > 1), answered whole, in the order they came."""

    def __init__(self, folder: Path, graph: Graph | Callable[[], Graph], clock=time.monotonic) -> None:
        self.folder, self.graph = folder, graph  # or what opens it, at the first search
        self.clock = clock
        self._model = None  # causal_lm_hf.OnnxCausalLM, made at the first search
        self.closing = threading.Event()
        self.waiting: deque[Request] = deque()
        self.condition = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="beam-search", daemon=True)
        self.counts = Counts(("finished", "failed", *ENDINGS.values()))

    def start(self) -> None:
        self.thread.start()

    def submit(self, request: Request) -> None:
        with self.condition:
            if self.closing.is_set():
                raise Closed("the model is unloading")
            self.waiting.append(request)
            self.condition.notify()

    def close(self) -> None:
        with self.condition:
            self.closing.set()
            self.condition.notify()
        if self.thread.is_alive():
            self.thread.join()
        for request in self.waiting:
            request.sink.failed(Closed("the model is unloading"))

    def _loop(self) -> None:
        while True:
            with self.condition:
                self.condition.wait_for(lambda: self.waiting or self.closing.is_set())
                if self.closing.is_set():
                    return
                request = self.waiting.popleft()
            try:
                self._answer(request)
            except Exception as error:  # answered to that request; the thread lives on
                LOG.exception("beam search failed")
                self.counts["failed"] += 1
                request.sink.failed(error)

    def model(self):
        """The graph wrapped for ``generate``, made (and transformers imported) at the first search."""
        if self._model is None:
            began = time.monotonic()
            from app.triton.onnx_model import imported_torch

            imported_torch()  # on this instance's threads, before transformers imports it
            from app.triton.causal_lm_hf import OnnxCausalLM

            graph = self.graph if isinstance(self.graph, Graph) else self.graph()
            self._model = OnnxCausalLM(self.folder, graph)
            LOG.info("beam search: Hugging Face's generate loaded in %.1f s", time.monotonic() - began)
        return self._model

    def _answer(self, request: Request) -> None:
        from app.triton.causal_lm_hf import search

        try:
            tokens, scores = search(self.model(), request, self.closing, self.clock)
        except (Late, Cancelled, Closed) as why:
            self.counts[ENDINGS[type(why)]] += 1
            request.sink.failed(why)
            return
        self.counts["finished"] += 1
        request.sink.sequence(tokens, scores)
