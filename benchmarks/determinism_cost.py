"""The cost of ``determinism: bitwise``: the same 2-worker msrun recipe with and without it, side by side.

Each round launches `port train` (a real msrun job of 2 CPU workers) once per mode, alternating the order so load
changes hit both: the real stories260K at its full 5 layers (``--layers 1``: its first layer only, the test's model),
``data.max_seq_length`` 64, one padded shape, ``--steps`` optimizer steps. Per launch: the steady step time (the
median of metrics.jsonl's steps after the first) and the launch's wall time. Per mode: whether its launches gave
bit-identical losses (metrics.jsonl) and final checkpoints (sha256 of every rank's file). The cost is the ratio of
the two modes' median (and best) steady step times.

    python benchmarks/determinism_cost.py                      # 3 rounds, 30 steps, 5 layers
    python benchmarks/determinism_cost.py --rounds 2 --layers 1 --json det.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("default", "bitwise")


def model(layers: int, work: Path) -> Path:
    """stories260K with its first ``layers`` layers (all 5: the model itself)."""
    from safetensors.numpy import load_file, save_file

    src = ROOT / "model_zoo" / "assets" / "stories260k"
    if layers >= 5:
        return src
    out = work / f"stories{layers}"
    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(cfg))
    keep = {k: v for k, v in load_file(str(src / "model.safetensors")).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    save_file(keep, str(out / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(src / name, out / name)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode: str, hf: Path, steps: int, run: Path) -> dict:
    """One `port train` of 2 msrun workers; its steady step time, wall time, losses and checkpoint digests."""
    sets = [f"model.source={hf}", "data.max_seq_length=64", "batching.bucketing.enabled=false",
            "checkpointing.export_hf=false", "checkpointing.every_steps=0", f"schedule.max_steps={steps}",
            "cluster.devices_per_node=2", f"cluster.master_port={free_port()}", f"determinism={mode}",
            "logging.progress=lines"]
    argv = [sys.executable, "-m", "porting", "train", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--run-dir", str(run)]
    for s in sets:
        argv += ["--set", s]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{mode}: port train failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps_ = [r for r in rows if "step" in r and r.get("event") != "summary"]
    ck = sorted((run / "checkpoints").glob("step_*/rank_*.safetensors"))
    return {"steady_step_s": statistics.median(r["step_time_s"] for r in steps_[1:]), "wall_s": round(wall, 2),
            "losses": [r["loss"] for r in steps_],
            "weights_sha256": [hashlib.sha256(f.read_bytes()).hexdigest() for f in ck]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res: dict[str, list[dict]] = {m: [] for m in MODES}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="port-det-") as tmp:
        work = Path(tmp)
        hf = model(a.layers, work)
        for i in range(a.rounds):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                res[mode].append(launch(mode, hf, a.steps, work / f"{mode}-{i}"))
                load.append(os.getloadavg()[0])
    out = {"cpu": _cpu(), "rounds": a.rounds, "steps": a.steps, "layers": a.layers, "load_1min": load}
    for m in MODES:
        runs = res[m]
        out[m] = {"steady_step_s": [r["steady_step_s"] for r in runs], "wall_s": [r["wall_s"] for r in runs],
                  "median_steady_step_s": statistics.median(r["steady_step_s"] for r in runs),
                  "best_steady_step_s": min(r["steady_step_s"] for r in runs),
                  "bit_identical_losses": all(r["losses"] == runs[0]["losses"] for r in runs),
                  "bit_identical_weights": all(r["weights_sha256"] == runs[0]["weights_sha256"] for r in runs),
                  "weights_sha256": runs[0]["weights_sha256"], "final_loss": runs[0]["losses"][-1]}
    for k in ("median", "best"):
        out[f"cost_ratio_{k}"] = out["bitwise"][f"{k}_steady_step_s"] / out["default"][f"{k}_steady_step_s"]
    out["same_bits_across_modes"] = res["default"][0]["losses"] == res["bitwise"][0]["losses"]
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


def _cpu() -> str:
    sys.path.insert(0, str(ROOT))
    from porting.env import cpu_model   # the one reader of /proc/cpuinfo's model name

    return cpu_model()


if __name__ == "__main__":
    main()
