"""The one typed reader of every value port imports from a CUDA job's files (configs, logs, imported
baselines): each key's expected type and range is stated once, as data (``porting.intake.config_keys.TYPES``,
the log readers' ``Num``), the way the recipe schema states its own (porting/train/recipe/schema.py).

The rules, for every key alike:

* a boolean is never a number, and a number is never a boolean (``learning_rate: true`` is not 1.0;
  ``bf16: 1`` is not true);
* a number is finite and inside its key's range (``Infinity``, ``NaN``, ``1e999`` and a 5,000-digit integer
  are refused), and an integer key takes only whole values (``num_processes: 8.5`` is not 8);
* YAML's other types (a date ``2020-01-01``, a ``!!set``, ``!!binary``) are never taken for a number or a
  string;
* each failure is one line: the file, the key, what was found (shown escaped, at most 60 characters)
  and what was expected.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

from model_zoo.errors import one_line
from porting.intake import IntakeError

MAX_TEXT = 4096          # a path, a model name or an optimizer name; a config value longer than this is not one


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as a message shows it: escaped (a newline cannot start a second line) and cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 40:
        return f"an integer of {len(str(abs(value))) if abs(value).bit_length() < 14_000 else 'over 4,300'} digits"
    if isinstance(value, (set, frozenset)):
        return "a YAML set (!!set)"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"a YAML date ({value.isoformat()})"
    if isinstance(value, bytes):
        return f"binary data ({len(value):,} bytes)"
    text = repr(value) if isinstance(value, str) else _repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _repr(value: Any) -> str:
    try:
        return ascii(value)
    except ValueError:   # an int past CPython's 4,300-digit conversion limit, nested in a list
        return f"a {type(value).__name__} holding an integer too long to print"


def name(path: Any) -> str:
    """A file or member name for a message: as it is, unless it holds a character that could break the
    line (a newline, a control character), then those characters escaped (``model_zoo.errors.one_line``)."""
    return one_line(path)


@dataclass(frozen=True)
class Num:
    """A number from ``low`` to ``high`` (both inclusive unless ``low_open``/``high_open``); ``whole``: an
    integer (a float with no fraction is taken as one)."""

    low: float
    high: float
    whole: bool = False
    low_open: bool = False
    high_open: bool = False

    def expected(self) -> str:
        lo = f"{'above' if self.low_open else 'from'} {_fmt(self.low)}"
        hi = f"{'below' if self.high_open else 'to'} {_fmt(self.high)}"
        return f"{'a whole number' if self.whole else 'a number'} {lo} {hi}"

    def check(self, v: Any) -> int | float | None:
        """The value, or None when it is not one this key takes."""
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if isinstance(v, int) and v.bit_length() > 128:   # 39 digits: past any count or size a config holds
            return None
        if not math.isfinite(v) or (self.whole and v != int(v)):
            return None
        if v < self.low or v > self.high or (self.low_open and v == self.low) or (self.high_open and v == self.high):
            return None
        return int(v) if self.whole else v


@dataclass(frozen=True)
class Flag:
    """true or false (never 0/1, never "yes")."""

    def expected(self) -> str:
        return "true or false"

    def check(self, v: Any) -> bool | None:
        return v if isinstance(v, bool) else None


@dataclass(frozen=True)
class Text:
    """A string of at most ``MAX_TEXT`` characters; ``many``: or a list of such strings (``report_to``)."""

    many: bool = False

    def expected(self) -> str:
        return "a string" + (" or a list of strings" if self.many else "") + f" (at most {MAX_TEXT:,} characters)"

    def check(self, v: Any) -> Any:
        if isinstance(v, str) and len(v) <= MAX_TEXT:
            return v
        if self.many and isinstance(v, list) and len(v) <= 64 and all(isinstance(x, str) and len(x) <= MAX_TEXT
                                                                      for x in v):
            return v
        return None


@dataclass(frozen=True)
class Pair:
    """A list of two numbers of ``item`` (Adam's ``betas``)."""

    item: Num

    def expected(self) -> str:
        return f"a list of two numbers, each {self.item.expected().removeprefix('a number ')}"

    def check(self, v: Any) -> list | None:
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            return None
        out = [self.item.check(x) for x in v]
        return None if None in out else out


Spec = Num | Flag | Text | Pair


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) < 10 ** 12:
        return f"{int(x):,}"
    return f"{x:g}"


def typed(value: Any, spec: Spec, where: str, key: str, *, null: bool = True) -> Any:
    """``value`` as ``spec`` takes it (None stays None when ``null``), else one IntakeError line naming
    ``where`` (the file, already escaped by the caller through :func:`name`) and ``key``."""
    if value is None and null:
        return None
    out = spec.check(value)
    if out is None:
        raise IntakeError(f"{where}: {name(key)}: found {shown(value)}, expected {spec.expected()}"
                          + (" (or null)" if null else "") + "; fix the value in the file")
    return out
