"""An offline evaluator of CloudWatch Logs JSON metric filters: which log lines a filter selects, and
what metric values and dimensions it would publish for them, without AWS.

It mirrors CloudWatch Logs' "filter pattern syntax for JSON log events" and its metric filter rules
for a subset: a pattern ``{ EXPR }`` whose conditions (``$.a.b = "str*"``, ``$.n >= 500``,
``$.f = *``, ``IS NULL``, ``NOT EXISTS``, ``IS TRUE``, ``IS FALSE``) combine with ``&&`` (binding
tighter) and ``||``, grouped by parentheses; ``publish`` applies ``metricTransformations`` (a literal
or ``$.field`` value, ``$.field`` dimensions, ``defaultValue``, ``unit``). Anything else -- term
patterns, ``[...]`` space-delimited patterns, ``%regex%``, a transformation CloudWatch would refuse --
raises FilterPatternError naming the position or the offending part, rather than being guessed at.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_NAME = r"[A-Za-z0-9_@-]+"
_SELECTOR = re.compile(rf"\$\.{_NAME}(?:\.{_NAME}|\[\d+\])*")
_STEP = re.compile(rf"\.({_NAME})|\[(\d+)\]")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_TOKEN = re.compile(r"(?P<punct>&&|\|\||[{}()])|(?P<op>!=|<=|>=|=|<|>)|(?P<word>[A-Za-z]+)")
_VALUE = re.compile(r'"(?P<str>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s)&|}"][^\s)&|}]*)')
_OPS = ("=", "!=", "<", "<=", ">", ">=")
_COMPARE = dict(zip(_OPS, (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge), strict=True))
_MISSING = object()
MAX_DIMENSIONS = 3  # CloudWatch's limit per metric transformation


class FilterPatternError(ValueError):
    """A filter pattern or metric transformation that is malformed or outside the supported subset."""


@dataclass(frozen=True)
class _Token:
    kind: str  # punct, op, word, sel, str (quoted), bare (unquoted value), end
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    """Tokens of a pattern; the token after an operator is read as a value (quoted or unquoted)."""
    tokens: list[_Token] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return [*tokens, _Token("end", "end of pattern", pos)]
        after_op = bool(tokens) and tokens[-1].kind == "op"
        m = (_VALUE if after_op else _SELECTOR).match(text, pos)
        if m and after_op:
            kind = "str" if m.group("str") is not None else "bare"
            tokens.append(_Token(kind, m.group(kind), pos))
        elif m:
            tokens.append(_Token("sel", m.group(), pos))
        elif m := _TOKEN.match(text, pos):
            tokens.append(_Token(m.lastgroup or "", m.group(), pos))
        else:
            raise FilterPatternError(f"position {pos}: unexpected {text[pos : pos + 12]!r}")
        pos = m.end()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _glob(raw: str) -> re.Pattern[str]:
    """``*`` matches any run of characters over the whole value; ``\\x`` is a literal ``x``."""
    parts = re.findall(r"\\(.)|(\*)|(.)", raw, re.DOTALL)
    return re.compile("".join(".*" if star else re.escape(escaped or char) for escaped, star, char in parts), re.DOTALL)


@functools.cache
def _steps(selector: str) -> tuple[str | int, ...]:
    return tuple(key if key else int(index) for key, index in _STEP.findall(selector[1:]))


def _resolve(obj: Any, steps: tuple[str | int, ...]) -> Any:
    for step in steps:
        if isinstance(step, int):
            if not isinstance(obj, list) or step >= len(obj):
                return _MISSING
        elif not isinstance(obj, Mapping) or step not in obj:
            return _MISSING
        obj = obj[step]
    return obj


@dataclass(frozen=True)
class _Condition:
    selector: str
    check: Callable[[Any], bool] = field(repr=False)  # on the field's value, when the field exists
    if_missing: bool = False  # True only for NOT EXISTS

    def test(self, obj: Any) -> bool:
        value = _resolve(obj, _steps(self.selector))
        return self.if_missing if value is _MISSING else self.check(value)


@dataclass(frozen=True)
class _Join:
    parts: tuple[Any, ...]  # conditions and joins
    combine: Callable[[Any], bool]  # all for &&, any for ||

    def test(self, obj: Any) -> bool:
        return self.combine(part.test(obj) for part in self.parts)


def _string_check(op: str, raw: str) -> Callable[[Any], bool]:
    """A string comparison applies to JSON strings; a number matches only the pattern ``*``."""
    rx, star = _glob(raw), raw == "*"

    def hit(v: Any) -> bool:
        return (star and _is_number(v)) or (isinstance(v, str) and rx.fullmatch(v) is not None)

    return hit if op == "=" else lambda v: (isinstance(v, str) or (star and _is_number(v))) and not hit(v)


class _Parser:
    def __init__(self, text: str):
        self.tokens, self.i = _tokenize(text), 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self, kind: str, *texts: str, what: str) -> _Token:
        tok = self.peek()
        if tok.kind != kind or (texts and tok.text not in texts):
            raise FilterPatternError(f"position {tok.pos}: expected {what}, found {tok.text!r}")
        self.i += 1
        return tok

    def accept(self, text: str) -> bool:
        if self.peek().kind == "punct" and self.peek().text == text:
            self.i += 1
            return True
        return False

    def pattern(self) -> Any:
        self.take("punct", "{", what="'{'")
        root = self.expr()
        self.take("punct", "}", what="'&&', '||' or '}'")
        self.take("end", what="end of pattern")
        return root

    def expr(self, ands: bool = False) -> Any:
        """``||`` of ``&&`` of atoms: ``&&`` binds tighter."""
        sep, combine, sub = ("&&", all, self.atom) if ands else ("||", any, lambda: self.expr(ands=True))
        parts = [sub()]
        while self.accept(sep):
            parts.append(sub())
        return parts[0] if len(parts) == 1 else _Join(tuple(parts), combine)

    def atom(self) -> Any:
        if self.accept("("):
            inner = self.expr()
            self.take("punct", ")", what="')'")
            return inner
        selector = self.take("sel", what="a selector '$.field' or '('").text
        if self.peek().kind == "word":
            word = self.take("word", "IS", "NOT", what="an operator, IS or NOT").text
            if word == "NOT":
                self.take("word", "EXISTS", what="EXISTS")
                return _Condition(selector, lambda v: False, if_missing=True)
            keyword = self.take("word", "NULL", "TRUE", "FALSE", what="NULL, TRUE or FALSE").text
            want = {"NULL": None, "TRUE": True, "FALSE": False}[keyword]
            return _Condition(selector, lambda v: v is want)
        op = self.take("op", what="an operator (= != < <= > >=), IS or NOT").text
        value = self.peek()
        if value.kind not in ("str", "bare"):
            raise FilterPatternError(f"position {value.pos}: expected a value after {op!r}, found {value.text!r}")
        self.i += 1
        if value.kind == "bare" and value.text == "*":
            if op != "=":
                raise FilterPatternError(f"position {value.pos}: only '= *' is supported (use NOT EXISTS or IS NULL)")
            # The field exists and is not null. CloudWatch has IS NULL for null; this project's patterns
            # never rely on `= *` against a null.
            return _Condition(selector, lambda v: v is not None)
        if value.kind == "bare" and _NUMBER.fullmatch(value.text):
            number, compare = float(value.text), _COMPARE[op]
            return _Condition(selector, lambda v: _is_number(v) and compare(v, number))
        if value.kind == "bare" and len(value.text) > 1 and value.text[0] == value.text[-1] == "%":
            raise FilterPatternError(f"position {value.pos}: regular expressions %...% are not supported")
        if value.kind == "bare" and value.text in ("true", "false", "null"):
            raise FilterPatternError(f"position {value.pos}: use IS {value.text.upper()}, not {op} {value.text}")
        if op not in ("=", "!="):
            raise FilterPatternError(f"position {value.pos}: {op!r} needs a number, found {value.text!r}")
        return _Condition(selector, _string_check(op, value.text))


def _selectors(node: Any) -> frozenset[str]:
    if isinstance(node, _Condition):
        return frozenset({node.selector})
    return frozenset().union(*(_selectors(part) for part in node.parts))


def _load(event: str | Mapping) -> Mapping | None:
    """The event as a JSON object, or None when it is not one (not JSON, or an array, a string...)."""
    if isinstance(event, str):
        try:
            event = json.loads(event)
        except ValueError:
            return None
    return event if isinstance(event, Mapping) else None


@dataclass(frozen=True)
class Pattern:
    """A parsed JSON filter pattern; ``selectors`` are the fields its conditions name."""

    text: str
    selectors: frozenset[str] = field(init=False, repr=False, compare=False)
    _root: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.text.lstrip().startswith("{"):
            raise FilterPatternError("only JSON patterns { ... } are supported")
        root = _Parser(self.text).pattern()
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "selectors", _selectors(root))

    def matches(self, event: str | Mapping) -> bool:
        """Whether the pattern selects the event: one log line (JSON text) or an already-parsed object."""
        obj = _load(event)
        return obj is not None and self._root.test(obj)


def parse(pattern: str) -> Pattern:
    """Parse a CloudWatch Logs JSON filter pattern; FilterPatternError when outside the subset."""
    return Pattern(pattern)


@dataclass(frozen=True)
class Published:
    """One metric value a filter publishes for one line."""

    metric: str  # metricName
    namespace: str  # metricNamespace
    value: float
    dimensions: dict[str, str]  # dimension name -> the JSON field's value as a string
    unit: str | None


def _field_selector(pattern: Pattern, text: Any, role: str) -> str:
    if not isinstance(text, str) or not _SELECTOR.fullmatch(text.strip()):
        raise FilterPatternError(f"{role} {text!r} must be a field selector '$.field'")
    if text.strip() not in pattern.selectors:
        raise FilterPatternError(f"{role} {text!r} names a field the filter pattern does not match")
    return text.strip()


def _transform(pattern: Pattern, t: Mapping, obj: Mapping | None, matched: bool) -> Published | None:
    dimensions = dict(t.get("dimensions") or {})
    if t.get("defaultValue") is not None and dimensions:
        raise FilterPatternError(f"{t['metricName']}: CloudWatch forbids defaultValue together with dimensions")
    if len(dimensions) > MAX_DIMENSIONS:
        raise FilterPatternError(f"{t['metricName']}: at most {MAX_DIMENSIONS} dimensions")
    raw_value = str(t["metricValue"]).strip()
    literal = _NUMBER.fullmatch(raw_value) is not None
    value_steps = () if literal else _steps(_field_selector(pattern, raw_value, "metricValue"))
    dim_steps = {name: _steps(_field_selector(pattern, sel, f"dimension {name}")) for name, sel in dimensions.items()}
    name, namespace, unit = t["metricName"], t["metricNamespace"], t.get("unit")
    if not matched or obj is None:
        default = t.get("defaultValue")
        return None if default is None else Published(name, namespace, float(default), {}, unit)
    found = float(raw_value) if literal else _resolve(obj, value_steps)
    if not _is_number(found):
        return None  # the value field is missing or not a JSON number
    values = {}
    for dimension, steps in dim_steps.items():
        field_value = _resolve(obj, steps)
        if not (isinstance(field_value, str) or _is_number(field_value)):
            return None  # a dimension field missing, null, a boolean, an object or an array
        values[dimension] = str(field_value)
    return Published(name, namespace, float(found), values, unit)


def publish(metric_filter: Mapping, event: str | Mapping) -> list[Published]:
    """What a metric filter (``logs.put_metric_filter``'s keyword arguments) publishes for one line: one
    value per transformation that yields one. Every transformation is checked, matched or not."""
    pattern = parse(metric_filter["filterPattern"])
    obj = _load(event)
    matched = obj is not None and pattern._root.test(obj)
    results = [_transform(pattern, t, obj, matched) for t in metric_filter["metricTransformations"]]
    return [r for r in results if r is not None]
