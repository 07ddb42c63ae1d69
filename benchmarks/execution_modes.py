"""Graph mode vs PyNative (recipe key ``execution``), side by side in one run, through `port train`'s own loop.

The real stories260K fine-tune of recipes/tiny-cpu.yaml at one padded shape (no bucketing), once with the
whole step in one graph per cell (``execution: graph``) and once op by op (``execution: pynative``), for
each step layout: one micro-batch per step (FusedTrainStep) and 2 accumulated micro-batches
(AccumGradStep + ApplyStep). Rounds alternate the modes so load changes hit both; each run's steady
step time is the median of its steps after the first (the compile), from metrics.jsonl. The final
losses of the two modes are printed beside the times (they must agree: tests/train/test_execution.py).

    python benchmarks/execution_modes.py                   # 2 rounds, 12 steps, micro-batch 8 x 256 tokens
    python benchmarks/execution_modes.py --rounds 1 --steps 6 --json modes.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {"one micro-batch of 8": ["batching.micro_batch_size=8", "batching.grad_accum_steps=1"],
           "2 x 4 accumulated": ["batching.micro_batch_size=4", "batching.grad_accum_steps=2"]}


def run_once(mode: str, layout: list[str], steps: int, seq: int, work: Path) -> dict:
    """One `port train` run in this process; its steady step time and compile time from metrics.jsonl."""
    from porting.rundir import read_metrics
    from porting.train import train
    from porting.train import load_recipe

    sets = layout + [f"execution={mode}", f"schedule.max_steps={steps}", "schedule.warmup_steps=0",
                     f"data.max_seq_length={seq}", "batching.bucketing.enabled=false", "checkpointing.every_steps=0",
                     "checkpointing.export_hf=false", "logging.progress=lines"]
    run = Path(tempfile.mkdtemp(dir=work, prefix=f"{mode}-"))
    train(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", sets), run, echo=False)
    recs = read_metrics(run / "metrics.jsonl").steps
    times = [r.step_time_s for r in recs]
    return {"first_step_s": times[0], "steady_step_s": statistics.median(times[1:]), "best_step_s": min(times[1:]),
            "tokens_per_step": recs[-1].tokens, "final_loss": recs[-1].loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    import mindspore

    load = [os.getloadavg()[0]]
    results: dict[str, dict[str, list[dict]]] = {k: {"graph": [], "pynative": []} for k in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="port-modes-") as tmp:
        for _ in range(a.rounds):
            for name, layout in LAYOUTS.items():
                for mode in ("graph", "pynative"):
                    results[name][mode].append(run_once(mode, layout, a.steps, a.seq, Path(tmp)))
            load.append(os.getloadavg()[0])
    print(f"MindSpore {mindspore.__version__}, {a.rounds} round(s) x {a.steps} steps, seq {a.seq}; "
          f"load average {min(load):.1f} -> {max(load):.1f}")
    print("| step layout | graph step (median / best) | PyNative step (median / best) | PyNative / graph | "
          "graph first step (compile) | PyNative first step | final loss graph / PyNative |")
    print("|---|---|---|---|---|---|---|")
    for name, by in results.items():
        g, p = (min(by[m], key=lambda r: r["steady_step_s"]) for m in ("graph", "pynative"))
        print(f"| {name} | {g['steady_step_s']:.3f} / {g['best_step_s']:.3f} s | {p['steady_step_s']:.3f} / "
              f"{p['best_step_s']:.3f} s | **{p['steady_step_s'] / g['steady_step_s']:.2f}x** | "
              f"{g['first_step_s']:.2f} s | {p['first_step_s']:.2f} s | {g['final_loss']:.6f} / {p['final_loss']:.6f} |")
    if a.json:
        a.json.write_text(json.dumps({"mindspore": mindspore.__version__, "load": load, "results": results}, indent=1))


if __name__ == "__main__":
    main()
