"""The plan's records to JSON and back: :func:`dump` writes a frozen record (a dataclass) as the plain JSON value
``plan.json`` holds; :func:`build` rebuilds it from that value by the record's type hints, and refuses a malformed
document in one line naming the key (``launch.env.HCCL_EXEC_TIMEOUT: expected str, found int``).

The one convention beyond ``dataclasses.asdict``: a field whose metadata holds :data:`EMPTY` is written ``{}`` when
it is None (``launch``, ``links``: absent where the plan has none, as plan.json has always written them), one whose
metadata holds :data:`OMIT` is left out (a roofline step inside a proposal has no ``kind``). A field named after a
Python keyword ends in ``_`` (``from_``); its key does not.

Bounded: :func:`build` walks the type hints, not the document (its depth is the records' own), takes only the hint
forms below and refuses anything else; the document's size is its reader's (``files.read_json_object``). Adding a
field to a record is adding the annotated field: nothing here names a record.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel, ValidationError

from model_zoo.errors import ConfigError

T = TypeVar("T")
NONE_AS = "port.none_as"              # metadata key: how a None field is written
EMPTY = {NONE_AS: "{}"}               # None written as {} (and {} read back as None)
OMIT = {NONE_AS: "omit"}              # None left out (and an absent key read back as None)


class PlanFormatError(ConfigError):
    """A plan document (plan.json, a job's plan) that does not hold the records it should."""


def _key(f: dataclasses.Field) -> str:
    return f.name[:-1] if f.name.endswith("_") else f.name


def dump(obj: Any) -> Any:
    """The JSON value of a record, a recipe section (pydantic), a tuple, list, dict or scalar."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            how = f.metadata.get(NONE_AS)
            if v is None and how == "omit":
                continue
            out[_key(f)] = {} if v is None and how == "{}" else dump(v)
        return out
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (list, tuple)):
        return [dump(v) for v in obj]
    if isinstance(obj, dict):
        return {k: dump(v) for k, v in obj.items()}
    return obj


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build(cls: type[T], doc: Any, where: str = "") -> T:
    """The record ``cls`` from its JSON value; PlanFormatError naming the key on the first problem."""
    return _value(cls, doc, where)


def _record(cls: type, doc: Any, where: str) -> Any:
    if not isinstance(doc, dict):
        raise _bad(where, f"an object ({cls.__name__})", doc)
    fields = {_key(f): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise PlanFormatError(f"{_at(where, unknown[0])}: unknown key (a {cls.__name__} holds "
                              f"{', '.join(fields)}); write the plan with this version of port")
    hints, kw = _hints(cls), {}
    for key, f in fields.items():
        how = f.metadata.get(NONE_AS)
        if key not in doc:
            if how == "omit":
                kw[f.name] = None
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PlanFormatError(f"{_at(where, key)}: missing (a {cls.__name__} needs it); write the plan "
                                      "with this version of port")
            continue
        v = doc[key]
        kw[f.name] = None if how == "{}" and v == {} else _value(hints[f.name], v, _at(where, key))
    return cls(**kw)


def _value(hint: Any, doc: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _record(hint, doc, where)
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return _section(hint, doc, where)
    if origin in (Union, types.UnionType):
        return _union(args, doc, where)
    if origin is Literal:
        if doc not in args or isinstance(doc, bool) != isinstance(args[0], bool):
            raise _bad(where, " or ".join(repr(a) for a in args), doc)
        return doc
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(doc, list):
            raise _bad(where, "a list", doc)
        return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(doc))
    if origin is dict and args[0] is str:
        if not isinstance(doc, dict):
            raise _bad(where, "an object", doc)
        return {k: _value(args[1], v, _at(where, k)) for k, v in doc.items()}
    return _scalar(hint, doc, where)


def _scalar(hint: Any, doc: Any, where: str) -> Any:
    if hint is Any:
        return doc
    if hint is type(None):
        if doc is not None:
            raise _bad(where, "null", doc)
        return doc
    if hint is float:   # an int is a float (PEP 484's numeric tower), kept as written so it is written back the same
        ok = isinstance(doc, (int, float)) and not isinstance(doc, bool)
    elif hint in (int, str, bool):
        ok = isinstance(doc, hint) and (hint is bool or not isinstance(doc, bool))
    else:
        raise PlanFormatError(f"{where}: the record's type {hint!r} has no JSON reader (porting/train/plan/records.py)")
    if not ok:
        raise _bad(where, hint.__name__, doc)
    return doc


def _union(args: tuple, doc: Any, where: str) -> Any:
    if doc is None and type(None) in args:
        return None
    errors = []
    for a in (a for a in args if a is not type(None)):
        try:
            return _value(a, doc, where)
        except PlanFormatError as e:
            errors.append(str(e))
    if len(errors) == 1:
        raise PlanFormatError(errors[0])
    raise PlanFormatError(f"{where}: none of {' | '.join(getattr(a, '__name__', str(a)) for a in args)} "
                          f"fits ({'; '.join(errors)})")


def _section(model: type[BaseModel], doc: Any, where: str) -> BaseModel:
    """A recipe section the plan holds (precision, comm_fusion), validated by its own schema."""
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise PlanFormatError(f"{_at(where, loc) if loc else where}: {err['msg']}") from None


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _bad(where: str, expected: str, found: Any) -> PlanFormatError:
    shown = repr(found) if len(repr(found)) <= 40 else repr(found)[:37] + "..."
    return PlanFormatError(f"{where or 'plan'}: expected {expected}, found {type(found).__name__} {shown}")
