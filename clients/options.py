"""A request option of a model family: its type (int, float, bool or str), its range or its choices,
and its default; parsed from a JSON payload or from the custom-attributes header alike.

A family declares its options in ``ModelClient.OPTIONS``; the model's ``[postprocess]`` gives their
defaults and ``max_<name>`` bounds (``ModelClient._bounded``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.core.errors import InvalidInput


@dataclass(frozen=True)
class Option:
    """A request option: its type (int, float, bool or str), its inclusive range (numbers) or its
    choices (str), and its default (None: the option is off unless a request gives it)."""

    name: str
    kind: type  # int, float, bool or str
    minimum: float = 0
    maximum: float = 0
    default: Any = None
    choices: tuple[str, ...] = ()

    @property
    def numeric(self) -> bool:
        return self.kind in (int, float)

    def _check_range(self, value: float, where: str) -> int | float:
        if not (self.minimum <= value <= self.maximum):
            raise InvalidInput(f"{where} must be between {self.minimum:g} and {self.maximum:g}, got {value!r}")
        return value

    def parse(self, value: Any, where: str) -> Any:
        """A JSON value: ints for int options, ints or floats for float options, in range; true or
        false for bool options; one of the choices for str options."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise InvalidInput(f"{where} must be true or false, got {value!r}")
            return value
        if self.kind is str:
            if value not in self.choices:
                raise InvalidInput(f"{where} must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInput(f"{where} must be {'an integer' if self.kind is int else 'a number'}")
        if self.kind is int:
            if isinstance(value, float):
                if not value.is_integer():
                    raise InvalidInput(f"{where} must be an integer, got {value!r}")
                value = int(value)
            return self._check_range(value, where)
        if not math.isfinite(value):
            raise InvalidInput(f"{where} must be a finite number")
        return self._check_range(float(value), where)

    def parse_text(self, text: str, where: str) -> Any:
        """A value from a header: the same checks, after converting the string."""
        text = text.strip()
        if self.kind is bool:
            if text.lower() not in ("true", "false"):
                raise InvalidInput(f"{where} must be true or false, got {text!r}")
            return text.lower() == "true"
        if self.kind is str:
            return self.parse(text, where)
        try:
            value: int | float = self.kind(text)
        except ValueError:
            raise InvalidInput(
                f"{where} must be {'an integer' if self.kind is int else 'a number'}, got {text!r}"
            ) from None
        return self.parse(value, where)
