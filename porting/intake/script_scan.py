"""`port ops lint PATH...`: CUDA habits in training scripts, found with Python's ``ast`` only.

A script is parsed, never imported or run. Rules are data (porting/data/cuda_habits.yaml): each names
the habit, what to do on Ascend and a source. Names are resolved through the script's own imports
(``import torch as t``; ``from torch.cuda.amp import GradScaler``), so ``t.cuda.synchronize()`` and
``GradScaler()`` are found as ``torch.cuda.synchronize`` and ``torch.cuda.amp.GradScaler``. Each syntax
node gets the first rule that matches it, and what it consumed (a call's function name, an attribute
chain) is not matched again, so one habit is one finding at its line and column.

Bounds: a script is at most MAX_SCRIPT_BYTES, a directory yields at most MAX_FILES ``*.py`` files (symbolic
links are not followed), and the tree is walked iteratively, so no nesting depth overflows the stack.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from model_zoo import files
from porting.intake import IntakeError

RULES_FILE = Path(__file__).resolve().parents[1] / "data" / "cuda_habits.yaml"
MAX_SCRIPT_BYTES = 4 << 20     # the largest training scripts of the fixtures' repos are < 100 KB
MAX_FILES = 10_000
MATCHERS = ("call", "method", "import", "assign", "attribute", "string", "keyword")


@dataclass(frozen=True)
class Rule:
    id: str
    kind: str
    pattern: str
    habit: str
    ascend: str
    source: str

    def matches_name(self, name: str) -> bool:
        return name == self.pattern or (self.pattern.endswith(".") and name.startswith(self.pattern)) or (
            self.kind == "import" and name.startswith(self.pattern + "."))


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    col: int
    rule: str
    code: str
    habit: str
    ascend: str
    source: str


@lru_cache(maxsize=1)
def rules() -> tuple[Rule, ...]:
    """The rules of cuda_habits.yaml, checked once: every rule has one matcher and the four texts."""
    raw = yaml.safe_load(files.read_text(RULES_FILE, what="rules file", error=IntakeError))
    out = []
    for i, r in enumerate(raw["rules"]):
        kinds = [k for k in MATCHERS if k in r]
        missing = [k for k in ("id", "habit", "ascend", "source") if not r.get(k)]
        if len(kinds) != 1 or missing:
            raise IntakeError(f"{RULES_FILE}: rules[{i}]: needs exactly one matcher of {MATCHERS} and id, habit, ascend, "
                              f"source (found matchers {kinds}, missing {missing})")
        out.append(Rule(r["id"], kinds[0], str(r[kinds[0]]), r["habit"], r["ascend"], r["source"]))
    return tuple(out)


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> full dotted name, from every import of the module."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _resolve(name: str | None, aliases: dict[str, str]) -> str | None:
    if name is None:
        return None
    head, _, rest = name.partition(".")
    full = aliases.get(head, head)
    return f"{full}.{rest}" if rest else full


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def _match(rule: Rule, node: ast.AST, aliases: dict[str, str]) -> ast.AST | None:
    """The part of ``node`` the rule consumed (not matched again by later rules), or None."""
    k = rule.kind
    if k == "call" and isinstance(node, ast.Call):
        name = _resolve(_dotted(node.func), aliases)
        return node.func if name and rule.matches_name(name) else None
    if k == "method" and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func if node.func.attr == rule.pattern else None
    if k == "import":
        return node if any(rule.matches_name(m) for m in _imported(node)) else None
    if k == "assign" and isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            name = _resolve(_dotted(t), aliases)
            if name and rule.matches_name(name):
                return t
        return None
    if k == "attribute" and isinstance(node, ast.Attribute):
        name = _resolve(_dotted(node), aliases)
        return node if name and rule.matches_name(name) else None
    if k == "string" and isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node if re.fullmatch(rule.pattern, node.value) else None
    if k == "keyword" and isinstance(node, ast.keyword):
        key, _, rx = rule.pattern.partition("=")
        v = node.value
        ok = node.arg == key and isinstance(v, ast.Constant) and isinstance(v.value, str) and re.fullmatch(rx, v.value)
        return node if ok else None
    return None


def scan_source(text: str, where: str) -> list[Finding]:
    """Findings of one script's source (``where`` names it in errors and findings)."""
    try:
        tree = ast.parse(text, filename=where)
    except SyntaxError as e:
        at = f"line {e.lineno}: " if e.lineno else ""
        raise IntakeError(f"{where}: {at}not valid Python ({e.msg}); port scans Python 3 scripts as they "
                          "are (it never runs them): fix the syntax or leave the file out") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise IntakeError(f"{where}: cannot be parsed as Python ({type(e).__name__}: {str(e)[:80]}); leave the file "
                          "out of the scan") from None
    aliases = _aliases(tree)
    lines = text.splitlines()
    consumed: set[int] = set()
    out = []
    for node in ast.walk(tree):   # breadth-first: a call is seen before the names inside it
        if id(node) in consumed or not hasattr(node, "lineno"):
            continue
        for rule in rules():
            part = _match(rule, node, aliases)
            if part is None:
                continue
            consumed.update(id(n) for n in ast.walk(part))
            code = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
            out.append(Finding(where, node.lineno, node.col_offset + 1, rule.id, code[:160], rule.habit,
                               rule.ascend, rule.source))
            break
    return sorted(out, key=lambda f: (f.line, f.col))


def script_files(paths: list[str]) -> list[Path]:
    """The ``*.py`` files named or under the directories named (sorted, links not followed, bounded)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_symlink() and p.is_dir():
            raise IntakeError(f"{p}: a symbolic link to a directory; pass the directory itself")
        if p.is_dir():
            for root, dirs, names in os.walk(p, followlinks=False):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                out += [Path(root) / n for n in sorted(names) if n.endswith(".py") and not (Path(root) / n).is_symlink()]
                if len(out) > MAX_FILES:
                    raise IntakeError(f"{p}: more than {MAX_FILES:,} Python files; scan the training code's folder, "
                                      "not a whole environment")
        elif p.exists():
            out.append(p)
        else:
            raise IntakeError(f"{p}: no such file or directory; pass training scripts (.py) or their folder")
    return out


def scan(paths: list[str]) -> dict[str, Any]:
    """The scan of every script: findings per file and line, and counts by rule."""
    found: list[Finding] = []
    scripts = script_files(paths)
    for f in scripts:
        text = files.read_text(f, what="Python script", max_bytes=MAX_SCRIPT_BYTES, error=IntakeError)
        found += scan_source(text, str(f))
    counts: dict[str, int] = {}
    for x in found:
        counts[x.rule] = counts.get(x.rule, 0) + 1
    return {"format": "port-script-scan", "format_version": 1, "files": [str(f) for f in scripts],
            "findings": [asdict(x) for x in found], "counts": counts,
            "rules": {r.id: {"habit": r.habit, "ascend": r.ascend, "source": r.source} for r in rules()}}


def render(rep: dict[str, Any]) -> str:
    if not rep["findings"]:
        return f"{len(rep['files'])} script(s) scanned: no CUDA habit found"
    lines = [f"{'file:line':<48} {'habit':<22} code"]
    for f in rep["findings"]:
        lines.append(f"{f['file'] + ':' + str(f['line']):<48} {f['rule']:<22} {f['code'][:70]}")
    lines += ["", "what to do on Ascend:"]
    for rid in rep["counts"]:
        r = rep["rules"][rid]
        lines.append(f"  {rid} ({rep['counts'][rid]}): {r['ascend']}  [{r['source']}]")
    lines.append(f"{len(rep['findings'])} CUDA habit(s) in {len(rep['files'])} script(s)")
    return "\n".join(lines)
