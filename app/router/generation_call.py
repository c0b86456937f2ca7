"""A parsed text_generation request, whatever its form (``app.router.generation_forms``: the
envelope and TGI's; ``app.router.openai_forms``: OpenAI's chat and completions), and the checks of a
body's keys the forms share. ``app.router.generation_answers`` answers it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import InvalidInput
from clients.options import Option
from clients.text_generation import TextGenerationClient
from clients.tool_calls import ToolFormat

ENVELOPE, TGI, CHAT, COMPLETION = "envelope", "tgi", "chat", "completion"


@dataclass(frozen=True)
class GenerationCall:
    """A parsed generation request: its client and form, its prompts (the text, for
    ``return_full_text``) and their checked asks, and how it is answered."""

    client: TextGenerationClient
    form: str
    asks: tuple[Any, ...]
    prompts: tuple[str, ...]
    single: bool = True
    stream: bool = False
    return_full_text: bool = False
    details: bool = False
    include_usage: bool = False
    logprobs: bool = False  # OpenAI's chat and completions: each token's log-probability in the answer
    tools: ToolFormat | None = None  # OpenAI's chat with tools: the markup its answers' calls are read from
    parallel_tool_calls: bool = True  # false: an answer's first call only
    echo: bool = False  # OpenAI's completions: the prompt's text before each choice's
    best: int = 0  # OpenAI's best_of: of each prompt's rows, the ``best`` of highest log-probability a token; 0: all
    version: str | None = None


def given_keys(mapping: Mapping[str, Any], keys: Sequence[str], where: str, form: str) -> dict[str, Any]:
    """The keys given a value (null: not given); any other key is refused, naming those taken."""
    given = {key: value for key, value in mapping.items() if value is not None}
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise InvalidInput(f"{where}{unknown[0]} is not taken by {form} (taken: {', '.join(keys)})")
    return given


def flag(value: Any, where: str) -> bool:
    return Option(where, bool).parse(value, where)
