"""The fingerprints' share of each step, timed inside one real `port train` (``logging.fingerprint_every: 1``): a
load-robust companion to benchmarks/fingerprint_cost.py, whose side-by-side wall-time ratios swing with a shared
machine's load (at load 4-10 its every-10 setting, which does no fingerprint work on 9 steps in 10, read 1.78x).

The child process wraps the recorder's methods (porting/train/run/fingerprint.py: ``begin``, ``gradients``,
``end`` and the forward hooks' ``rows_stat``) with ``time.perf_counter`` and adds up, per step, the seconds spent in
them; the step's own ``step_time_s`` (metrics.jsonl) holds them. The cost ratio of a step is then
step / (step - fingerprints), both measured in that one step, so a load burst inflates both. Same model and data as
benchmarks/fingerprint_cost.py (2048 wide x 2 layers, micro-batch 4 x 64 tokens, PyNative, 1 device).

    python benchmarks/fingerprint_instep.py --steps 12
    python benchmarks/fingerprint_instep.py --steps 12 --against /tmp/port-old   # another checkout, same model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(out: str, argv: list[str]) -> None:
    """Runs `port train` in this process with the recorder's methods timed; writes each step's seconds."""
    from porting.rundir import fingerprints as fp
    from porting.train.run import fingerprint as rec
    from porting.cli import main

    state = {"t": 0.0, "depth": 0, "steps": []}

    def timed(obj, name: str, closes_step: bool = False) -> None:
        fn = getattr(obj, name)

        def run(*a, **k):
            state["depth"] += 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                state["depth"] -= 1
                if state["depth"] == 0:   # nested calls (begin's batch rows_stat) are counted once
                    state["t"] += time.perf_counter() - t
                if closes_step:
                    state["steps"].append(state["t"])
                    state["t"] = 0.0
        setattr(obj, name, run)

    timed(rec.Fingerprinter, "begin")
    timed(rec.Fingerprinter, "gradients")
    timed(rec.Fingerprinter, "end", closes_step=True)
    timed(fp, "rows_stat")
    sys.argv = ["port", *argv]
    try:
        main()
    finally:
        Path(out).write_text(json.dumps(state["steps"]))


def measure(hf: Path, steps: int, work: Path, code: Path | None) -> dict:
    run, times = work / "run", work / "fp.json"
    sets = [f"model.source={hf}", "data.max_seq_length=64", "batching.bucketing.enabled=false",
            "checkpointing.export_hf=false", "checkpointing.every_steps=0", f"schedule.max_steps={steps}",
            "execution=pynative", "logging.fingerprint_every=1", f"output_dir={run}"]
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", str(times), "train",
            str(ROOT / "recipes" / "tiny-cpu.yaml")] + [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "GLOG_v": "3"}
    if code is not None:
        env["PYTHONPATH"] = str(code)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env, cwd=code or ROOT)
    if p.returncode:
        raise SystemExit(f"port train failed ({p.returncode}):\n{p.stderr[-3000:]}")
    fpt = json.loads(times.read_text())[1:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    st = [r["step_time_s"] for r in rows if "step" in r and r.get("event") != "summary"][1:]
    ratios = [s / (s - f) for s, f in zip(st, fpt)]
    return {"fingerprint_s_median": statistics.median(fpt), "step_s_median": statistics.median(st),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--against", type=Path, default=None, help="another checkout of port, measured after this one")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fingerprint_cost import _cpu, model_dir

    out = {"cpu": _cpu(), "steps": a.steps, "load_1min": [os.getloadavg()[0]]}
    with tempfile.TemporaryDirectory(prefix="port-fpinstep-") as tmp:
        hf = model_dir(Path(tmp))
        for tag, code in [("this", None)] + ([("against", a.against)] if a.against else []):
            (Path(tmp) / tag).mkdir()
            out[tag] = measure(hf, a.steps, Path(tmp) / tag, code)
            out["load_1min"].append(os.getloadavg()[0])
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
