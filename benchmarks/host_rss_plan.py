"""Peak host RSS of a real one-device `port train` worker against the dry run's host plan, at two widths.

For each model (random-weight Llama, fp32, stories260K's tokenizer): the dry run's ``host_memory``
(porting/train/plan/host_memory.py: worker figure and its terms), then a real `port train` of 2 steps
with a final checkpoint, its peak RSS read by ``/usr/bin/time -f %M`` (the whole process: on one device the
worker is the `port train` process itself). What must hold: measured within 20% of the plan.

    python benchmarks/host_rss_plan.py                 # 2048 x 2 layers and 4096 x 1 layer, ~5 min
    python benchmarks/host_rss_plan.py --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {
    "2048 x 2 layers": dict(vocab_size=4096, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                            num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False),
    "4096 x 1 layer": dict(vocab_size=4096, hidden_size=4096, intermediate_size=11008, num_hidden_layers=1,
                           num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False),
}
SETS = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
        "checkpointing.every_steps=0", "schedule.max_steps=2", "schedule.warmup_steps=0"]


def port(*args: str, timed: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "porting", *args]
    if timed:
        cmd = ["/usr/bin/time", "-f", "PEAK_RSS_KIB %M", *cmd]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3"))
    if p.returncode != 0:
        raise SystemExit(f"port {' '.join(args[:2])} failed:\n{p.stderr[-3000:]}")
    return p


def measure(name: str, work: Path) -> dict:
    from benchmarks.checkpoint_scale import MODELS as M, model_dir

    M[name] = MODELS[name]
    mdir = model_dir(name, work)
    recipe = str(ROOT / "recipes" / "tiny-cpu.yaml")
    sets = [a for s in SETS + [f"model.source={mdir}"] for a in ("--set", s)]
    from porting.train.plan.make import TrainPlan

    hm = TrainPlan.from_dict(json.loads(port("train", recipe, *sets, "--dry-run", "--json").stdout)).host_memory
    run = port("train", recipe, *sets, "--run-dir", str(work / f"run-{len(list(work.iterdir()))}"), timed=True)
    peak = int(run.stderr.rsplit("PEAK_RSS_KIB", 1)[1].split()[0]) * 1024 / 2**30
    return {"model": name, "plan_worker_gib": hm.worker_gib, "measured_peak_gib": round(peak, 3),
            "error": round(hm.worker_gib / peak - 1, 3), "terms_gib": dataclasses.asdict(hm.terms_gib)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="one model name")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="host-rss-"))
    rows = []
    try:
        for name in MODELS if args.only is None else [args.only]:
            rows.append(measure(name, work))
            r = rows[-1]
            print(f"{r['model']:16} plan {r['plan_worker_gib']:6.2f} GiB  measured {r['measured_peak_gib']:6.2f} GiB  "
                  f"plan/measured - 1 = {r['error']:+.1%}  terms {r['terms_gib']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
