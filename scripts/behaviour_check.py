"""Show that a reshaping changed nothing: the same plans, losses and checkpoint tensors before and after.

    python scripts/behaviour_check.py --base COMMIT            # this tree against COMMIT, both run here
    python scripts/behaviour_check.py --observe OUT.json       # one tree's observation (run by the above)

What is observed: the ``--dry-run`` plan of every recipe both trees ship (text and JSON) and one refused
plan, run in-process (no MindSpore start-up); and a short real run of ``recipes/tiny-cpu.yaml`` (four
optimizer steps, checkpoints at 2 and 4, one padded shape, the HF export on): its metrics without timings,
every checkpoint's ``state.json`` and the sha256 of every checkpoint and exported tensor.

Both trees run on THIS machine, one after the other, with the same interpreter, so the comparison is exact:
the arithmetic of a 2-layer CPU run is deterministic on one CPU, while its last bits depend on the kernels'
vector width (an AVX-512 and an AVX2 machine round ``grad_norm`` differently in the seventh digit). That is
why this is a tool run before and after a move, not a test with stored values: a value recorded on one machine
is not the expected value on another (the retired tests/train/test_behaviour_lock.py failed on every CPU but
the one that wrote it). Exit 0 when both observations are equal; otherwise the differing keys, exit 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Keys of a metrics record that measure time or the machine, not the arithmetic.
TIMING_KEYS = {"step_time_s", "tokens_per_s", "host_rss_gib", "compile_time_s", "precompile_s",
               "steady_tokens_per_s", "steady_step_time_s"}
# A plan that does not fit (13B without tensor parallel): the refusal and its text are behaviour too.
REFUSED = ("13b-32card.yaml", ["--set", "parallel.tensor_parallel=1"])
TINY_RUN = ["--set", "schedule.max_steps=4", "--set", "checkpointing.every_steps=2",
            "--set", "data.max_seq_length=64"]


def _normalise(text: str, root: Path) -> str:
    """The checkout's path varies; where a module sits inside ``porting/`` is not behaviour (a reshaping
    moves them), so the worker script reads <WORKER> and a module path in the text reads ``porting/NAME.py``."""
    text = re.sub(re.escape(str(root)) + r"/porting/(?:[\w/]*worker\.py|launch/workers/train\.py)", "<WORKER>", text)
    text = re.sub(r"porting/(?:[a-z_]+/)+([a-z_]+\.py)", r"porting/\1", text)
    return text.replace(str(root), "<ROOT>")


def _dry_run(root: Path, recipe: str, extra: list[str]) -> dict[str, Any]:
    from click.testing import CliRunner

    from porting.cli import main

    res = CliRunner().invoke(main, ["train", f"recipes/{recipe}", "--dry-run", *extra])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return {"exit_code": res.exit_code, "stdout": _normalise(res.stdout, root),
            "stderr": _normalise(res.stderr, root)}


def _tensor_digests(path: Path) -> dict[str, str]:
    """sha256 of each tensor's dtype, shape and bytes, by name (file metadata such as timestamps ignored)."""
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
    else:
        import mindspore as ms

        arrays = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}
    return {k: hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).hexdigest()
            for k, a in sorted(arrays.items())}


def _tiny_run(root: Path, run_dir: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(root), GLOG_v="3")
    p = subprocess.run([sys.executable, "-m", "porting", "train", "recipes/tiny-cpu.yaml", "--run-dir",
                        str(run_dir), *TINY_RUN], cwd=root, capture_output=True, text=True, timeout=900, env=env)
    if p.returncode != 0:
        sys.exit(f"error: the tiny run failed in {root}: {p.stderr[-2000:]}")
    metrics = [{k: v for k, v in sorted(json.loads(line).items()) if k not in TIMING_KEYS}
               for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tensors = {f.relative_to(run_dir).as_posix(): _tensor_digests(f)
               for f in sorted(run_dir.rglob("*")) if f.suffix in (".ckpt", ".safetensors")}
    states = {f.relative_to(run_dir).as_posix(): json.loads(f.read_text())
              for f in sorted((run_dir / "checkpoints").rglob("state.json"))}
    plan = json.loads((run_dir / "plan.json").read_text().replace(str(run_dir), "<RUN>"))
    return {"metrics": metrics, "tensors": tensors, "states": states,
            "plan": json.loads(_normalise(json.dumps(plan), root))}


def observe(root: Path, recipes: list[str]) -> dict[str, Any]:
    os.chdir(root)   # recipes name their data relative to themselves, runs/ relative to the cwd
    plans = {}
    for r in recipes:
        plans[f"{r} text"] = _dry_run(root, r, [])
        plans[f"{r} json"] = _dry_run(root, r, ["--json"])
    plans[f"{REFUSED[0]} {' '.join(REFUSED[1])} text"] = _dry_run(root, *REFUSED)
    with tempfile.TemporaryDirectory() as d:
        return {"plans": plans, "run": _tiny_run(root, Path(d) / "run")}


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}/{k}: only in {'base' if k in a else 'this tree'}" for k in sorted(a.keys() ^ b.keys())]
        for k in sorted(a.keys() & b.keys()):
            out += _differences(a[k], b[k], f"{where}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: base {str(a)[:200]!r} != this tree {str(b)[:200]!r}"]


def _observe_in(root: Path, recipes: list[str], out: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--observe", str(out), "--root", str(root),
                    "--recipes", ",".join(recipes)], check=True, env=env, cwd=root)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="the commit to compare this tree with")
    ap.add_argument("--observe", type=Path, help="write this tree's observation to a file")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--recipes", help="comma-separated recipe files (default: those both trees ship)")
    args = ap.parse_args()
    if args.observe:
        data = observe(args.root.resolve(), args.recipes.split(","))
        args.observe.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return 0
    if not args.base:
        ap.error("give --base COMMIT (or --observe OUT.json)")
    here = args.root.resolve()
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "base"
        subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            recipes = sorted({p.name for p in (here / "recipes").glob("*.yaml")}
                             & {p.name for p in (base / "recipes").glob("*.yaml")})
            before = _observe_in(base, recipes, Path(d) / "base.json")
            after = _observe_in(here, recipes, Path(d) / "here.json")
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(base)], check=False)
    diffs = _differences(before, after)
    print(f"{len(recipes)} recipes' plans, the refused plan, the tiny run's {len(after['run']['metrics'])} "
          f"metrics records and {sum(len(v) for v in after['run']['tensors'].values())} tensors compared: "
          + ("identical" if not diffs else f"{len(diffs)} differences"))
    for line in diffs[:50]:
        print("  " + line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
