"""Reading and renaming Triton's ``config.pbtxt`` (protobuf text format) without its schema.

The multi-model loader must read a user's config (its ``name``, whether it is an ensemble, which
models its steps use) and load it under a name of its own, changing nothing else: fields newer
than any schema we carry must survive, and so must the user's layout and comments. So the text is
parsed into a tree that keeps where each value lies, and a rename replaces those values only.

Renamed: the top-level ``name``, each ``ensemble_scheduling { step { model_name } }``, and the
``string_value`` of a ``parameters`` entry whose ``key`` is one of ``MODEL_PARAMETERS`` (the
python-backend pipeline steps name the network they serve there). Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from app.core.pipeline import SOURCE_PARAMETER

MODEL_PARAMETERS = frozenset({SOURCE_PARAMETER})

_TOKEN = re.compile(
    r"""(?P<space>\s+|\#[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      | (?P<punct>[{}<>\[\]:,;])
      | (?P<word>[^\s{}<>\[\]:,;"'\#]+)""",
    re.VERBOSE,
)
_CLOSE = {"{": "}", "<": ">"}


class PbtxtError(ValueError):
    """Text that is not protobuf text format (the message gives the offset)."""


@dataclass(frozen=True)
class Value:
    """A scalar as written: ``text`` (a string's is unquoted) and where it lies in the file."""

    text: str
    start: int
    end: int


@dataclass
class Message:
    fields: list[tuple[str, Value | Message]] = field(default_factory=list)

    def all(self, name: str) -> Iterator[Value | Message]:
        return (value for key, value in self.fields if key == name)

    def messages(self, name: str) -> Iterator[Message]:
        return (value for value in self.all(name) if isinstance(value, Message))

    def value(self, name: str) -> Value | None:
        return next((value for value in self.all(name) if isinstance(value, Value)), None)

    def string(self, name: str) -> str | None:
        found = self.value(name)
        return found.text if found is not None else None


def _unquote(token: str) -> str:
    body = token[1:-1]
    if "\\" not in body:
        return body
    try:
        return body.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        return body


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str, int, int]] = []
        position = 0
        while position < len(text):
            found = _TOKEN.match(text, position)
            if found is None:
                raise PbtxtError(f"unexpected {text[position]!r} at offset {position}")
            if found.lastgroup != "space":
                self.tokens.append((found.lastgroup, found.group(), found.start(), found.end()))
            position = found.end()
        self.at = 0

    def peek(self) -> tuple[str, str, int, int] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, str, int, int]:
        token = self.peek()
        if token is None:
            raise PbtxtError("the text ends inside a message")
        self.at += 1
        return token

    def is_punct(self, *marks: str) -> bool:
        token = self.peek()
        return token is not None and token[0] == "punct" and token[1] in marks

    def message(self, close: str | None) -> Message:
        found = Message()
        while True:
            token = self.peek()
            if token is None:
                if close is not None:
                    raise PbtxtError(f"a message is not closed with {close!r}")
                return found
            if token[0] == "punct" and token[1] == close:
                self.at += 1
                return found
            if token[0] == "punct" and token[1] in ",;":
                self.at += 1
                continue
            kind, name, start, _ = self.take()
            if kind != "word":
                raise PbtxtError(f"expected a field name at offset {start}, found {name!r}")
            colon = self.is_punct(":")
            if colon:
                self.at += 1
            for value in self.values(colon):
                found.fields.append((name, value))

    def values(self, colon: bool) -> Iterable[Value | Message]:
        if self.is_punct("{", "<"):
            return [self.message(_CLOSE[self.take()[1]])]
        if self.is_punct("["):  # a list: of values after ':', of messages with or without it
            self.at += 1
            items: list[Value | Message] = []
            while not self.is_punct("]"):
                if self.is_punct(","):
                    self.at += 1
                    continue
                items.extend(self.values(True))
            self.at += 1
            return items
        if not colon:
            _kind, text, start, _ = self.take()
            raise PbtxtError(f"expected ':' or a message at offset {start}, found {text!r}")
        return [self.scalar()]

    def scalar(self) -> Value:
        kind, text, start, end = self.take()
        if kind == "word":
            return Value(text, start, end)
        if kind != "string":
            raise PbtxtError(f"expected a value at offset {start}, found {text!r}")
        return Value(_unquote(text), start, end)


def parse(text: str) -> Message:
    """The tree of a config.pbtxt; ``PbtxtError`` where it is not protobuf text format."""
    return _Parser(text).message(None)


def step_models(config: Message) -> list[str]:
    """The models an ensemble's steps use, in order (none for a model that is not an ensemble)."""
    return [
        name
        for scheduling in config.messages("ensemble_scheduling")
        for step in scheduling.messages("step")
        if (name := step.string("model_name")) is not None
    ]


def is_ensemble(config: Message) -> bool:
    return config.string("platform") == "ensemble"


def _model_values(config: Message) -> Iterator[Value]:
    """Every value that names a model: the config's own name, its steps', its model parameters'."""
    own = config.value("name")
    if own is not None:
        yield own
    for scheduling in config.messages("ensemble_scheduling"):
        for step in scheduling.messages("step"):
            yield from (v for v in step.all("model_name") if isinstance(v, Value))
    for entry in config.messages("parameters"):
        if entry.string("key") in MODEL_PARAMETERS:
            for value in entry.messages("value"):
                yield from (v for v in value.all("string_value") if isinstance(v, Value))


def rename(text: str, names: Mapping[str, str]) -> str:
    """``text`` with every model name found in ``names`` replaced by its new name; the rest unchanged."""
    edits = sorted(
        ((v.start, v.end, names[v.text]) for v in _model_values(parse(text)) if v.text in names), reverse=True
    )
    for start, end, new in edits:
        text = text[:start] + json.dumps(new) + text[end:]
    return text
