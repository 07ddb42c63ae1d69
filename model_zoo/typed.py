"""Frozen dataclasses read from and written to JSON objects, their types taken from their annotations.

The one reading discipline of port's JSON records: the baseline file and the comparison
(:mod:`porting.baseline.document`, :mod:`porting.baseline.comparison`) and the training plan
(:class:`porting.train.plan.make.TrainPlan`, plan.json), in the style of the run directory's records
(:mod:`porting.rundir.records`): every known key's type is checked and **every** problem is collected as one line,
``<where> is <found>, expected <what>``; unknown keys are kept as read (``extra``) and written back after the known
ones, so a key a later port adds survives a reader that does not know it, or, read ``strict`` (the plan, which port
writes and reads back itself), refused by name. Values keep their JSON type (an integer stays an integer), so a
record written back is the same JSON it was read from.

The annotations this reads: ``int``, ``float`` (an integer is a number too), ``str``, ``bool``, ``dict``,
``Any``, ``Literal[...]``, ``X | None``, ``A | B`` (the first that fits), ``tuple[X, ...]`` (a JSON list),
``dict[str, X]``, another record, and a pydantic model (a recipe section: its own ``model_validate``, written by
``model_dump``). A field's ``metadata`` (:func:`spec`) gives its JSON key when that is not a Python name
(``from``), bounds (``low``, ``high``), the words of ``expected`` when they say more than the type (``want``),
whether a null is left out when written (``omit_none``) and whether it is written ``{}`` (``empty_none``: an
absent part written as an empty object, read back as None). A class with ``from_dict``/``to_dict`` of its own (the
result row, :class:`porting.verify.check.Check`) is read and written by them. Bounded: the walk follows the
annotations, so its depth is the records' own; the document's size is its reader's (:mod:`model_zoo.files`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Collection

from model_zoo.errors import PortingError

_NONE = type(None)


def spec(default: Any = None, *, key: str | None = None, low: float | None = None, high: float | None = None,
         want: str | None = None, omit_none: bool = False, empty_none: bool = False, factory: Any = None) -> Any:
    """A dataclass field with the reading and writing rules above."""
    meta = {"key": key, "low": low, "high": high, "want": want, "omit_none": omit_none, "empty_none": empty_none}
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
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), _NONE in typing.get_args(tp)
    return tp, False


def _words(tp: Any, meta: dict) -> str:
    if meta.get("want"):
        return meta["want"]
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Union:
        return " or ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(tp))
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


class _Shape(typing.NamedTuple):
    inner: Any          # the type inside ``X | None``
    nullable: bool
    kind: str           # any | self (reads itself) | model (pydantic) | record | literal | union | list | map | scalar
    elem: Any = None    # a list's or a map's element type


@functools.lru_cache(maxsize=None)
def _shape(tp: Any) -> _Shape:
    """What an annotation asks for, worked out once per annotation (a list of 100,000 steps asks the same)."""
    inner, nullable = _unwrap(tp)
    origin = typing.get_origin(inner)
    if inner is Any:
        return _Shape(inner, nullable, "any")
    if isinstance(inner, type) and "from_dict" in vars(inner) and "to_dict" in vars(inner):
        return _Shape(inner, nullable, "self")   # reads itself (from_dict raising ValueError or a PortingError), writes itself
    if isinstance(inner, type) and hasattr(inner, "model_validate") and hasattr(inner, "model_dump"):
        return _Shape(inner, nullable, "model")  # a pydantic model: its own validation (ValidationError is a ValueError)
    if dataclasses.is_dataclass(inner):
        return _Shape(inner, nullable, "record")
    if origin is typing.Literal:
        return _Shape(inner, nullable, "literal")
    if origin is typing.Union:
        return _Shape(inner, nullable, "union")
    if origin is tuple:
        return _Shape(inner, nullable, "list", typing.get_args(inner)[0])
    if origin is dict:
        return _Shape(inner, nullable, "map", typing.get_args(inner)[1])
    return _Shape(inner, nullable, "scalar")


def _check_list(v: list, elem: Any, where: str, meta: dict, out: list[str], strict: bool) -> None:
    """The first bad element of a list (it says enough)."""
    e = _shape(elem)
    if e.kind == "scalar":   # the long lists (a value per step): one pass, no recursion
        bad = next((i for i, x in enumerate(v) if not (e.nullable if x is None else _scalar_ok(x, e.inner, meta))), None)
        if bad is not None:
            out.append(_is(f"{where}[{bad}]", v[bad], _words(e.inner, meta) + (" or null" if e.nullable else "")))
        return
    for i, x in enumerate(v):
        before = len(out)
        check(x, elem, f"{where}[{i}]", meta, out, strict)
        if len(out) > before:
            return


def check(v: Any, tp: Any, where: str, meta: dict, out: list[str], strict: bool = False) -> None:
    """Append to ``out`` every way ``v`` is not of type ``tp`` (the annotation), naming ``where``; ``strict``: an
    unknown key of a record without ``extra`` is a problem too."""
    sh = _shape(tp)
    or_null = " or null" if sh.nullable else ""
    if v is None or (v == {} and meta.get("empty_none")):
        if not sh.nullable:
            out.append(_is(where, v, _words(sh.inner, meta)))
    elif sh.kind in ("self", "model"):
        try:
            sh.inner.from_dict(v) if sh.kind == "self" else sh.inner.model_validate(v)
        except (ValueError, PortingError) as e:   # a record that reads itself may refuse as port does (the plan)
            out.append(f"{where}: {_first_line(e)}")
    elif sh.kind == "record":
        if isinstance(v, dict):
            problems(sh.inner, v, where, out, strict)
        else:
            out.append(_is(where, v, "an object" + or_null))
    elif sh.kind == "union":
        near = _nearest(v, sh.inner, where, strict)
        if near is not None:   # the nearest type's own problems, unless it is the value itself that fits none
            nested = [p for p in near if not p.startswith(f"{where} is ")]
            out += nested or [_is(where, v, _words(sh.inner, meta) + or_null)]
    elif sh.kind == "list":
        if isinstance(v, list):
            _check_list(v, sh.elem, where, meta, out, strict)
        else:
            out.append(_is(where, v, _words(sh.inner, meta) + or_null))
    elif sh.kind == "map":
        if not isinstance(v, dict):
            out.append(_is(where, v, "an object" + or_null))
            return
        for k, x in v.items():
            check(x, sh.elem, f"{where}.{k}", meta, out, strict)
    elif sh.kind == "literal" and not any(v == a and type(v) is type(a) for a in typing.get_args(sh.inner)):
        out.append(_is(where, v, _words(sh.inner, meta) + or_null))
    elif sh.kind == "scalar" and not _scalar_ok(v, sh.inner, meta):
        out.append(_is(where, v, _words(sh.inner, meta) + or_null))


def _arm(v: Any, union: Any, strict: bool) -> Any:
    """The first type of ``A | B`` that ``v`` fits without a problem, or None."""
    for a in typing.get_args(union):
        found: list[str] = []
        check(v, a, "", {}, found, strict)
        if not found:
            return a
    return None


def _nearest(v: Any, union: Any, where: str, strict: bool) -> list[str] | None:
    """None when ``v`` fits a type of ``A | B``; else the problems of the type it comes nearest (fewest)."""
    best: list[str] | None = None
    for a in typing.get_args(union):
        found: list[str] = []
        check(v, a, where, {}, found, strict)
        if not found:
            return None
        best = found if best is None or len(found) < len(best) else best
    return best


def _first_line(e: ValueError) -> str:
    """A validation error in one line: pydantic's first error with its location, else the message's first line."""
    errors = getattr(e, "errors", None)
    if callable(errors) and errors():
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg', '')}".lstrip(": ")
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class _Field(typing.NamedTuple):
    name: str
    key: str            # in the JSON object
    hint: Any
    meta: dict
    required: bool      # no default: a missing key is a problem


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(_Field(f.name, json_key(f), hints[f.name], dict(f.metadata),
                        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in known_fields(cls))


def problems(cls: type, doc: dict, where: str, out: list[str], strict: bool = False) -> None:
    """Every known key of ``doc`` whose value is not of its field's type, and every key without a default that is
    absent; ``strict``: every key the record does not know, when it keeps none (no ``extra``)."""
    fields = _fields(cls)
    for f in fields:
        if f.key in doc:
            check(doc[f.key], f.hint, f"{where}.{f.key}" if where else f.key, f.meta, out, strict)
        elif f.required:
            out.append(f"missing {where}.{f.key}" if where else f"missing key {f.key!r}")
    if strict and not any(f.name == "extra" for f in dataclasses.fields(cls)):
        known = {f.key for f in fields}
        out += [f"unknown key {where + '.' if where else ''}{str(k)[:40]} (a {cls.__name__} has no such key)"
                for k in doc if k not in known]


def _build(v: Any, tp: Any, meta: dict, strict: bool) -> Any:
    sh = _shape(tp)
    if v is None or (v == {} and meta.get("empty_none")):
        return None
    if sh.kind in ("any", "scalar", "literal"):
        return v
    if sh.kind == "self":
        return sh.inner.from_dict(v)
    if sh.kind == "model":
        return sh.inner.model_validate(v)
    if sh.kind == "record":
        return build(sh.inner, v, strict)
    if sh.kind == "union":
        return _build(v, _arm(v, sh.inner, strict), {}, strict)
    if sh.kind == "list":
        if _shape(sh.elem).kind == "scalar":
            return tuple(v)
        return tuple(_build(x, sh.elem, {}, strict) for x in v)
    return {k: _build(x, sh.elem, {}, strict) for k, x in v.items()}


def build(cls: type, doc: dict, strict: bool = False) -> Any:
    """The record of a ``doc`` that :func:`problems` found nothing wrong with (absent keys: the defaults)."""
    fields = _fields(cls)
    vals = {f.name: _build(doc[f.key], f.hint, f.meta, strict) for f in fields if f.key in doc}
    if any(f.name == "extra" for f in dataclasses.fields(cls)):
        known = {f.key for f in fields}
        vals["extra"] = {k: v for k, v in doc.items() if k not in known}
    return cls(**vals)


_PLAIN = (int, float, str, bool, type(None))


def to_json(v: Any) -> Any:
    """A value as JSON has it: records as objects (all their keys), tuples as lists."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, (tuple, list)):
        return [x if isinstance(x, _PLAIN) else to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return v.to_dict() if "to_dict" in vars(type(v)) else write(v)
    if hasattr(v, "model_dump") and not isinstance(v, type):   # a pydantic model (a recipe section)
        return v.model_dump(mode="json")
    return v


def write(record: Any, *, only_set: bool = False, always: Collection[str] = (),
          order: Collection[str] | None = None) -> dict[str, Any]:
    """``record`` (a dataclass) as a JSON object: its known keys in field order (or ``order``), then its unknown
    ones. A null is written unless the field says ``omit_none`` (``{}`` when it says ``empty_none``); with
    ``only_set``, only for the keys in ``always``."""
    fields = {f.key: f for f in _fields(type(record))}
    out: dict[str, Any] = {}
    for k in (order if order is not None else fields):
        f = fields[k]
        v = getattr(record, f.name)
        if v is None and (k not in always if only_set else f.meta.get("omit_none")):
            continue
        out[k] = {} if v is None and f.meta.get("empty_none") else to_json(v)
    return {**out, **getattr(record, "extra", {})}
