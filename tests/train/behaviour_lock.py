"""What `port train` does, observed so that a reshaping of ``porting/train/`` can be shown to change
nothing (issue 20): the ``--dry-run`` plan of every shipped recipe (text and JSON), one refused plan,
and a short real run of ``recipes/tiny-cpu.yaml`` (its metrics without timings and the sha256 of every
checkpoint and exported tensor).

Regenerate the stored values (only when a change of behaviour is intended, and say so in the commit):

    PYTHONPATH=. python -m tests.train.behaviour_lock --write
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ROOT / "tests" / "train" / "fixtures" / "behaviour_lock.json"
RECIPES = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml"))
# A plan that does not fit (13B without tensor parallel): the refusal and its text are behaviour too.
REFUSED = ("13b-32card.yaml", ["--set", "parallel.tensor_parallel=1"])
# Four optimizer steps, checkpoints at 2 and 4, one padded shape, the HF export on.
TINY_RUN = ["--set", "schedule.max_steps=4", "--set", "checkpointing.every_steps=2",
            "--set", "data.max_seq_length=64"]
# Keys of a metrics record that measure time or the machine, not the arithmetic.
TIMING_KEYS = {"step_time_s", "tokens_per_s", "host_rss_gib", "compile_time_s", "precompile_s", "steady_tokens_per_s",
               "steady_step_time_s"}


def _normalise(text: str) -> str:
    """The checkout's absolute path varies by machine; where a module sits inside ``porting/train/`` is
    not behaviour either (the reshaping moves them), so the worker script reads <WORKER> and a module
    named in the text reads ``porting/train/NAME.py``."""
    text = re.sub(re.escape(str(ROOT)) + r"/porting/train/(?:run/)?worker\.py", "<WORKER>", text)
    text = re.sub(r"porting/train/(?:recipe|data|plan|run)/", "porting/train/", text)   # modules named in the text
    return text.replace(str(ROOT), "<ROOT>")


def dry_run(recipe: str, extra: list[str]) -> dict[str, Any]:
    """``port train RECIPE --dry-run [extra]`` in this process (no MindSpore start-up): exit code, stdout,
    stderr, normalised."""
    from click.testing import CliRunner

    from porting.cli import main

    old = os.getcwd()
    os.chdir(ROOT)   # recipes name their data relative to themselves, runs/ relative to the cwd
    try:
        res = CliRunner().invoke(main, ["train", f"recipes/{recipe}", "--dry-run", *extra])
    finally:
        os.chdir(old)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return {"exit_code": res.exit_code, "stdout": _normalise(res.stdout), "stderr": _normalise(res.stderr)}


def plans() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in RECIPES:
        out[f"{r} text"] = dry_run(r, [])
        out[f"{r} json"] = dry_run(r, ["--json"])
    name, extra = REFUSED
    out[f"{name} {' '.join(extra)} text"] = dry_run(name, extra)
    return out


def _tensor_digests(path: Path) -> dict[str, str]:
    """sha256 of each tensor's dtype, shape and bytes, by name (file metadata such as timestamps ignored)."""
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
    else:
        import mindspore as ms   # deferred: only the run observation needs it

        arrays = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}
    return {k: hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).hexdigest()
            for k, a in sorted(arrays.items())}


def tiny_run(run_dir: Path) -> dict[str, Any]:
    """A real 4-step run of recipes/tiny-cpu.yaml in a subprocess (the CLI's own process, as users run it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    p = subprocess.run([sys.executable, "-m", "porting", "train", "recipes/tiny-cpu.yaml", "--run-dir",
                        str(run_dir), *TINY_RUN], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        metrics.append({k: v for k, v in sorted(rec.items()) if k not in TIMING_KEYS})
    tensors = {}
    for f in sorted(run_dir.rglob("*")):
        if f.suffix in (".ckpt", ".safetensors"):
            tensors[f.relative_to(run_dir).as_posix()] = _tensor_digests(f)
    states = {f.relative_to(run_dir).as_posix(): json.loads(f.read_text())
              for f in sorted((run_dir / "checkpoints").rglob("state.json"))}
    plan = json.loads((run_dir / "plan.json").read_text().replace(str(run_dir), "<RUN>"))
    return {"metrics": metrics, "tensors": tensors, "states": states, "plan": json.loads(_normalise(json.dumps(plan)))}


def main() -> None:
    import tempfile

    if "--write" not in sys.argv:
        sys.exit("usage: python -m tests.train.behaviour_lock --write")
    with tempfile.TemporaryDirectory() as d:
        data = {"plans": plans(), "run": tiny_run(Path(d) / "run")}
    EXPECTED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {EXPECTED}")


if __name__ == "__main__":
    main()
