"""Config keys: one record per key of ``tilesplat train``, declared beside the code that reads it.

A :class:`Key` holds a key's name, default, one-line doc and the values it takes (its type is
its default's; a choice list or a range). A strategy declares its thresholds in its module, a
training feature its switches in its own, the loop its schedule in the loop's; the trainer's
configuration (``train/config.py``) composes every declared key into one table, which
``tilesplat train --list-keys``, ``tilesplat check``, the TOML reader, the saved
``config.toml`` and ``docs/config.md`` all read.

This module imports nothing of tilesplat: the strategies, below the trainer, declare keys too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Value = bool | int | float | str


@dataclass(frozen=True)
class Key:
    """One config key.

    Attributes:
        name: the key, as written in TOML files and ``--set``.
        default: its value when none is given; its type is the key's type (an int is
            accepted where a float is expected).
        doc: one line on what it does.
        choices: the values a ``str`` key takes, or a function giving them (the names
            registered behind a seam, looked up when the key is checked).
        ge, gt, le, lt: the bounds of a number (>=, >, <=, <).
        finite: whether a float must be finite (``far_plane`` may be ``inf``).
    """

    name: str
    default: Value
    doc: str
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = True

    @property
    def type(self) -> type:
        """bool, int, float or str: the type of the default."""
        return type(self.default)

    def valid_choices(self) -> tuple[str, ...] | None:
        """The values a choice key takes (None: any value of its type in its range)."""
        return self.choices() if callable(self.choices) else self.choices

    def fits_type(self, value: object) -> bool:
        """Whether ``value`` has the key's type (bools are not ints; ints are floats)."""
        want = self.type
        if isinstance(value, bool):
            return want is bool
        if want is float:
            return isinstance(value, (int, float))
        return isinstance(value, want)

    def bounds(self) -> str:
        """The range as text (``>= 1``, ``in (0, 1)``, ``in 0..4``; empty when unbounded)."""
        low = (self.ge, "[") if self.ge is not None else (self.gt, "(")
        high = (self.le, "]") if self.le is not None else (self.lt, ")")
        if low[0] is not None and high[0] is not None:
            if self.type is int and low[1] == "[" and high[1] == "]":
                return f"in {_num(low[0])}..{_num(high[0])}"
            return f"in {low[1]}{_num(low[0])}, {_num(high[0])}{high[1]}"
        if low[0] is not None:
            return f"{'>=' if low[1] == '[' else '>'} {_num(low[0])}"
        if high[0] is not None:
            return f"{'<=' if high[1] == ']' else '<'} {_num(high[0])}"
        return ""

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not a value of this key (None when it is)."""
        if not self.fits_type(value):
            return f"{self.name} must be {self.type.__name__}, got {value!r}"
        choices = self.valid_choices()
        if choices is not None and value not in choices:
            return f"{self.name} must be one of {list(choices)}, got {value!r}"
        if self.type is float and self.finite and not math.isfinite(value):  # type: ignore[arg-type]
            return f"{self.name} must be finite, got {value!r}"
        x = value
        inside = ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)  # type: ignore[operator]
                  and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))  # type: ignore[operator]
        return None if inside else f"{self.name} must be {self.bounds()}, got {value}"

    def coerce(self, value: object, where: str) -> Value:
        """A value read from a file checked against the key's type (an int becomes a float
        for a float key).

        Raises:
            ValueError: naming ``where``, the key, its type and the value.
        """
        if not self.fits_type(value):
            raise ValueError(f"{where}: {self.name} must be {self.type.__name__}, got {value!r}")
        return float(value) if self.type is float else value  # type: ignore[arg-type,return-value]

    def parse(self, text: str) -> Value:
        """The value of a ``--set key=TEXT`` flag.

        Raises:
            ValueError: the text is not a value of the key's type.
        """
        want = self.type
        if want is bool:
            low = text.strip().lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"--set {self.name}: expected true or false, got {text!r}")
        if want is str:
            return text
        try:
            return float(text) if want is float else int(text.replace("_", ""))
        except ValueError:
            raise ValueError(f"--set {self.name}: expected {want.__name__}, got {text!r}") from None


def toml_value(value: Any) -> str:
    """``value`` written as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value) if isinstance(value, float) else str(value)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)
