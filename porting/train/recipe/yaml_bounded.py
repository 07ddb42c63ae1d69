"""YAML with bounds: PyYAML's safe loader refusing, before anything is built, documents nested too deep,
with too many aliases, or too large once aliases are expanded (a 1 KB 'billion laughs' names 10^9 nodes).

Recipes are read through it (``porting.train.recipe.schema``), and so is every ``--set`` value; any other
small YAML document a user hands port should be too.
"""

from __future__ import annotations

from typing import Any

import yaml

from model_zoo.errors import PortingError, RecipeError

MAX_YAML_NODES = 100_000   # after expanding aliases: a real recipe has ~100
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 32
RECIPE_HINT = "a recipe is a small mapping of sections, write it out without deep nesting or alias chains"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounds: nesting depth and alias count while composing, and the number of
    nodes with every alias expanded before anything is built (a 'billion laughs' recipe of 1 KB names
    10^9 nodes through aliases; it is refused in milliseconds instead of exhausting memory)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _YamlBound(f"more than {MAX_YAML_ALIASES} aliases (*name)")
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _YamlBound(f"nesting deeper than {MAX_YAML_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _YamlBound(Exception):
    def __init__(self, msg: str, node: yaml.Node | None = None):
        super().__init__(msg)
        self.node = node   # the value refused, so the message can name its key


MAX_INT_DIGITS = 40   # as model_zoo.files for JSON: 2**128 has 39 digits; no count or size port reads comes near


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """YAML integers, refused past ``MAX_INT_DIGITS`` digits before they are built: CPython raises a bare
    ValueError past 4,300 digits, and a 400-digit count overflows every float it meets later."""
    digits = sum(c.isalnum() for c in str(node.value))
    if digits > MAX_INT_DIGITS:
        raise _YamlBound(f"line {node.start_mark.line + 1}: an integer of {digits:,} digits, more than the "
                         f"{MAX_INT_DIGITS} any count or size port reads can have", node)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def _expanded_nodes(node: yaml.Node, limit: int) -> int:
    """Nodes of the document with aliases expanded, memoised per node (linear in the composed graph);
    stops counting once past ``limit``."""
    sizes: dict[int, int] = {}
    order, stack = [], [node]
    while stack:  # iterative post-order: children sized before their parent
        n = stack.pop()
        if id(n) in sizes:
            continue
        sizes[id(n)] = -1
        order.append(n)
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            stack.extend(x for kv in n.value for x in kv)
    for n in reversed(order):
        kids = (n.value if isinstance(n, yaml.SequenceNode) else
                [x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode) else [])
        sizes[id(n)] = min(limit + 1, 1 + sum(max(sizes[id(k)], 0) for k in kids))
    return sizes[id(node)]


def _key_of(root: yaml.Node, target: yaml.Node) -> str | None:
    """The dotted key path of ``target`` in the composed document (``optimizer.lr``, ``betas.0``)."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    seen: set[int] = set()
    while stack:
        n, path = stack.pop()
        if n is target:
            return path or None
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            stack.extend((v, f"{path}.{k.value}" if path else str(k.value)) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(n.value))
    return None


def load_yaml(text: str, where: str, *, what: str = "recipe", error: type[PortingError] = RecipeError,
              hint: str = RECIPE_HINT) -> Any:
    """One YAML document of ``text`` (read from ``where``), bounded in depth, aliases and expanded size;
    every failure is one ``error`` line naming ``where``; a refusal ends with ``hint``."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded_nodes(node, MAX_YAML_NODES)
        if n > MAX_YAML_NODES:
            raise _YamlBound(f"more than {MAX_YAML_NODES:,} values once aliases are expanded")
        return loader.construct_document(node)
    except _YamlBound as e:
        key = _key_of(node, e.node) if e.node is not None else None
        err = error(f"{where}: refused: " + (f"{key}: " if key else "") + f"{e}; {hint}")
        err.bound = True   # a bound, not a syntax error: a --set value is never taken as a string then
        raise err from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise error(f"{where}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise error(f"{where}: refused: nesting too deep for a {what}") from None
    finally:
        loader.dispose()


def parse_value(text: str, where: str = "--set") -> Any:
    """A --set value: YAML scalar/list syntax (3e-4, true, [1, 2], null), else the string; a value past the
    bounds (an alias bomb, a 5,000-digit integer) is refused, never kept as text (``where`` names the key)."""
    try:
        return load_yaml(text, where)
    except RecipeError as e:
        if getattr(e, "bound", False):
            raise
    return text
