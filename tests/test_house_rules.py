"""The size rules of the house ("Done means"): no module of ``porting/``, ``model_zoo/`` or
``converters/`` over ~450 lines and no function over ~80 lines, unless the module's docstring says why.

A module may go over only by being named in ``LONG_MODULES`` with the reason, and that reason must be
in its docstring too (where a reader of the module sees it). ``PENDING_SPLIT`` names modules over the
limit today that are being rewritten on other branches; an entry that is no longer over the limit
fails the test, so the list cannot outlive its reason.

Then the import graph: packages import downwards, 0 cycles, the jobs of porting/train in order; and
(issue 34) no two packages importing each other, one verification family, the launch wing's place, and one
owner each of a child's environment, the process-group teardown, the decision on how a launch ended and the rank
log's lines.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("porting", "model_zoo", "converters")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

# module -> the sentence of its docstring that says why it is longer.
LONG_MODULES: dict[str, str] = {
}
# module -> what is to be done; each is over the limit and is being split where it is owned.
PENDING_SPLIT: dict[str, str] = {
    "porting/cluster/ranktable.py": "split the cross-entry rules from the pydantic models",
}


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "csrc" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_no_module_over_the_line_limit():
    over = {}
    for p in _modules():
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            over[_rel(p)] = n
    unexplained = {m: n for m, n in over.items() if m not in LONG_MODULES and m not in PENDING_SPLIT}
    assert not unexplained, (f"modules over {MAX_MODULE_LINES} lines: {unexplained}; split them, or add the reason "
                             "to the module docstring and to LONG_MODULES")
    stale = sorted(m for m in PENDING_SPLIT if m not in over)
    assert not stale, f"no longer over {MAX_MODULE_LINES} lines: remove {stale} from PENDING_SPLIT"


def test_long_modules_state_their_reason_in_the_docstring():
    for module, reason in LONG_MODULES.items():
        doc = ast.get_docstring(ast.parse((ROOT / module).read_text(encoding="utf-8"))) or ""
        assert reason and reason in " ".join(doc.split()), f"{module}: its docstring does not say {reason!r}"


def test_no_function_over_the_line_limit():
    over = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over.append(f"{_rel(p)}:{node.lineno} {node.name} ({n} lines)")
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_the_checks_see_the_whole_tree():
    # the walk finds the packages' modules (a moved root would make every check above pass vacuously)
    mods = {_rel(p) for p in _modules()}
    assert {"porting/verify/roundtrip.py", "converters/convert.py", "model_zoo/files.py"} <= mods and len(mods) > 50


# --------------------------------------------------------------------------- the import graph
# Packages import downwards only: porting -> converters -> model_zoo.
PACKAGE_ORDER = ("porting", "converters", "model_zoo")
# Inside porting/train, each job imports only itself and the jobs after it (the face, porting/train/__init__.py,
# sits above them all).
TRAIN_ORDER = ("run", "plan", "data", "recipe")
# The jobs that plan and prepare data: a dry run and the torch baseline load them without MindSpore.
NO_MINDSPORE = ("porting.train.recipe", "porting.train.data", "porting.train.plan")
HEAVY = ("mindspore", "torch", "transformers")


def _module_name(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, name: str, is_pkg: bool) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of the tree, relative ones resolved;
    ``from m import x`` yields ``m.x`` (a submodule or a name of ``m``: the graph keeps whichever exists)."""
    local: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(a.name, n.lineno, id(n) in local) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (n.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out += [(f"{base}.{a.name}", n.lineno, id(n) in local) for a in n.names]
    return out


@functools.lru_cache(maxsize=1)
def import_graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, int, bool]]]]:
    """The modules of the packages and, for each, the modules of the packages it imports (module-level and
    function-local imports both, TYPE_CHECKING ones too), and every import it makes (external ones as well)."""
    mods = {_module_name(p): p for p in _modules()}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    raw: dict[str, list[tuple[str, int, bool]]] = {}
    for m, p in mods.items():
        raw[m] = _imports(ast.parse(p.read_text(encoding="utf-8")), m, p.name == "__init__.py")
        for target, _, _ in raw[m]:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != m:
                edges[m].add(target)
    return edges, raw


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _train_job(m: str) -> str | None:
    parts = m.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["porting", "train"] else None


def test_no_import_cycles():
    edges, _ = import_graph()
    assert len(edges) > 50 and any("porting.train.run.loop" in e for e in edges.values() if e)
    cycles = _cycles(edges)
    assert not cycles, f"import cycles (module-level and function-local imports): {cycles}"


def test_packages_import_downwards_only():
    edges, _ = import_graph()
    rank = {p: i for i, p in enumerate(PACKAGE_ORDER)}
    up = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs
                if rank[b.split(".")[0]] < rank[a.split(".")[0]])
    assert not up, f"imports against {' -> '.join(PACKAGE_ORDER)}: {up}"


def test_train_jobs_import_downwards_only():
    edges, _ = import_graph()
    rank = {j: i for i, j in enumerate(TRAIN_ORDER)}
    jobs = {_train_job(m) for m in edges} - {None}
    assert jobs == set(TRAIN_ORDER), f"porting/train/ holds {sorted(jobs)}; TRAIN_ORDER names {TRAIN_ORDER}"
    up = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs
                if _train_job(a) and _train_job(b) and rank[_train_job(b)] < rank[_train_job(a)])
    assert not up, f"imports against porting/train's order {' -> '.join(TRAIN_ORDER)}: {up}"
    face = [f"{a} -> porting.train" for a, bs in edges.items() if "porting.train" in bs and _train_job(a)]
    assert not face, f"a job imports the face (porting/train/__init__.py) above it: {face}"


def test_planning_and_data_never_import_mindspore():
    """Nothing plan/, data/ or recipe/ import, directly or through other modules of the packages, imports
    MindSpore, even inside a function."""
    edges, raw = import_graph()
    for start in sorted(m for m in edges if m.startswith(NO_MINDSPORE)):
        seen, todo, via = {start}, [start], {start: start}
        while todo:
            m = todo.pop()
            for target, line, _ in raw[m]:
                assert target.split(".")[0] != "mindspore", (
                    f"{start} reaches MindSpore: {' <- '.join(_path(via, m))} imports {target} (line {line})")
            for n in edges[m] - seen:
                seen.add(n)
                via[n] = m
                todo.append(n)


def _path(via: dict[str, str], m: str) -> list[str]:
    out = [m]
    while via[out[-1]] != out[-1]:
        out.append(via[out[-1]])
    return out


def test_local_imports_in_train_defer_a_heavy_dependency():
    """Inside porting/train a function-local import only defers a heavy dependency, and says so on its line."""
    edges, raw = import_graph()
    bad = []
    for m in sorted(x for x in raw if _train_job(x) or x == "porting.train"):
        lines = _modules_source(m).splitlines()
        for target, line, local in raw[m]:
            if local and "# deferred:" not in lines[line - 1]:
                bad.append(f"{m}:{line} {target}")
    assert not bad, f"function-local imports without a '# deferred: reason' comment: {bad}"


def _modules_source(m: str) -> str:
    p = ROOT / Path(*m.split("."))
    return (p / "__init__.py" if p.is_dir() else p.with_suffix(".py")).read_text(encoding="utf-8")


_DRY_RUN_WITHOUT_MINDSPORE = """
import dataclasses, sys
import porting.train as T
import porting.train.data.batching, porting.train.data.padding, porting.train.data.packing, porting.train.data.chat
import porting.train.plan.make, porting.train.plan.render, porting.train.plan.launch, porting.train.plan.roofline
import porting.train.recipe.schema, porting.train.recipe.schedule
rec = T.load_recipe(sys.argv[1], ["parallel.tensor_parallel=1"], check_files=False)   # refused: every planner path
cfg, notes = T.plan_config(rec)
T.check_tensor_parallel(rec, cfg, rec.model.source)
plan = T.make_plan(rec, cfg, "runs/x")
padding, line = T.dry_run_padding(rec)
text = T.format_plan(dataclasses.replace(plan, padding=padding))
assert not plan.fits and plan.proposals and "msrun" in text, text
print("mindspore loaded" if "mindspore" in sys.modules else "no mindspore")
"""


def test_a_dry_run_plan_never_loads_mindspore():
    """The face, recipe/, data/ and plan/ plan the 13B recipe (a refused variant: remedies and proposals too)
    in a fresh interpreter without loading MindSpore, so a dry run works on a laptop."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _DRY_RUN_WITHOUT_MINDSPORE, str(ROOT / "recipes" / "13b-32card.yaml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "no mindspore", p.stdout[-2000:]


_LAUNCH_WITHOUT_MINDSPORE = """
import shutil, sys, tempfile
from pathlib import Path
import porting.launch.start as start, porting.launch.msrun, porting.launch.session, porting.launch.supervise
import porting.train.run.checkpoint.read   # a worker's reader: MindSpore only inside restore and restore_weights
from model_zoo.config import LlamaConfig
from porting.job import Hooks, Job
from porting.launch.options import Launch
from porting.model_paths import resolve_hf
from porting.train.plan.make import make_plan
from porting.train.recipe.schema import load_recipe
from porting.train.run.checkpoint.resume_check import check_run_dir
print("imports:", "mindspore" in sys.modules)
rec = load_recipe("recipes/tiny-cpu.yaml", ["cluster.devices_per_node=2", "batching.micro_batch_size=2"])
model = LlamaConfig.from_hf(resolve_hf(rec.model.source))
cfg = model.to_hf()
d = Path(tempfile.mkdtemp())
hooks = Hooks(doctor=dict, diagnose=lambda logs, world: {}, explain=lambda logs, workers: "")
assert start.prepare(Job.of(rec, d / "fresh"), Launch(), hooks)[1] is None
print("fresh:", "mindspore" in sys.modules)
shutil.copytree(sys.argv[1], d / "old", ignore=shutil.ignore_patterns("hf"))
assert "re-cut exactly" in check_run_dir(d / "old", True, rec, cfg)   # a resume in another layout: every check
assert "re-cut exactly" in start.prepare(Job.of(rec, d / "old"), Launch(resume=True), hooks)[1]
print("resumable:", "mindspore" in sys.modules)
shutil.rmtree(d)
"""


def test_the_launcher_never_loads_mindspore(tiny_cpu_run):
    """`port train` on more than one device only checks, writes the plan and waits for msrun's workers: the
    launch wing (the supervisor and the checkpoint reader too) imported, and the run-directory and resume checks
    run on a fresh and on a resumable run directory (a real per-rank checkpoint, re-cut for another layout), in a
    fresh interpreter, never load MindSpore (2-5 CPU-s a launch, BENCHMARKS.md)."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _LAUNCH_WITHOUT_MINDSPORE, str(tiny_cpu_run)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["imports:", "False", "fresh:", "False", "resumable:", "False"], p.stdout[-2000:]


# --------------------------------------------------------------------------- packages that import each other
def _package(m: str) -> str:
    """porting.<sub> for a module of porting (a root module is its own package), else the top package."""
    parts = m.split(".")
    return ".".join(parts[:2]) if parts[0] == "porting" and len(parts) > 1 else parts[0]


# (package, package) -> what is being done; each pair imports each other today and is being untangled where it
# is owned. A pair that no longer imports each other fails the test, so the list cannot outlive its reason.
PENDING_PAIRS: dict[tuple[str, str], str] = {}   # porting.cluster <-> porting.train went with R1 (porting/launch/)


def _package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between packages of porting/ (and the top packages), module-level and function-local."""
    out: dict[str, set[str]] = {}
    for a, bs in edges.items():
        for b in bs:
            if _package(a) != _package(b):
                out.setdefault(_package(a), set()).add(_package(b))
    return out


def test_no_loop_between_packages_of_any_length():
    """The pair rule below sees two packages that import each other; a loop through three or more (train ->
    diagnostics -> cluster -> launch -> train, before the job document) is invisible to it. Every strongly connected
    set of packages is one such loop, whatever its length."""
    loops = _cycles(_package_edges(import_graph()[0]))
    assert not loops, f"packages that import each other through a loop: {loops}"


def test_the_package_loop_rule_finds_a_planted_loop_of_three():
    planted = {"porting.a.x": {"porting.b.y"}, "porting.b.y": {"porting.c.z"}, "porting.c.z": {"porting.a.w"},
               "porting.a.w": set(), "porting.d.q": {"porting.a.x"}}
    assert _cycles(_package_edges(planted)) == [["porting.a", "porting.b", "porting.c"]]
    assert not any(len(c) == 2 for c in _cycles(_package_edges(planted)))   # no pair: the pair rule alone misses it


def test_no_two_packages_import_each_other():
    edges, _ = import_graph()
    pkg_edges = {(_package(a), _package(b)) for a, bs in edges.items() for b in bs if _package(a) != _package(b)}
    pairs = {tuple(sorted(e)) for e in pkg_edges if e[::-1] in pkg_edges}
    assert ("porting.verify", "porting.train") not in pairs   # port eval's held-out loss lives in train/run/heldout.py
    unexplained = sorted(pairs - set(PENDING_PAIRS))
    assert not unexplained, f"packages that import each other: {unexplained}"
    stale = sorted(set(PENDING_PAIRS) - pairs)
    assert not stale, f"no longer importing each other: remove {stale} from PENDING_PAIRS"


# --------------------------------------------------------------------------- one verification family
# One HF loader (porting/verify/pair.py), one difference function and one tolerance table
# (porting/verify/stats.py). Each scan below must find the one it protects, so it cannot pass vacuously.
HF_LOADER = "porting/verify/pair.py"
STATS = "porting/verify/stats.py"
# module file name -> why it may load or compare on its own; keyed by file name so a move keeps the reason.
OTHER_HF_LOADERS = {
    "opscan.py": "`port ops scan` traces the aten ops of the user's model under the attention it is asked for: "
                 "the model is the subject of the scan, not a reference",
}
OTHER_DIFFERENCES = {
    "device_probe.py": "a device's health probe: a matmul on the device against NumPy, not the model against torch",
    "smoke_collectives.py": "a collective's result against its closed form, not the model against torch",
}
_CLOSENESS = {"allclose", "isclose", "assert_allclose", "assert_close"}


def _trees() -> list[tuple[str, ast.AST]]:
    return [(_rel(p), ast.parse(p.read_text(encoding="utf-8"))) for p in _modules()]


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _hf_model_loads(tree: ast.AST) -> list[int]:
    """Lines that load an HF model's weights: ``<...CausalLM or AutoModel...>.from_pretrained(...)``, or pick
    its attention (``attn_implementation=``)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "from_pretrained":
            owner = _dotted(n.func.value)
            if "CausalLM" in owner or "AutoModel" in owner:
                out.append(n.lineno)
        if isinstance(n, ast.Call) and any(k.arg == "attn_implementation" for k in n.keywords):
            out.append(n.lineno)
    return out


def test_one_hf_loader():
    found = {m: lines for m, tree in _trees() if (lines := _hf_model_loads(tree))}
    assert HF_LOADER in found, f"the scan no longer finds {HF_LOADER}'s from_pretrained"
    others = {m: lines for m, lines in found.items() if m != HF_LOADER and Path(m).name not in OTHER_HF_LOADERS}
    assert not others, (f"a second loader of an HF model: {others}; load it with porting.verify.pair.load_reference "
                        "(or name the module in OTHER_HF_LOADERS with the reason)")


def _differences(tree: ast.AST) -> list[int]:
    """Lines that measure how far two arrays are apart: ``abs(a - b)`` on arrays (np/numpy/torch ``.abs``) or a
    closeness test (``allclose``, ``isclose``, ``assert_allclose``, ``assert_close``) of NumPy or torch."""
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
            continue
        owner = _dotted(n.func.value).split(".")[0]
        if owner not in ("np", "numpy", "torch"):
            continue
        if n.func.attr == "abs" and n.args and isinstance(n.args[0], ast.BinOp) and isinstance(n.args[0].op, ast.Sub):
            out.append(n.lineno)
        elif n.func.attr in _CLOSENESS:
            out.append(n.lineno)
    return out


def test_one_difference_function():
    found = {m: lines for m, tree in _trees() if (lines := _differences(tree))}
    assert STATS in found, f"the scan no longer finds {STATS}'s difference"
    others = {m: lines for m, lines in found.items() if m != STATS and Path(m).name not in OTHER_DIFFERENCES}
    assert not others, (f"a second difference function: {others}; measure with porting.verify.stats.compare (or "
                        "name the module in OTHER_DIFFERENCES with the reason)")


def _tolerance_tables(tree: ast.AST) -> list[str]:
    """Module-level names bound to a literal tolerance: a name with TOLERANCE in it, or ending in _ATOL, _RTOL
    or _TOL (an alias of another module's value, ``LOSS_ATOL = LAYOUT_TOLERANCES[...]``, is not a table)."""
    out = []
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        value = getattr(n, "value", None)
        for t in targets:
            name = t.id if isinstance(t, ast.Name) else ""
            tolerance_like = "TOLERANCE" in name.upper() or name.upper().endswith(("_ATOL", "_RTOL", "_TOL"))
            if tolerance_like and value is not None and not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)):
                out.append(name)
    return out


def test_one_tolerance_table():
    found = {m: names for m, tree in _trees() if (names := _tolerance_tables(tree))}
    assert "TOLERANCES" in found.get(STATS, []), f"the scan no longer finds {STATS}'s TOLERANCES"
    others = {m: names for m, names in found.items() if m != STATS}
    assert not others, f"a second tolerance table: {others}; put it in {STATS}, beside the others, named for what it bounds"


def test_the_verification_scans_find_a_planted_second_one():
    planted = ast.parse("import numpy as np\nimport transformers\nPROBE_TOLERANCES = {'float32': 1e-4}\n"
                        "LOSS_ATOL = 1e-3\nALIAS_RTOL = TABLE['rtol']\n"
                        "m = transformers.AutoModelForCausalLM.from_pretrained('x', attn_implementation='sdpa')\n"
                        "d = np.abs(a - b).max()\nok = np.allclose(a, b)\n")
    assert _hf_model_loads(planted) == [6, 6]
    assert sorted(_differences(planted)) == [7, 8]
    assert _tolerance_tables(planted) == ["PROBE_TOLERANCES", "LOSS_ATOL"]


# --------------------------------------------------------------------------- the launch wing
# porting/launch/ starts, watches and stops processes, between the CLI and porting/train/: it imports the training
# library and the run directory (and the packages below porting/), nothing else of porting; what sits above it
# (`port diagnose`) is passed in. Nothing it imports imports it back.
LAUNCH_MAY_IMPORT = ("porting.launch", "porting.job", "porting.train", "porting.rundir", "porting.env",
                     "porting.model_paths")
BELOW_LAUNCH = ("porting.job", "porting.train", "porting.rundir", "porting.env", "porting.model_paths")
# The one owner of each job, and what finds a second one (an AST scan of porting/).
CHILD_ENV_OWNER = "porting/launch/children.py"      # child_env(): the only copy of os.environ for a child
TEARDOWN_OWNER = "porting/launch/children.py"       # signal_group()/stop_group(): the only os.killpg
OUTCOME_OWNER = "porting/launch/outcome.py"         # launch_outcome(): the only reader of a launch's end
RANKLOG_OWNER = "porting/rundir/ranklog.py"         # the rank log's lines, written and read
RANKLOG_WORDS = ("saving checkpoint", "run finished: every file", "non-finite steps in", " INFO step ",
                 " INFO checkpoint", r"\(pid (")


def test_the_launch_wing_imports_only_what_is_below_it():
    edges, _ = import_graph()
    assert any(m.startswith("porting.launch.") for m in edges), "porting/launch/ is gone: update these rules"
    up = sorted(f"{a} -> {b}" for a, bs in edges.items() if a.startswith("porting.launch") for b in bs
                if b.startswith("porting") and not b.startswith(LAUNCH_MAY_IMPORT))
    assert not up, f"porting/launch imports above it (pass the higher layer in instead, as supervise(diagnose=)): {up}"
    back = sorted(f"{a} -> {b}" for a, bs in edges.items() if a.startswith(BELOW_LAUNCH) for b in bs
                  if b.startswith("porting.launch"))
    assert not back, f"a package below porting/launch imports it: {back}"


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _calls(tree: ast.AST):
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


@functools.lru_cache(maxsize=1)
def _porting_trees() -> tuple[tuple[str, ast.AST], ...]:
    """(path, tree) of every module of porting/ (read once for the rules below)."""
    return tuple((_rel(p), ast.parse(p.read_text(encoding="utf-8"))) for p in _modules()
                 if p.relative_to(ROOT).parts[0] == "porting")


def test_one_builder_of_a_childs_environment():
    """dict(os.environ, ...), os.environ.copy() and {**os.environ} build a child's environment: only child_env."""
    found = []
    for rel, tree in _porting_trees():
        for n in ast.walk(tree):
            built = (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "dict" and n.args
                     and _is_os_environ(n.args[0])) or \
                    (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "copy"
                     and _is_os_environ(n.func.value)) or \
                    (isinstance(n, ast.Dict) and any(k is None and _is_os_environ(v) for k, v in zip(n.keys, n.values)))
            if built and rel != CHILD_ENV_OWNER:
                found.append(f"{rel}:{n.lineno}")
    assert not found, f"a second builder of a child's environment (use porting.launch.children.child_env): {found}"


def test_one_teardown_of_a_process_group():
    found = [f"{rel}:{c.lineno}" for rel, tree in _porting_trees() for c in _calls(tree)
             if (isinstance(c.func, ast.Attribute) and c.func.attr == "killpg"
                 or isinstance(c.func, ast.Name) and c.func.id == "killpg") and rel != TEARDOWN_OWNER]
    assert not found, f"a second process-group teardown (use porting.launch.children.stop_group): {found}"


def test_one_decision_on_a_launchs_end():
    """Whether a launch finished (every rank's last line) and why it stopped (the non-finite stop line) are read by
    launch_outcome alone, for the plain and the supervised launch."""
    readers = ("all_finished", "stop_line")
    found = [f"{rel}:{c.lineno}" for rel, tree in _porting_trees() for c in _calls(tree)
             if (getattr(c.func, "attr", None) in readers or getattr(c.func, "id", None) in readers)
             and rel not in (OUTCOME_OWNER, RANKLOG_OWNER)]
    assert not found, f"a second decision on how a launch ended (use porting.launch.outcome.launch_outcome): {found}"


def test_one_owner_of_the_rank_log():
    """The lines of logs/rank_<r>.log that other processes read are spelled in porting/rundir/ranklog.py only."""
    found = []
    for rel, tree in _porting_trees():
        if rel == RANKLOG_OWNER:
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                found += [f"{rel}:{n.lineno} {w!r}" for w in RANKLOG_WORDS if w in n.value]
    assert not found, f"rank-log lines spelled outside {RANKLOG_OWNER} (write and read them through it): {found}"


# --------------------------------------------------------------------------- typed recipes and plans
# A recipe or a plan travels between packages as its record (porting.train.recipe.schema.Recipe,
# porting.train.plan.make.TrainPlan, or what it really is: a BatchSchedule), never as Any or unannotated; the plan's
# parts are records too, not dicts read by string keys (issue 46).
TYPED_NAMES = ("recipe", "rec", "plan")


def _loose_parameters(source: str, where: str) -> list[str]:
    """Every parameter named in TYPED_NAMES without an annotation or annotated Any."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
                hint = ast.unparse(arg.annotation).strip("'\"") if arg.annotation else None
                if arg.arg in TYPED_NAMES and (hint is None or hint in ("Any", "typing.Any")) \
                        and not isinstance(node, ast.Lambda):
                    out.append(f"{where}:{node.lineno} {node.name}({arg.arg}: {hint})")
    return out


def _loose_hints(cls: type, seen: set[type]) -> list[str]:
    """Where the plan's record tree holds Any or a bare dict/list (a pydantic recipe section ends the walk)."""
    import dataclasses
    import typing

    out = []
    seen.add(cls)
    for name, hint in typing.get_type_hints(cls).items():
        todo = [hint]
        while todo:
            h = todo.pop()
            args = typing.get_args(h)
            if h is typing.Any or h in (dict, list) or (typing.get_origin(h) is dict and typing.Any in args):
                out.append(f"{cls.__name__}.{name}: {hint}")
                continue
            if dataclasses.is_dataclass(h) and h not in seen:
                out += _loose_hints(h, seen)
            todo += [a for a in args if a is not Ellipsis]
    return out


def test_recipes_and_plans_are_typed():
    bad = []
    for p in _modules():
        if _rel(p).startswith("porting/"):
            bad += _loose_parameters(p.read_text(encoding="utf-8"), _rel(p))
    assert not bad, f"recipe/rec/plan parameters untyped or typed Any (type them Recipe, TrainPlan, ...): {bad}"
    planted = "def f(recipe, plan: Any, rec: 'Any', *, recipe2, rec3: Recipe):\n    g = lambda rec: rec\n"
    assert [b.split(" ", 1)[1] for b in _loose_parameters(planted, "x.py")] == [
        "f(recipe: None)", "f(plan: Any)", "f(rec: Any)"]

    from porting.train.plan.make import TrainPlan

    loose = _loose_hints(TrainPlan, set())
    assert not loose, f"the plan holds untyped parts (make them records): {loose}"
    import dataclasses
    import typing

    inner = dataclasses.make_dataclass("Inner", [("terms", dict)])
    planted = dataclasses.make_dataclass("Planted", [("x", dict[str, typing.Any]), ("y", int), ("z", inner | None)])
    assert _loose_hints(planted, set()) == ["Planted.x: dict[str, typing.Any]", "Inner.terms: <class 'dict'>"]


# --------------------------------------------------------------------------- the seam from the command to a rank
SEAM = ("porting/job", "porting/launch", "porting/cli/train.py", "porting/cli/_hooks.py", "porting/launch/workers/train.py")
MAX_SEAM_PARAMETERS = 6


def _wide_signatures(paths: list[Path]) -> list[str]:
    """Functions with more than MAX_SEAM_PARAMETERS parameters (self/cls not counted); a click command (one parameter
    per option: the CLI's parse itself) and the other workers' internals (below the seam: msrun's side) excepted."""
    out = []
    for path in paths:
        if path.parent.name == "workers" and path.name != "train.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any("command" in ast.unparse(d) for d in node.decorator_list):
                continue
            a = node.args
            n = len([x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")])
            n += bool(a.vararg) + bool(a.kwarg)
            if n > MAX_SEAM_PARAMETERS:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                out.append(f"{where}:{node.lineno} {node.name} ({n})")
    return out


def test_no_signature_between_the_command_and_a_rank_takes_more_than_six_parameters(tmp_path):
    """Between `port train` and a rank the records travel (Job, Hooks, Launch, Supervised, Provenance), not long
    parameter lists (issue 46: start, run_supervised and supervise took 11, 12 and 14)."""
    paths = sorted({p for s in SEAM for p in ((ROOT / s).rglob("*.py") if (ROOT / s).is_dir() else [ROOT / s])})
    loop = ROOT / "porting" / "train" / "run" / "loop.py"
    train = next(n for n in ast.parse(loop.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "train")
    assert len(train.args.args) + len(train.args.kwonlyargs) <= MAX_SEAM_PARAMETERS, "the rank's train()"
    assert len(paths) > 10 and not _wide_signatures(paths), _wide_signatures(paths)
    planted = tmp_path / "planted_wide.py"
    planted.write_text("def start(a, b, c, d, e, f, g):\n    pass\n")
    assert _wide_signatures([planted]) == ["planted_wide.py:1 start (7)"]

