"""How a row of the running batch chooses its next token from the step's logits, as ``generate``
chooses it (greedy or multinomial sampling), with Hugging Face's own logits processors in
``generate``'s order: the repetition penalty, then, when sampling, temperature, top-k and top-p.

Each request has its own ``Chooser``: its processors, the ids it has seen (the prompt and what it
generated, which the repetition penalty reads) and, when sampling, its own ``torch.Generator``
seeded by its ``seed``, so that its draws do not depend on the requests it is batched with: a
seeded request draws what ``torch.manual_seed(seed)`` then ``generate(do_sample=True)`` draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from app.core.causal_lm_contract import NO_SEED


def processors(settings: Mapping[str, Any]) -> LogitsProcessorList:
    """The processors ``generate`` builds for these settings (``_get_logits_processor``): the same
    classes, in the same order, left out where ``generate`` leaves them out."""
    found = LogitsProcessorList()
    if settings["repetition_penalty"] != 1.0:
        found.append(RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]))
    if settings["do_sample"]:
        if settings["temperature"] != 1.0:
            found.append(TemperatureLogitsWarper(settings["temperature"]))
        if settings["top_k"] != 0:
            found.append(TopKLogitsWarper(top_k=settings["top_k"]))
        if settings["top_p"] < 1.0:
            found.append(TopPLogitsWarper(top_p=settings["top_p"]))
    return found


class Chooser:
    """One request's choice of tokens, step after step."""

    def __init__(self, prompt: np.ndarray, settings: Mapping[str, Any]) -> None:
        self.processors = processors(settings)
        self.sampling = bool(settings["do_sample"])
        self.generator = None
        if self.sampling:
            self.generator = torch.Generator()
            if settings["seed"] == NO_SEED:
                self.generator.seed()  # a seed of its own, from the system's randomness
            else:
                self.generator.manual_seed(int(settings["seed"]))
        # The ids seen so far, kept in one buffer as long as the request can get (for the penalty).
        self.seen = torch.zeros(1, len(prompt) + int(settings["max_new_tokens"]), dtype=torch.int64)
        self.seen[0, : len(prompt)] = torch.from_numpy(np.asarray(prompt, np.int64))
        self.length = len(prompt)

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The row's ``[1, vocabulary]`` logits after its processors."""
        return self.processors(self.seen[:, : self.length], logits) if self.processors else logits

    def pick(self, scores: torch.Tensor) -> int:
        """The token of the processed scores: their largest, or a draw from their softmax."""
        if self.sampling:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            return int(torch.multinomial(probs, num_samples=1, generator=self.generator)[0, 0])
        return int(scores[0].argmax())

    def chose(self, token: int) -> None:
        self.seen[0, self.length] = token
        self.length += 1


def choose(choosers: Sequence[Chooser], logits: np.ndarray) -> tuple[list[int], list[float]]:
    """Each row's token from the step's ``[rows, vocabulary]`` logits, and its log-probability under
    the distribution it was chosen from (log-softmax of the processed scores)."""
    scores = torch.from_numpy(logits)
    processed = torch.cat([c.scores(scores[i : i + 1]) for i, c in enumerate(choosers)]) if choosers else scores
    tokens = [c.pick(processed[i : i + 1]) for i, c in enumerate(choosers)]
    chosen = torch.tensor(tokens, dtype=torch.int64)
    logprobs = torch.log_softmax(processed, dim=-1).gather(1, chosen[:, None])[:, 0]
    for chooser, token in zip(choosers, tokens):
        chooser.chose(token)
    return tokens, logprobs.tolist()
