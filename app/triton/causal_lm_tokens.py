"""How a row of the running batch chooses its next token from the step's logits, as ``generate``
chooses it (greedy or multinomial sampling), with Hugging Face's own logits processors in
``generate``'s order: the repetition penalty, (OpenAI's presence and frequency penalties,) the end ids
held back until ``min_new_tokens``, then, when sampling, temperature, top-k, top-p, min-p and typical-p.

Each request has its own ``Chooser``: its grammar's constraint (``causal_lm_grammar``), its
processors, the ids it has seen (the prompt and what it generated, which the penalties read) and, when sampling, its own ``torch.Generator``
seeded by its ``seed``, so that its draws do not depend on the requests it is batched with: a
seeded request draws what ``torch.manual_seed(seed)`` then ``generate(do_sample=True)`` draws.

A greedy row without a penalty or a minimum (what a caller gets by default) needs no processor: a step whose rows
are all such is chosen in numpy, the largest logit (the first, where several are largest, as
torch's ``argmax``) and its log-softmax. torch and transformers are imported at the first row that
draws or is penalised, so a model asked only for greedy tokens never loads them (about 2.5 s of CPU
in its process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.core.causal_lm_contract import LOGIT_BIAS, NO_SEED
from app.triton.onnx_model import imported_torch


def processors(settings: Mapping[str, Any], prompt_length: int = 0, ends: Sequence[int] = ()):
    """The processors ``generate`` builds for these settings (``_get_logits_processor``): the same
    classes, in the same order, left out where ``generate`` leaves them out; OpenAI's presence and
    frequency penalties after the repetition penalty (``OpenAIPenalties``)."""
    from transformers import (
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
        TypicalLogitsWarper,
    )

    found = LogitsProcessorList()
    if settings["repetition_penalty"] != 1.0:
        found.append(RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]))
    if settings["presence_penalty"] != 0.0 or settings["frequency_penalty"] != 0.0:
        found.append(OpenAIPenalties(prompt_length, settings["presence_penalty"], settings["frequency_penalty"]))
    if settings["min_new_tokens"] > 0 and ends:
        found.append(MinNewTokensLengthLogitsProcessor(prompt_length, int(settings["min_new_tokens"]), list(ends)))
    if settings["do_sample"]:
        if settings["temperature"] != 1.0:
            found.append(TemperatureLogitsWarper(settings["temperature"]))
        if settings["top_k"] != 0:
            found.append(TopKLogitsWarper(top_k=settings["top_k"]))
        if settings["top_p"] < 1.0:
            found.append(TopPLogitsWarper(top_p=settings["top_p"]))
        if settings["min_p"] > 0.0:
            found.append(MinPLogitsWarper(min_p=settings["min_p"]))
        if settings["typical_p"] < 1.0:
            found.append(TypicalLogitsWarper(mass=settings["typical_p"]))
    return found


class OpenAIPenalties:
    """OpenAI's presence and frequency penalties: each token's logit less ``frequency`` times its count
    among the tokens generated so far (the prompt's not counted, as vLLM counts), and less
    ``presence`` once where it is among them."""

    def __init__(self, prompt_length: int, presence: float, frequency: float) -> None:
        self.prompt_length, self.presence, self.frequency = prompt_length, presence, frequency

    def __call__(self, input_ids, scores):
        torch = imported_torch()
        made = input_ids[:, self.prompt_length :]
        counts = torch.zeros_like(scores).scatter_add_(1, made, torch.ones_like(made, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def plain(settings: Mapping[str, Any]) -> bool:
    """Greedy without a penalty or a minimum: the row's token is its largest logit, no processor between."""
    return (
        not settings["do_sample"]
        and settings["repetition_penalty"] == 1.0
        and settings["presence_penalty"] == 0.0
        and settings["frequency_penalty"] == 0.0
        and settings["min_new_tokens"] == 0
    )


class Chooser:
    """One request's choice of tokens, step after step."""

    def __init__(
        self, prompt: np.ndarray, settings: Mapping[str, Any], constraint: Any = None, ends: Sequence[int] = ()
    ) -> None:
        self.constraint = constraint  # the row's grammar (causal_lm_grammar.Constraint), or None
        self.top = int(settings.get("top_logprobs", 0))  # alternatives sent with each token
        self.alternatives = EMPTY  # the last step's: ids and log-probabilities, likeliest first
        pairs = settings.get(LOGIT_BIAS, ())  # (ids, values): added to the row's logits first, as OpenAI's
        self.bias = (
            (np.array([t for t, _ in pairs], np.int64), np.array([v for _, v in pairs], np.float32)) if pairs else None
        )
        self.plain = plain(settings)
        self.sampling = bool(settings["do_sample"])
        self.length = len(prompt)
        self.processors = self.generator = self.seen = None
        if self.plain:
            return
        torch = imported_torch()
        self.processors = processors(settings, len(prompt), ends)
        if self.sampling:
            self.generator = torch.Generator()
            if settings["seed"] == NO_SEED:
                self.generator.seed()  # a seed of its own, from the system's randomness
            else:
                self.generator.manual_seed(int(settings["seed"]))
        # The ids seen so far, kept in one buffer as long as the request can get (for the penalty).
        self.seen = torch.zeros(1, len(prompt) + int(settings["max_new_tokens"]), dtype=torch.int64)
        self.seen[0, : len(prompt)] = torch.from_numpy(np.asarray(prompt, np.int64))

    def scores(self, logits):
        """The row's ``[1, vocabulary]`` logits (a torch tensor) after its processors."""
        return self.processors(self.seen[:, : self.length], logits) if self.processors else logits

    def pick(self, scores) -> int:
        """The token of the processed scores: their largest, or a draw from their softmax."""
        if self.sampling:
            torch = imported_torch()
            probs = torch.nn.functional.softmax(scores, dim=-1)
            return int(torch.multinomial(probs, num_samples=1, generator=self.generator)[0, 0])
        return int(scores[0].argmax())

    def chose(self, token: int) -> None:
        if self.constraint is not None:
            self.constraint.chose(token)
        if self.seen is not None:
            self.seen[0, self.length] = token
        self.length += 1


def choose(choosers: Sequence[Chooser], logits: np.ndarray) -> tuple[list[int], list[float]]:
    """Each row's token from the step's ``[rows, vocabulary]`` logits, and its log-probability under
    the distribution it was chosen from (log-softmax of the processed scores); a row that asks for
    alternatives (``top_logprobs``) gets that distribution's likeliest in ``alternatives``. A row's
    logit biases are added first, then a row with a grammar chooses among the tokens it allows (the
    others' logits made minus infinity), both in place."""
    for row, chooser in enumerate(choosers):
        if chooser.bias is not None:
            logits[row, chooser.bias[0]] += chooser.bias[1]
        if chooser.constraint is not None:
            chooser.constraint.mask(logits[row])
    if all(chooser.plain for chooser in choosers):
        tokens, logprobs = greedy(logits[: len(choosers)])
        distributions = logits
    else:
        torch = imported_torch()
        scores = torch.from_numpy(logits)
        processed = torch.cat([c.scores(scores[i : i + 1]) for i, c in enumerate(choosers)])
        tokens = [c.pick(processed[i : i + 1]) for i, c in enumerate(choosers)]
        chosen = torch.tensor(tokens, dtype=torch.int64)
        logprobs = torch.log_softmax(processed, dim=-1).gather(1, chosen[:, None])[:, 0].tolist()
        distributions = processed.numpy()
    for row, (chooser, token) in enumerate(zip(choosers, tokens)):
        chooser.alternatives = likeliest(distributions[row], chooser.top) if chooser.top else EMPTY
        chooser.chose(token)
    return tokens, logprobs


EMPTY = (np.zeros(0, np.int64), np.zeros(0, np.float32))


def likeliest(scores: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` likeliest tokens of a row's scores and their log-softmax, likeliest first."""
    shifted = scores.astype(np.float64) - scores.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    count = min(count, len(scores))
    top = np.argpartition(-logprobs, count - 1)[:count]
    top = top[np.argsort(-logprobs[top], kind="stable")]
    return top.astype(np.int64), logprobs[top].astype(np.float32)


def greedy(logits: np.ndarray) -> tuple[list[int], list[float]]:
    """Each row's largest logit and its log-softmax, in the logits' own precision."""
    tokens = logits.argmax(axis=-1)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    chosen = np.take_along_axis(shifted, tokens[:, None], axis=-1)[:, 0]
    logprobs = chosen - np.log(np.exp(shifted).sum(axis=-1))
    return [int(token) for token in tokens], [float(value) for value in logprobs]
