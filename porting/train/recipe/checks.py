"""Checks of single recipe values that the schema's fields share: no boolean where a number belongs (and
:class:`Section`, the base every recipe section derives from, which applies it to each field), and prompt templates
that can be filled from a row."""

from __future__ import annotations

import string
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def bool_where_number(value: Any, annotation: Any) -> bool:
    """Whether ``value`` holds a bool where ``annotation`` wants a number (an int or float field, or one
    inside an Optional, Annotated, list or tuple); a field that takes bools (or Any) takes them."""
    args = get_args(annotation)
    origin = get_origin(annotation)
    if origin is Annotated:
        return bool_where_number(value, args[0])
    if origin is Union or origin is types.UnionType:
        if isinstance(value, bool) and bool in args:
            return False
        return any(bool_where_number(value, a) for a in args if a is not type(None))
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        inner = [a for a in args if a is not Ellipsis] or [Any]
        return any(bool_where_number(v, inner[min(i, len(inner) - 1)]) for i, v in enumerate(value))
    return isinstance(value, bool) and annotation in (int, float)



class Section(BaseModel):
    """The base of every recipe section (schema.py's, recipe/lora.py, recipe/nonfinite.py): unknown keys refused,
    assignments validated, and no boolean read as a number."""

    # allow_inf_nan=False: .inf / .nan are refused for every float field, whatever its range
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean is never a count or a size: pydantic's lax mode reads ``true`` as 1 for an int or float
        field (``parallel.tensor_parallel: true`` would train with TP 1). Checked for every field of every
        section, inside lists and tuples too."""
        if bool_where_number(value, cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, got a boolean (true/false); write the number itself")
        return value

def template_problem(template: str, allowed: set[str]) -> str | None:
    """Why a ``str.format`` prompt template would fail on a row (``{nonexistent}``, ``{0}``, ``{x.attr}``,
    an unmatched brace), or None. Checked when the recipe loads, not on the first row."""
    try:
        fields = [f for _, f, spec, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        return f"{e}; write a literal brace as {{{{ or }}}}"
    for f in fields:
        if f not in allowed:
            shown = "{" + f + "}" if f else "{}"
            return (f"{shown} is not a field of a row; use only " + ", ".join("{" + a + "}" for a in sorted(allowed))
                    + " (write a literal brace as {{ or }})")
    return None
