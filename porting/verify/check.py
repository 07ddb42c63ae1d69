"""The one result row of every verification: what was checked, by which measure, the value, the bound,
the verdict and one line of detail.

`port verify` (parity, the checkpoint claims, generation), `port eval`, `port bisect`, `port compare`
and `port report` all produce and print :class:`Check` rows, in the same JSON form
(``name, measure, value, tolerance, passed, detail``, in that order) and the same table (:func:`table`).
A row with a number passes when the number is finite and within the tolerance (:meth:`Check.within`);
a claim without a number (a checkpoint's manifest, the golden text) carries its verdict (:meth:`Check.claim`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

CLAIM = "claim"   # the measure of a row without a number


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    measure: str              # what ``value`` is: "max_abs", "rel_l2", "tokens_differing", ... or CLAIM
    value: float | None       # None: a claim, or a measurement that could not be made (detail says why)
    tolerance: float | None   # the bound ``value`` is held to; None for a claim
    passed: bool
    detail: str = ""          # one line: the other numbers behind the value, or what failed

    @classmethod
    def within(cls, name: str, measure: str, value: float, tolerance: float, detail: str = "") -> Check:
        """A measured row: passed when ``value`` is finite and at most ``tolerance``."""
        v = value if isinstance(value, int) and not isinstance(value, bool) else float(value)   # NumPy scalars too
        return cls(name, measure, v, tolerance, bool(math.isfinite(v) and v <= tolerance), detail)

    @classmethod
    def claim(cls, name: str, passed: bool, detail: str) -> Check:
        return cls(name, CLAIM, None, None, bool(passed), detail)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: these six keys in this order; a non-finite value is null (JSON has no NaN)."""
        d = dataclasses.asdict(self)
        if isinstance(self.value, float) and not math.isfinite(self.value):
            d["value"] = None
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Check:
        """A row read back from a JSON file (`port report`); ValueError naming the field that is wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a check row (an object), found {type(d).__name__}")
        for key, types in (("name", str), ("measure", str), ("passed", bool), ("detail", str)):
            if not isinstance(d.get(key), types):
                raise ValueError(f"check row field {key!r} is {str(d.get(key))[:40]!r}, expected {types.__name__}")
        for key in ("value", "tolerance"):
            v = d.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"check row {d['name']!r}: {key} is {str(v)[:40]!r}, expected a number or null")
        return cls(d["name"], d["measure"], d.get("value"), d.get("tolerance"), d["passed"], d["detail"])


def _num(v: float | None, width: int, spec: str) -> str:
    """A count as an integer, a measurement in ``spec``, none as '-'."""
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, int):
        return f"{v:>{width}d}"
    return f"{v:>{width}{spec}}" if math.isfinite(v) else f"{str(v):>{width}}"


CELLS_HEADER = f"{'measure':18} {'value':>10} {'tolerance':>9}  result  detail"
HEADER = f"{'check':34} {CELLS_HEADER}"


def cells(c: Check, result: str | None = None) -> str:
    """The row without its name: measure, value, tolerance, result, detail (a table with its own first
    columns, like `port bisect`'s, ends with these). ``result`` replaces ok/FAIL (`port bisect`: "n/a" for
    a tensor one side never produced, which no verdict is drawn from)."""
    value, tol = _num(c.value, 10, ".3e"), _num(c.tolerance, 9, ".1e")
    word = result or ("ok" if c.passed else "FAIL")
    return f"{c.measure.replace('_', ' ')[:18]:18} {value} {tol}  {word:6}  {c.detail}".rstrip()


def line(c: Check) -> str:
    """One row of the table (the name cut to 34 characters; the detail is the rest of the line)."""
    return f"{c.name[:34]:34} {cells(c)}"


def brief(c: Check) -> str:
    """The row in a few words, for a cell of another table (`port report`): name, measure, value, bound, result."""
    if c.value is None:
        return f"{c.name}: {'ok' if c.passed else 'FAIL'}" + (f" ({c.detail})" if c.detail else "")
    bound = "" if c.tolerance is None else f" (tolerance {_num(c.tolerance, 0, '.1e').strip()})"
    return f"{c.name} {c.measure.replace('_', ' ')} {_num(c.value, 0, '.3e').strip()}{bound} {'ok' if c.passed else 'FAIL'}"


def table(rows: list[Check]) -> str:
    """The header and one line per row: what `port verify`, `port eval`, `port compare` and `port report` print."""
    return "\n".join([HEADER] + [line(r) for r in rows])


def all_passed(rows: list[Check]) -> bool:
    return bool(rows) and all(r.passed for r in rows)
