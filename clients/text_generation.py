"""Text generation family: decoder-only causal language models (GPT-2, Llama, Qwen2/Qwen3, Mistral,
Phi-3 style), answered as Hugging Face's ``model.generate`` answers, whole or streamed token by token.

The router renders the prompt (a chat template for OpenAI's ``messages``: ``clients.chat_template``),
tokenizes, checks and decodes; the generation runs inside Triton (``app/triton/causal_lm_model.py``),
a decoupled model whose step scheduler lets a request join the running batch at the next step and
streams each token back as it is made (``app.core.causal_lm_contract``).

Payload (the envelope's; TGI's and OpenAI's forms are ``app.router.generation_forms``'s): ``{"text": str |
[str], "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
"num_beams", "seed", "stop", "return_full_text", "truncation", "stream", "json_schema"}``
(``json_schema``: every answer a JSON text valid against it, ``clients.grammars``); each setting's default is
the folder's ``generation_config.json``, then Hugging Face's. One text answers ``{"generated_text",
"finish_reason", "prompt_tokens", "generated_tokens"}``, its text equal to ``tokenizer.decode(
model.generate(**tokenizer(text), ...)[0, prompt:], skip_special_tokens=True)`` (greedy or beam
search; sampling with a seed is repeatable, not Hugging Face's draw); a list answers a list, in order,
its texts generated together. A prompt must leave the context (the model's positions) room for
``max_new_tokens``: too long a prompt is a 400 naming both numbers unless ``"truncation": true``,
which keeps its last tokens. Each generation may run what is left of the request's deadline (at most
``TRITON_TIMEOUT_S``), as text2text's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core import causal_lm_contract, generation_contract, text_spec
from app.core.causal_lm_contract import GRAMMAR, INPUT_IDS, NO_SEED, PROMPT_LOGPROBS, SETTINGS
from app.core.errors import InferenceTimeout, InvalidInput
from app.core.family import Family
from app.core.grammar import JSON_SCHEMA
from app.core.spec import SpecError
from app.core.text_spec import TextSpecError
from clients import sampling
from clients.base import WorkFailed, timed
from clients.chat_template import ChatTemplate
from clients.generation import COUNTERS, MEASURES, Generation, account, collect
from clients.grammars import GrammarCheck, schema_grammar
from clients.options import Option
from clients.sampling import SEED
from clients.text import SPACES_BEFORE, TRUNCATION, TextClient, clean_up_tokenization, cleans_up_spaces, load_tokenizer
from clients.text2text import require_generation_packages
from clients.text_stream import TextStream, byte_fallback_tokens, parse_stop
from clients.tool_calls import FORMAT_KEY, FORMATS, keeping_markup, tool_format

FAMILY_NAME = "text_generation"
DEADLINE_MARGIN_S = 0.25  # left between the end of a generation and the router's deadline: the way back
STREAM = Option("stream", bool, default=False)
RETURN_FULL_TEXT = Option("return_full_text", bool, default=False)


@dataclass(frozen=True)
class Ask:
    """One prompt to generate from, checked: its ids, every setting's value (``SETTINGS``), its stop
    sequences and whether the answer keeps the one it stops at (TGI's) or not (OpenAI's)."""

    ids: tuple[int, ...]
    settings: Mapping[str, Any]
    stops: tuple[str, ...] = ()
    include_stop: bool = True
    tool_markup: bool = False  # the text keeps the tool-call markup's special tokens (clients.tool_calls)
    grammar: bytes = b""  # the constraint every token keeps to (app.core.grammar), checked; none: no bytes


class TextGenerationClient(TextClient[None]):
    family = FAMILY_NAME
    OPTIONS = (*sampling.OPTIONS, RETURN_FULL_TEXT, TRUNCATION, STREAM)
    EXTRA_FIELDS = frozenset({"stop", JSON_SCHEMA, *sampling.TOKEN_LISTS})
    WHOLE_FIELDS = frozenset({JSON_SCHEMA, *sampling.TOKEN_LISTS})
    FIELD_SCHEMAS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        JSON_SCHEMA: {"type": "object"},
        sampling.LOGIT_BIAS: {"type": "object", "additionalProperties": {"type": "number"}},
        sampling.STOP_TOKEN_IDS: {"type": "array", "items": {"type": "integer"}},
    }
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "description": "text_generation, for one text: the generated text (the prompt's text first with "
        "return_full_text), why it ended (eos_token, length, stop_sequence) and the tokens counted.",
        "required": ["generated_text", "finish_reason", "prompt_tokens", "generated_tokens"],
        "additionalProperties": False,
        "properties": {
            "generated_text": {"type": "string"},
            "finish_reason": {"type": "string", "enum": ["eos_token", "length", "stop_sequence"]},
            "prompt_tokens": {"type": "integer"},
            "generated_tokens": {"type": "integer"},
        },
    }

    def configure(self) -> None:  # not TextClient's: the inputs are the prompt's ids and the settings
        spec = self.spec
        if spec.text is None:
            raise SpecError(f'{spec.folder}/model.toml: the {self.family} family needs [export] transformers = "..."')
        self.text = spec.text
        folder = spec.text.folder
        require_generation_packages(spec, self.family)
        self.tokenizer = load_tokenizer(spec.text)
        self.setting_types = {t.name: t.numpy_dtype for t in spec.inputs}
        needed = (
            INPUT_IDS,
            *causal_lm_contract.SETTING_NAMES,
            generation_contract.TIMEOUT_MS,
            GRAMMAR,
            *sampling.TENSORS,
        )
        missing = [name for name in needed if name not in self.setting_types]
        if missing:
            raise SpecError(f"{spec.folder}/model.toml: a {self.family} model's inputs include {missing[0]}")
        try:
            self.generation = generation_contract.read_generation_config(folder)
        except generation_contract.GenerationSpecError as error:
            raise SpecError(str(error)) from None
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        limits = [n for n in (causal_lm_contract.context_length(config), spec.text.sequence_length) if n]
        self.context = min(limits)
        self.end_ids = frozenset(generation_contract.end_ids(self.generation, config))
        added = self.tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(index for index, token in added.items() if token.special)
        self.clean_up = cleans_up_spaces(spec.text, self.tokenizer)
        self.chat = ChatTemplate.from_folder(folder)
        self.tool_format = tool_format(self.chat, spec.export.get(FORMAT_KEY), f"{spec.folder}/model.toml")
        self.special = {token.content: index for index, token in added.items() if token.special}
        self.keeping_markup = keeping_markup(self.decode, self.tool_format, self.special)
        self.engine = spec.export.get(causal_lm_contract.ENGINE_KEY, causal_lm_contract.ENGINES[0])
        self.vocabulary = int(config["vocab_size"])
        self.grammars = GrammarCheck(self.tokenizer.to_str(), int(config["vocab_size"]), self.end_ids, self.engine)
        self.sequence_length = self.context
        self.byte_tokens = byte_fallback_tokens(self.tokenizer)

    def option_limits(self) -> Mapping[str, float]:
        return {
            "max_new_tokens": max(1, min(causal_lm_contract.MAX_NEW_TOKENS, self.context - 1)),
            "top_k": self.tokenizer.get_vocab_size(),
        }

    def option_defaults(self) -> Mapping[str, Any]:
        found: dict[str, Any] = causal_lm_contract.defaults(self.generation)
        found["max_new_tokens"] = min(found["max_new_tokens"], self.option_limits()["max_new_tokens"])
        found["top_k"] = min(found["top_k"], self.tokenizer.get_vocab_size())
        found.pop(SEED)  # none unless asked: the model draws one
        return found

    def parse_options(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        options = super().parse_options(payload)
        options["stop"] = parse_stop(payload.get("stop"), "payload.stop")
        options["max_new_tokens_given"] = "max_new_tokens" in payload
        options.update(sampling.token_lists(payload, self.vocabulary, "payload."))
        given = payload.get(JSON_SCHEMA)
        schema = None if given is None else schema_grammar(given, f"payload.{JSON_SCHEMA}")
        options[JSON_SCHEMA] = self.grammars.encoded(schema, f"payload.{JSON_SCHEMA}")
        if options["num_beams"] > 1:
            if schema is not None:
                raise InvalidInput(f"payload.{JSON_SCHEMA}: beam search (num_beams > 1) follows no grammar")
            sampling.check_beams(options, "payload.")
        if options[STREAM.name] and options["num_beams"] > 1:
            raise InvalidInput("payload.stream: beam search (num_beams > 1) answers every token at the end")
        return options

    def plan(self, payload, version=None, *, label=None):
        work = super().plan(payload, version, label=label)
        if work.options[STREAM.name] and not work.single:
            raise InvalidInput("payload.stream: a list of texts is not streamed; send one text")
        return work

    # -- one prompt ----------------------------------------------------------------------------------

    def decode(self, ids: Sequence[int]) -> str:
        """What ``tokenizer.decode(ids, skip_special_tokens=True)`` answers."""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return clean_up_tokenization(text) if self.clean_up else text

    def token_text(self, token_id: int, before: int | None = None) -> str:
        """A token's text, decoded with its special tokens (OpenAI's ``logprobs.content[].token``): what
        it adds after the token ``before`` it (a SentencePiece token's leading space kept, which it
        loses decoded alone), else alone; a token that holds part of a character's bytes is U+FFFD."""
        alone = self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
        if before is None:
            return alone
        head = self.tokenizer.decode([int(before)], skip_special_tokens=False)
        pair = self.tokenizer.decode([int(before), int(token_id)], skip_special_tokens=False)
        return pair[len(head) :] if pair.startswith(head) and len(pair) > len(head) else alone

    def encode_text(self, text: Any, where: str) -> list[int]:
        """A text as ``tokenizer(text)`` encodes it (the tokenizer's special tokens, a BOS, included)."""
        return self.tokenizer.encode(self.check_text(text, where), add_special_tokens=True).ids

    def encode_chat(self, messages: Any, where: str = "messages", tools: list[Any] | None = None) -> list[int]:
        """OpenAI's messages (and tools, checked by the caller) through the folder's chat template,
        encoded as ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)`` encodes them."""
        if self.chat is None:
            raise InvalidInput(
                f"model {self.name!r} has no chat template (tokenizer_config.json chat_template, or "
                "chat_template.jinja): send it a text (inputs, or payload.text) instead of messages"
            )
        if tools and self.chat.takes_tools and self.tool_format is None:
            raise InvalidInput(
                f"tools: model {self.name!r}'s tool-call markup is not known from its chat template: its "
                f"model.toml names it ([export] {FORMAT_KEY} = one of {', '.join(FORMATS)})"
            )
        return self.tokenizer.encode(self.chat.render(messages, where, tools), add_special_tokens=False).ids

    def ask(
        self,
        ids: Sequence[int],
        options: Mapping[str, Any],
        where: str,
        *,
        new_tokens: str,
        given: bool,
        keep: int | None = None,
        stops: tuple[str, ...] = (),
        include_stop: bool = True,
        tool_markup: bool = False,
        grammar: bytes = b"",
    ) -> Ask:
        """A prompt's ids and settings checked against the context: ``keep`` tokens (its last) when the
        caller asks for truncation; ``new_tokens`` names max_new_tokens as the caller does, ``given``
        whether they gave it (a default is lowered to the context left, a number given is refused)."""
        ids = list(ids)
        new = int(options["max_new_tokens"])
        if keep is not None and len(ids) > keep:
            ids = ids[len(ids) - keep :]
        if len(ids) >= self.context:
            raise InvalidInput(
                f"{where} is {len(ids)} tokens, past the model's context of {self.context} tokens (a prompt "
                "leaves room for at least one new token); shorten it, or ask for truncation"
            )
        left = self.context - len(ids)
        if new > left:
            if given:
                raise InvalidInput(
                    f"{new_tokens} {new} is over the context left: the prompt's {len(ids)} tokens leave "
                    f"{left} of the model's {self.context}"
                )
            new = left
        settings = {s.name: options.get(s.name, s.default) for s in SETTINGS}
        settings |= {name: options.get(name, ()) for name in sampling.TOKEN_LISTS}
        settings["max_new_tokens"] = new
        sampling.check_engine(settings, self.engine)
        if int(settings["num_beams"]) > 1:  # the folder's default, where the form does not set it
            sampling.check_beams(settings)
        if settings[SEED] is None:
            settings[SEED] = NO_SEED
        return Ask(tuple(ids), settings, stops, include_stop, tool_markup, grammar)

    def truncation_keep(self, options: Mapping[str, Any]) -> int:
        """The tokens a prompt keeps under ``"truncation": true``: the context less max_new_tokens."""
        return max(1, self.context - int(options["max_new_tokens"]))

    def start(self, ask: Ask, deadline: float | None, version: str | None = None) -> Generation:
        """The generation of ``ask``, started in Triton now."""
        budget = self.settings.triton_timeout_s
        if deadline is not None:
            budget = min(budget, deadline - time.monotonic())
        if budget <= DEADLINE_MARGIN_S:
            raise InferenceTimeout(
                f"the request ran past its deadline of {self.settings.server_timeout_s:g} s before its generation began"
            )
        arrays = {INPUT_IDS: np.asarray(ask.ids, dtype=self.setting_types[INPUT_IDS])}
        arrays.update(sampling.tensors(ask.settings, self.setting_types))
        milliseconds = max(1, int((budget - DEADLINE_MARGIN_S) * 1000))
        arrays[generation_contract.TIMEOUT_MS] = np.array([milliseconds], dtype=np.int64)
        arrays[GRAMMAR] = np.frombuffer(ask.grammar, dtype=np.uint8)
        held = [written for written, _ in SPACES_BEFORE] if self.clean_up else []
        decode = self.keeping_markup if ask.tool_markup else self.decode
        text = TextStream(decode, ask.stops, ask.include_stop, held, self.byte_tokens)
        stream = self.triton.stream(self.spec.triton_name, arrays, self.output_names, budget, version)
        seed = None if ask.settings[SEED] == NO_SEED else int(ask.settings[SEED])
        return Generation(
            stream,
            text,
            prompt_tokens=len(ask.ids),
            max_new_tokens=int(ask.settings["max_new_tokens"]),
            end_ids=(frozenset() if ask.settings["ignore_eos"] else self.end_ids)
            | set(ask.settings[sampling.STOP_TOKEN_IDS]),
            special_ids=self.special_ids,
            seed=seed,
            prompt_ids=ask.ids if int(ask.settings[PROMPT_LOGPROBS]) >= 0 else (),
            last_prompt_id=ask.ids[-1],
        )

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], None]:
        raise NotImplementedError("a text_generation model is streamed: run() starts its generations")

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: None, options: Mapping[str, Any]) -> Any:
        raise NotImplementedError("a text_generation model is streamed: run() reads its generations")

    # -- the envelope's payloads ---------------------------------------------------------------------

    def ask_payload(self, item: Any, where: str, options: Mapping[str, Any]) -> Ask:
        keep = self.truncation_keep(options) if options[TRUNCATION.name] else None
        given = options.get("max_new_tokens_given", False)
        new_tokens = "payload.max_new_tokens"
        return self.ask(
            self.encode_text(item, where), options, where, new_tokens=new_tokens, given=given, keep=keep,
            stops=options["stop"], grammar=options[JSON_SCHEMA],
        )  # fmt: skip

    def result(self, generation: Generation, prompt: str, options: Mapping[str, Any]) -> dict[str, Any]:
        text = prompt + generation.text if options[RETURN_FULL_TEXT.name] else generation.text
        return {
            "generated_text": text,
            "finish_reason": generation.finish_reason,
            "prompt_tokens": generation.prompt_tokens,
            "generated_tokens": len(generation.tokens),
        }

    def run(self, works, timings: dict[str, float] | None = None, deadline: float | None = None):
        """Every text of every work generated together (each its own stream, all started before any is
        read), answered whole. A streamed payload is the router's (``app.router.generation_forms``)."""
        asks: list[list[Ask]] = []
        with timed(timings, "preprocess"):
            for index, work in enumerate(works):
                if work.options[STREAM.name]:
                    raise WorkFailed(index, InvalidInput("payload.stream is answered to one JSON envelope only"))
                try:
                    asks.append([self.ask_payload(item, where, work.options) for item, where in work.items])
                except InvalidInput as error:
                    raise WorkFailed(index, error) from None
        with timed(timings, "triton"):
            generations = collect(
                [[self.start(ask, deadline, work.version) for ask in each] for work, each in zip(works, asks)]
            )
        account(timings, [g for each in generations for g in each])
        answers = []
        for work, each in zip(works, generations):
            found = [self.result(g, item, work.options) for g, (item, _) in zip(each, work.items)]
            version = next((g.version for g in each if g.version), work.version or "")
            answers.append((found[0] if work.single else found, version))
        return answers


def _decoder_only(config: Mapping[str, Any], folder: Path) -> None:
    if config.get("is_encoder_decoder") is True:
        raise TextSpecError(
            f"{folder / 'config.json'}: the {FAMILY_NAME} family serves decoder-only models (GPT-2, Llama, Qwen, "
            f"Mistral, Phi-3); this {config.get('model_type', 'model')!r} model is an encoder-decoder: "
            'family = "text2text_generation" serves it'
        )


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], text_spec.TextModel]:
    """A text_generation model.toml from its folder: the generation tensors (``app.core.causal_lm_contract``).
    Its Triton model batches the requests itself: a ``max_batch_size`` other than 0 is refused."""
    if raw.get("max_batch_size", 0) != 0:
        raise TextSpecError(
            f"{where}: max_batch_size must be 0 for {FAMILY_NAME} (or left out): its Triton model batches the "
            "requests itself (each joins the running batch at the next step), so Triton batches none"
        )
    return text_spec.resolve(
        raw,
        folder,
        where,
        inputs=lambda *_: causal_lm_contract.inputs(),
        outputs=lambda *_: causal_lm_contract.outputs(),
        max_batch_size=0,
        check=_decoder_only,
    )


FAMILY = Family(
    name=FAMILY_NAME,
    client=TextGenerationClient,
    complete=complete,
    export="scripts.model_prep.causal_lm_export:CAUSAL_LM",
    small="scripts.model_prep.small_models.causal:causal_model_folder",
    loop=True,
    streams=True,
    counters=COUNTERS,
    measures=MEASURES,
)
