"""Frozen dataclasses read from and written to JSON objects, their types taken from their annotations.

The one reading discipline of the baseline file and the comparison (:mod:`porting.baseline.document`,
:mod:`porting.baseline.comparison`), in the style of the run directory's records (:mod:`porting.rundir.records`):
every known key's type is checked and **every** problem is collected as one line, ``<where> is <found>, expected
<what>``; unknown keys are kept as read (``extra``) and written back after the known ones, so a key a later port
adds survives a reader that does not know it. Values keep their JSON type (an integer stays an integer), so a
record written back is the same JSON it was read from.

The annotations this reads: ``int``, ``float`` (an integer is a number too), ``str``, ``bool``, ``dict``,
``Any``, ``X | None``, ``tuple[X, ...]`` (a JSON list), ``dict[str, X]`` and another record. A field's
``metadata`` (:func:`spec`) gives its JSON key when that is not a Python name (``from``), bounds (``low``,
``high``), the words of ``expected`` when they say more than the type (``want``) and whether a null is left
out when written (``omit_none``). A class with ``from_dict``/``to_dict`` of its own (the result row,
:class:`porting.verify.check.Check`) is read and written by them.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Collection

_NONE = type(None)


def spec(default: Any = None, *, key: str | None = None, low: float | None = None, high: float | None = None,
         want: str | None = None, omit_none: bool = False, factory: Any = None) -> Any:
    """A dataclass field with the reading and writing rules above."""
    meta = {"key": key, "low": low, "high": high, "want": want, "omit_none": omit_none}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


def known_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.name != "extra"]


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(the type inside ``X | None``, whether null is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not _NONE]
        return (args[0] if len(args) == 1 else Any), _NONE in typing.get_args(tp)
    return tp, False


def _words(tp: Any, meta: dict) -> str:
    if meta.get("want"):
        return meta["want"]
    origin = typing.get_origin(tp) or tp
    base = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", dict: "an object",
            tuple: "a list", list: "a list"}.get(origin, "an object")
    low, high = (meta.get("low"), meta.get("high")) if origin in (int, float) else (None, None)   # bounds: numbers
    if low is not None and high is not None:
        return f"{base} from {low:g} to {high:g}"
    return base + (f" >= {low:g}" if low is not None else "")


def _is(where: str, v: Any, want: str) -> str:
    return f"{where} is {str(v)[:40]!r}, expected {want}"


def _scalar_ok(v: Any, tp: Any, meta: dict) -> bool:
    if tp is Any:
        return True
    if tp in (int, float):
        kinds = (int,) if tp is int else (int, float)
        if isinstance(v, bool) or not isinstance(v, kinds):
            return False
        low, high = meta.get("low"), meta.get("high")
        return not ((low is not None and v < low) or (high is not None and v > high))
    return isinstance(v, tp) and (tp is bool or not isinstance(v, bool))


def check(v: Any, tp: Any, where: str, meta: dict, out: list[str]) -> None:
    """Append to ``out`` every way ``v`` is not of type ``tp`` (the annotation), naming ``where``."""
    inner, nullable = _unwrap(tp)
    if v is None:
        if not nullable:
            out.append(_is(where, v, _words(inner, meta)))
        return
    origin = typing.get_origin(inner)
    if _delegates(inner):
        try:
            inner.from_dict(v)
        except ValueError as e:
            out.append(f"{where}: {e}")
        return
    if dataclasses.is_dataclass(inner):
        if not isinstance(v, dict):
            out.append(_is(where, v, "an object"))
        else:
            problems(inner, v, where, out)
        return
    if origin is tuple:
        if not isinstance(v, list):
            out.append(_is(where, v, _words(inner, meta) + (" or null" if nullable else "")))
            return
        elem = typing.get_args(inner)[0]
        for i, x in enumerate(v):
            before = len(out)
            check(x, elem, f"{where}[{i}]", meta, out)
            if len(out) > before:
                return   # the first bad element of a list says enough
        return
    if origin is dict:
        if not isinstance(v, dict):
            out.append(_is(where, v, "an object" + (" or null" if nullable else "")))
            return
        elem = typing.get_args(inner)[1]
        for k, x in v.items():
            check(x, elem, f"{where}.{k}", meta, out)
        return
    if not _scalar_ok(v, inner, meta):
        out.append(_is(where, v, _words(inner, meta) + (" or null" if nullable else "")))


def _delegates(tp: Any) -> bool:
    """A class that reads itself (``from_dict`` raising ValueError) and writes itself (``to_dict``)."""
    return isinstance(tp, type) and "from_dict" in vars(tp) and "to_dict" in vars(tp)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def problems(cls: type, doc: dict, where: str, out: list[str]) -> None:
    """Every known key of ``doc`` whose value is not of its field's type, and every key without a default that is
    absent."""
    hints = _hints(cls)
    for f in known_fields(cls):
        k = json_key(f)
        if k in doc:
            check(doc[k], hints[f.name], f"{where}.{k}" if where else k, dict(f.metadata), out)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            out.append(f"missing {where}.{k}" if where else f"missing key {k!r}")


def _build(v: Any, tp: Any) -> Any:
    inner, _ = _unwrap(tp)
    if v is None or inner is Any:
        return v
    if _delegates(inner):
        return inner.from_dict(v)
    if dataclasses.is_dataclass(inner):
        return build(inner, v)
    origin = typing.get_origin(inner)
    if origin is tuple:
        elem = typing.get_args(inner)[0]
        return tuple(_build(x, elem) for x in v)
    if origin is dict:
        elem = typing.get_args(inner)[1]
        return {k: _build(x, elem) for k, x in v.items()}
    return v


def build(cls: type, doc: dict) -> Any:
    """The record of a ``doc`` that :func:`problems` found nothing wrong with (absent keys: the defaults)."""
    hints = _hints(cls)
    fields = known_fields(cls)
    known = {json_key(f) for f in fields}
    vals = {f.name: _build(doc[json_key(f)], hints[f.name]) for f in fields if json_key(f) in doc}
    if any(f.name == "extra" for f in dataclasses.fields(cls)):
        vals["extra"] = {k: v for k, v in doc.items() if k not in known}
    return cls(**vals)


def to_json(v: Any) -> Any:
    """A value as JSON has it: records as objects (all their keys), tuples as lists."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return v.to_dict() if "to_dict" in vars(type(v)) else write(v)
    if isinstance(v, (tuple, list)):
        return [to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    return v


def write(rec: Any, *, only_set: bool = False, always: Collection[str] = (),
          order: Collection[str] | None = None) -> dict[str, Any]:
    """``rec`` as a JSON object: its known keys in field order (or ``order``), then its unknown ones.
    A null is written unless the field says ``omit_none``; with ``only_set``, only for the keys in ``always``."""
    fields = {json_key(f): f for f in known_fields(type(rec))}
    out: dict[str, Any] = {}
    for k in (order if order is not None else fields):
        f = fields[k]
        v = getattr(rec, f.name)
        if v is None and (k not in always if only_set else f.metadata.get("omit_none")):
            continue
        out[k] = to_json(v)
    return {**out, **getattr(rec, "extra", {})}
