"""Text2text generation family: translation, summarisation and instruction-tuned encoder-decoder
models (T5, flan-t5, BART, Marian), answered as Hugging Face's ``model.generate`` answers.

Payload: ``{"text": str | [str], "max_new_tokens", "min_new_tokens", "num_beams", "length_penalty",
"early_stopping", "no_repeat_ngram_size", "repetition_penalty", "truncation"}``; each setting's
default is the folder's ``generation_config.json``, then Hugging Face's (``app.core.generation_contract``).
One text answers ``{"generated_text": str}``, equal to ``tokenizer.decode(model.generate(text,
...)[0], skip_special_tokens=True)`` for that text alone; a list answers a list, in order.
Sampling (``"do_sample": true``) is refused: its answers would differ from call to call.

The router tokenizes, checks and decodes; the search runs inside Triton
(``app/triton/text2text_model.py``), where the texts of many callers are generated together. Each
text carries its settings and how long it may run (``timeout_ms``: what is left of the router's
deadline, at most ``TRITON_TIMEOUT_S``); a generation stopped there is answered 504, naming it.
The tokens generated are counted for the metrics (``router_generated_tokens``).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core import generation_contract, text_spec
from app.core.access import GENERATED_TOKENS
from app.core.errors import InvalidInput
from app.core.family import Counter, Family
from app.core.spec import SpecError
from app.core.text_spec import TextSpecError
from clients.options import Option
from clients.text import TRUNCATION, TextClient, clean_up_tokenization, cleans_up_spaces

TEXT_INPUTS = ("input_ids", "attention_mask")
# Left between the end of a text's generation and the router's own deadline: the answer's way back.
DEADLINE_MARGIN_S = 0.25
DO_SAMPLE = "do_sample"
GENERATION_PACKAGES = ("torch", "transformers")  # what the Triton model imports (requirements-generation.txt)

OPTIONS = (
    Option("max_new_tokens", int, 1, generation_contract.MAX_NEW_TOKENS),
    Option("min_new_tokens", int, 0, generation_contract.MAX_NEW_TOKENS),
    Option("num_beams", int, 1, generation_contract.MAX_BEAMS),
    Option("length_penalty", float, -generation_contract.MAX_PENALTY, generation_contract.MAX_PENALTY),
    Option("early_stopping", bool),
    Option("no_repeat_ngram_size", int, 0, generation_contract.MAX_NGRAM),
    Option("repetition_penalty", float, 0.01, generation_contract.MAX_PENALTY),
)


def require_generation_packages(spec, family: str) -> None:
    """A generation family's Triton model imports torch and transformers (requirements-generation.txt):
    without them here, where Triton's python backend runs, the model would fail to load there."""
    missing = [name for name in GENERATION_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise SpecError(
            f"{spec.folder}/model.toml: a {family} model runs its generation inside Triton with "
            f"{' and '.join(missing)}, missing from this environment: pip install -r requirements-generation.txt "
            "(the serving image: make image IMAGE_GENERATION=true)"
        )


class Text2TextClient(TextClient[None]):
    family = "text2text_generation"
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "description": "text2text_generation, for one text: what Hugging Face's generate gives for that text "
        "alone, decoded (tokenizer.decode(model.generate(text, ...)[0], skip_special_tokens=True)).",
        "required": ["generated_text"],
        "additionalProperties": False,
        "properties": {"generated_text": {"type": "string"}},
    }
    OPTIONS = (*OPTIONS, Option(DO_SAMPLE, bool, default=False), TRUNCATION)
    SETTING_INPUTS = frozenset({*generation_contract.SETTING_NAMES, generation_contract.TIMEOUT_MS})

    def configure(self) -> None:
        super().configure()
        require_generation_packages(self.spec, self.family)
        try:
            self.generation = generation_contract.read_generation_config(self.text.folder)
        except generation_contract.GenerationSpecError as error:
            raise SpecError(str(error)) from None
        config = json.loads((self.text.folder / "config.json").read_text(encoding="utf-8"))
        self.new_tokens_limit = generation_contract.new_tokens_limit(config)
        self.clean_up = cleans_up_spaces(self.text, self.tokenizer)
        self.setting_types = {t.name: t.numpy_dtype for t in self.spec.inputs}
        missing = [
            name
            for name in (*generation_contract.SETTING_NAMES, generation_contract.TIMEOUT_MS)
            if name not in self.setting_types
        ]
        if missing:
            raise SpecError(f"{self.spec.folder}/model.toml: a text2text model's inputs include {missing[0]}")
        self.calls = threading.local()  # per request (a thread): its deadline and the tokens generated

    def option_limits(self) -> Mapping[str, float]:
        limit = self.new_tokens_limit
        return {"max_new_tokens": limit, "min_new_tokens": limit}

    def option_defaults(self) -> Mapping[str, Any]:
        found = generation_contract.defaults(self.generation)
        # a folder's default past the served bound is served at the bound
        found["max_new_tokens"] = min(found["max_new_tokens"], self.new_tokens_limit)
        found["min_new_tokens"] = min(found["min_new_tokens"], found["max_new_tokens"])
        return found

    def parse_options(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        options = super().parse_options(payload)
        if options[DO_SAMPLE]:
            raise InvalidInput(
                f"payload.{DO_SAMPLE}: sampling is not served (its answers would differ from call to call); "
                "use greedy search (num_beams 1) or beam search (num_beams > 1)"
            )
        if options["min_new_tokens"] > options["max_new_tokens"]:
            raise InvalidInput(
                f"payload.min_new_tokens ({options['min_new_tokens']}) must not be more than max_new_tokens "
                f"({options['max_new_tokens']})"
            )
        return options

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], None]:
        arrays = self.arrays([self.encode(self.check_text(item, where), None, where, options["truncation"])])
        for name in generation_contract.SETTING_NAMES:
            arrays[name] = np.array([[options[name]]], dtype=self.setting_types[name])
        arrays[generation_contract.TIMEOUT_MS] = np.zeros((1, 1), dtype=np.int64)  # set just before the call (_infer)
        return arrays, None

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: None, options: Mapping[str, Any]) -> dict:
        ids = outputs[generation_contract.OUTPUT_IDS][0]
        ids = ids[ids != generation_contract.PAD]
        text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        return {"generated_text": clean_up_tokenization(text) if self.clean_up else text}

    def _stack(self, arrays: Sequence[Mapping[str, np.ndarray]], tensors=None) -> dict[str, np.ndarray]:
        """The texts padded as every text family pads them; the settings one row a text."""
        stacked = super()._stack([{name: a[name] for name in TEXT_INPUTS} for a in arrays])
        for name in arrays[0]:
            if name not in TEXT_INPUTS:
                stacked[name] = np.concatenate([a[name] for a in arrays])
        return stacked

    def run(self, works, timings: dict[str, float] | None = None, deadline: float | None = None):
        self.calls.deadline, self.calls.tokens = deadline, 0
        try:
            return super().run(works, timings, deadline)
        finally:
            if timings is not None:
                timings[GENERATED_TOKENS] = timings.get(GENERATED_TOKENS, 0) + self.calls.tokens

    def _infer(self, model, inputs, output_names, version):
        """Each text may run what is left of the request's deadline, at most Triton's timeout."""
        budget = self.settings.triton_timeout_s
        deadline = getattr(self.calls, "deadline", None)
        if deadline is not None:
            budget = min(budget, deadline - time.monotonic())
        inputs = dict(inputs)
        milliseconds = max(1, int((budget - DEADLINE_MARGIN_S) * 1000))
        inputs[generation_contract.TIMEOUT_MS] = np.full((len(inputs["input_ids"]), 1), milliseconds, dtype=np.int64)
        outputs, answered = super()._infer(model, inputs, output_names, version)
        found = outputs.get(generation_contract.OUTPUT_IDS)
        if found is not None:  # the decoder's start token is not generated
            self.calls.tokens = (
                getattr(self.calls, "tokens", 0) + int(np.count_nonzero(found != generation_contract.PAD)) - len(found)
            )
        return outputs, answered


def _encoder_decoder(config: Mapping[str, Any], folder: Path) -> None:
    if config.get("is_encoder_decoder") is not True:
        raise TextSpecError(
            f"{folder / 'config.json'}: the {Text2TextClient.family} family serves encoder-decoder models (T5, BART, "
            f"Marian: is_encoder_decoder true); this is a {config.get('model_type', 'model')!r} model"
        )


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], text_spec.TextModel]:
    """A text2text model.toml from its folder: the generation tensors (``app.core.generation_contract``)."""
    return text_spec.resolve(
        raw,
        folder,
        where,
        inputs=lambda *_: generation_contract.inputs(),
        outputs=lambda *_: generation_contract.outputs(),
        max_batch_size=generation_contract.MAX_BATCH_SIZE,
        check=_encoder_decoder,
    )


FAMILY = Family(
    name=Text2TextClient.family,
    client=Text2TextClient,
    complete=complete,
    export="scripts.model_prep.generation_export:ENCODER_DECODER",
    small="scripts.model_prep.small_models.seq2seq:generation_model_folder",
    loop=True,
    optional_inputs=(*generation_contract.SETTING_NAMES, generation_contract.TIMEOUT_MS),  # a v2 body: the tokens
    counters=(
        Counter(
            GENERATED_TOKENS,
            "router_generated_tokens",
            "Tokens generated by text2text models, by model (its rate: tokens per second).",
        ),
    ),
)
