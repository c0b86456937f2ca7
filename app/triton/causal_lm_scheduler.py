"""The ``text_generation`` family's continuous batching: one thread steps every running request
together over ``decoder.onnx`` (``app.core.causal_lm_contract``), and a request joins the batch at
the next step instead of waiting for the batch to finish.

A step of the loop:

1. newcomers are taken (the loop blocks only when nothing runs), as many as the cap on running rows
   leaves room for; their prompts run as one batch, left-padded (``prompt_inputs``), each distinct
   prompt once, and each chooses its first token from its prompt's step; a prompt that a running
   row's tokens begin with (a prompt's ``n`` choices, started one after another) runs its last token
   alone, over that row's keys and values of the tokens before it;
2. they join the running batch (``Batch.join``): the shorter of the two caches and masks is padded on
   the left with zeros to the other's length, so every row's last column is its latest token;
3. every running row runs one step together: its last token, its mask with one more column, its
   position (``mask.sum - 1``: its own count of tokens, whatever its padding), the cache;
4. each row chooses its token (``causal_lm_tokens``) and it is sent at once; a row ends at an
   end-of-sequence token of the folder's generation config (sent, as ``generate`` returns it), at
   ``max_new_tokens``, at its deadline (failed: ``Late``) or when its caller cancelled (dropped);
5. cache columns that are padding in every row left (those of a long prompt whose row ended) are
   cut, so the cache is as long as the longest running row, not as the longest the batch ever had.

A row's tokens are those of ``generate`` for its prompt alone: padding is masked (its attention
weight is 0), positions are the row's own, and token choice is per row (its own penalty history, its
own random generator). Beam search runs ``generate`` itself beside the loop (``causal_lm_beams``).

Measured on 2 shared vCPUs, one intra-op thread, 64 new tokens from 32-token prompts, greedy: a
Llama-shaped model of 4 layers, width 256 and 32,000 tokens made 241 tokens/s for one caller, 685
for 8 at once, 942 for 16 (17 ms a step of 16 rows: the graph's run 85% of it, token choice 12%);
a tiny one (2 layers, width 32, 256 tokens) 2,800 tokens/s alone, 12,700 for 8.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.core.causal_lm_contract import MAX_RUNNING_ROWS, NO_PROMPT_LOGPROBS, PROMPT_LOGPROBS, STOP_TOKEN_IDS
from app.triton.causal_lm_loop import Loop
from app.triton.causal_lm_requests import Closed, Late, Request
from app.triton.causal_lm_session import Graph, prompt_inputs
from app.triton.causal_lm_tokens import Chooser, choose

LOG = logging.getLogger(__name__)


@dataclass(eq=False)
class Row:
    """A running request: its token choice and the tokens it has made (sent)."""

    request: Request
    chooser: Chooser
    made: int = 0
    tokens: list[int] = field(default_factory=list)

    def ran(self) -> list[int]:
        """The tokens whose keys and values its cache holds: the prompt, and each token made but the
        last (which the next step runs)."""
        return [*self.request.ids.tolist(), *self.tokens[:-1]]

    def held(self) -> int:
        """How many tokens its cache holds (``ran``'s count)."""
        return len(self.request.ids) + max(0, self.made - 1)

    def begins(self, tokens: list[int]) -> bool:
        """Whether the tokens its cache holds begin with ``tokens`` (the cheap checks first: their count,
        the first token)."""
        if self.held() < len(tokens) or int(self.request.ids[0]) != tokens[0]:
            return False
        return self.ran()[: len(tokens)] == tokens


def scores_prompt(request: Request) -> bool:
    """Whether ``request`` asks for its prompt's log-probabilities."""
    return int(request.settings.get(PROMPT_LOGPROBS, NO_PROMPT_LOGPROBS)) >= 0


def left_padded(array: np.ndarray, total: int, axis: int) -> np.ndarray:
    """``array`` with zeros before its columns along ``axis``, to ``total`` columns."""
    missing = total - array.shape[axis]
    if missing == 0:
        return array
    shape = list(array.shape)
    shape[axis] = missing
    return np.concatenate([np.zeros(shape, array.dtype), array], axis=axis)


@dataclass(eq=False)
class Batch:
    """The running rows and their arrays: ``mask`` ``[rows, columns]`` and each cache array
    ``[rows, kv_heads, columns, head_dim]`` over the tokens already run, ``last`` ``[rows, 1]`` the token
    each row runs next."""

    cache: list[np.ndarray]
    rows: list[Row] = field(default_factory=list)
    mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    last: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int64))

    def join(self, rows: Sequence[Row], mask: np.ndarray, cache: Sequence[np.ndarray], last: Sequence[int]) -> None:
        total = max(self.mask.shape[1], mask.shape[1])
        joined = [
            np.concatenate([left_padded(mine, total, 2), left_padded(theirs, total, 2)])
            for mine, theirs in zip(self.cache, cache)
        ]
        self.mask, self.cache = np.concatenate([left_padded(self.mask, total, 1), left_padded(mask, total, 1)]), joined
        self.last = np.concatenate([self.last, np.asarray(last, np.int64).reshape(-1, 1)])
        self.rows = [*self.rows, *rows]
        self._cut()

    def feed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A step's ids, mask (one more column: the token run now) and positions."""
        mask = np.concatenate([self.mask, np.ones((len(self.rows), 1), np.int64)], axis=1)
        return self.last, mask, mask.sum(-1, keepdims=True) - 1

    def stepped(self, mask: np.ndarray, cache: list[np.ndarray], tokens: Sequence[int]) -> None:
        self.mask, self.cache = mask, cache
        self.last = np.asarray(tokens, np.int64).reshape(-1, 1)

    def keep(self, kept: Sequence[int]) -> None:
        """Only the rows ``kept`` (indices, in order) go on; then the columns no row needs are cut."""
        if len(kept) < len(self.rows):
            self.rows = [self.rows[i] for i in kept]
            self.mask, self.last = self.mask[kept], self.last[kept]
            self.cache = [array[kept] for array in self.cache]
        self._cut()

    def _cut(self) -> None:
        """The leading columns that are padding in every row go (all of them, with no row left)."""
        used = self.mask.any(axis=0)
        start = int(used.argmax()) if used.any() else self.mask.shape[1]
        if start:
            self.mask = np.ascontiguousarray(self.mask[:, start:])
            self.cache = [np.ascontiguousarray(array[:, :, start:]) for array in self.cache]


def prompt_logprobs(request: Request, logits: np.ndarray) -> None:
    """Tells ``request``'s sink its prompt's log-probabilities from its prompt step's logits
    ``[tokens, vocabulary]``: each token after the first under ``log_softmax`` of the position before
    it, and the ``prompt_logprobs`` likeliest tokens a position (ids, then values, likeliest first)."""
    scores = logits[:-1].astype(np.float32)
    scores = scores - scores.max(-1, keepdims=True)
    scores -= np.log(np.exp(scores).sum(-1, keepdims=True))
    chosen = scores[np.arange(len(scores)), request.ids[1:]]
    k = min(int(request.settings[PROMPT_LOGPROBS]), scores.shape[-1])
    top = np.argpartition(-scores, k - 1, axis=-1)[:, :k] if k else np.zeros((len(scores), 0), np.int64)
    values = np.take_along_axis(scores, top, -1)
    order = np.argsort(-values, axis=-1, kind="stable")
    top, values = np.take_along_axis(top, order, -1), np.take_along_axis(values, order, -1)
    request.sink.prompt(chosen, (top, values))


class Scheduler(Loop):
    """Continuous batching over one graph (``causal_lm_loop.Loop``: the queue, the checks, beam search
    beside, the endings): ``graph`` is ``decoder.onnx`` in ONNX Runtime, the steps' and beam search's."""

    def __init__(
        self, folder: Path, graph: Graph, max_rows: int = MAX_RUNNING_ROWS, clock=time.monotonic, **loop
    ) -> None:
        super().__init__(folder, graph, max_rows, clock, **loop)
        self.graph = graph
        self.batch = Batch(graph.empty(0))

    def turn(self, block: bool = True) -> bool:
        """One turn of the loop: newcomers taken and joined, one step of the running rows. Waits for a
        request while nothing runs (``block``); False once closing. The loop's thread calls it; tests
        call it themselves, to know at which step each request joins."""
        newcomers = self._take(block)
        if newcomers is None:
            return False
        try:
            if newcomers:
                self._join(newcomers)
            if self.batch.rows:
                self._step()
        except Exception as error:  # the running rows fail; the loop lives on
            LOG.exception("generation step failed")
            self._end_all(error, "failed")
        return True

    def _take(self, block: bool) -> list[Request] | None:
        """The newcomers of this step (waits while nothing runs, if ``block``); None when closing."""
        taken = self._newcomers(len(self.batch.rows), block)
        now = self.clock()
        for request in taken or ():
            self._started(request, now)
        return taken

    def _join(self, requests: list[Request]) -> None:
        """The newcomers' prompts run as one batch; a prompt whose log-probabilities are asked runs
        alone (its every position's logits: ``[tokens, vocabulary]``, not a batch's padded length); a
        prompt that a running row's tokens begin with (OpenAI's ``n`` choices, ``best_of``'s draws
        arriving a step apart) runs only its last token, over that row's keys and values before it."""
        scored = [scores_prompt(request) for request in requests]
        plain, reused = [], []
        for request, asked in zip(requests, scored):
            if asked:
                continue
            past = self._past_of(request.ids)
            if past is None:
                plain.append(request)
            else:
                reused.append((request, past))
        for request, past in reused:
            self._prefill([request], past)
        for group in ([plain] if plain else []) + [[request] for request, asked in zip(requests, scored) if asked]:
            self._prefill(group)

    def _past_of(self, prompt: np.ndarray) -> list[np.ndarray] | None:
        """The keys and values of ``prompt``'s tokens but its last, copied from a running row whose
        tokens begin with them (None: no row's do, or a prompt of one token)."""
        wanted = prompt[:-1].tolist()
        if not wanted:
            return None
        total = self.batch.mask.shape[1]
        for index, row in enumerate(self.batch.rows):
            if row.begins(wanted):
                start = total - row.held()  # the row's columns are the last ones (left padding before)
                return [array[index : index + 1, :, start : start + len(wanted)].copy() for array in self.batch.cache]
        return None

    def _prefill(self, requests: list[Request], past: list[np.ndarray] | None = None) -> None:
        """The prompts of ``requests`` run as one batch, each distinct prompt once: the rows of one
        prompt (OpenAI's ``n`` choices, ``best_of``'s draws) share its logits and its cache. With
        ``past`` (one request: its prompt's keys and values but the last token's), the last token alone."""
        prompts = [tuple(request.ids.tolist()) for request in requests]
        distinct = list(dict.fromkeys(prompts))
        if past is None:
            ids, mask, positions = prompt_inputs([np.asarray(prompt, np.int64) for prompt in distinct])
            past = self.graph.empty(len(distinct))
        else:
            length = len(requests[0].ids)
            ids, mask = requests[0].ids[-1:].reshape(1, 1), np.ones((1, length), np.int64)
            positions = np.array([[length - 1]], np.int64)
            self.counts["shared"] += 1
        every = scores_prompt(requests[0])
        try:
            logits, cache = self.graph.run(ids, mask, positions, past, every=every)
            if len(distinct) < len(requests):
                rows_of = [distinct.index(prompt) for prompt in prompts]
                logits, mask, cache = logits[rows_of], mask[rows_of], [array[rows_of] for array in cache]
                self.counts["shared"] += len(requests) - len(distinct)
            if every:  # one request: its prompt's log-probabilities go before its first token
                prompt_logprobs(requests[0], logits[0])
                logits = logits[:, -1]
            rows = [
                Row(request, Chooser(request.ids, request.settings, request.constraint, sorted(self.ends)))
                for request in requests
            ]
            tokens, logprobs = choose([row.chooser for row in rows], logits)
        except Exception as error:  # these requests fail; the running ones go on
            LOG.exception("prompt step failed")
            for request in requests:
                self._end(request, error, "failed")
            return
        kept = self._send(rows, tokens, logprobs)
        try:
            self.batch.join(
                [rows[i] for i in kept], mask[kept], [array[kept] for array in cache], [tokens[i] for i in kept]
            )
        except Exception as error:  # those that were joining fail here; the running ones in turn()
            for i in kept:
                self._end(rows[i].request, error, "failed")
            raise

    def _step(self) -> None:
        now = self.clock()
        kept = []
        for i, row in enumerate(self.batch.rows):
            if row.request.deadline <= now:
                self._end(row.request, Late(row.made), "late")
            elif not self._cancelled(row.request):
                kept.append(i)
        self.batch.keep(kept)
        if not self.batch.rows:
            return
        ids, mask, positions = self.batch.feed()
        logits, cache = self.graph.run(ids, mask, positions, self.batch.cache)
        self.counts["steps"] += 1
        tokens, logprobs = choose([row.chooser for row in self.batch.rows], logits)
        self.batch.stepped(mask, cache, tokens)
        self.batch.keep(self._send(self.batch.rows, tokens, logprobs))

    def _send(self, rows: Sequence[Row], tokens: Sequence[int], logprobs: Sequence[float]) -> list[int]:
        """Sends each row's token; the indices of the rows that go on."""
        kept = []
        for i, (row, token, logprob) in enumerate(zip(rows, tokens, logprobs)):
            row.made += 1
            row.tokens.append(int(token))
            settings = row.request.settings
            ended = token in self.ends and not settings["ignore_eos"] or token in settings.get(STOP_TOKEN_IDS, ())
            last = ended or row.made >= int(row.request.settings["max_new_tokens"])
            try:
                row.request.sink.token(token, logprob, last, row.chooser.alternatives)
            except Exception:  # a stream that cannot take its token ends; the others go on
                LOG.exception("sending a token failed")
                self.counts["failed"] += 1
                continue
            if last:
                self.counts["finished"] += 1
            else:
                kept.append(i)
        return kept

    def _end_all(self, error: Exception, count: str) -> None:
        """Every running row, and on closing every waiting request, ends with ``error``."""
        for row in self.batch.rows:
            self._end(row.request, error, count)
        self.batch = Batch(self.graph.empty(0))
        if isinstance(error, Closed):
            self._end_waiting(error, count)
