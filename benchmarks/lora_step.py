"""A LoRA step against the full fine-tuning step of the same model and batch, side by side on this CPU, and the
LoRA run's planned memory against the measured one at two widths.

Step time: the graph `port train` runs with one micro-batch per step (``FusedTrainStep``: forward, backward, clip
and AdamW in one graph; reference kernels), on a Llama of hidden 2048 (intermediate 5632, 16 heads, vocab 32000,
``--layers`` decoder layers), micro-batch 1 x ``--seq`` tokens, float32. The full step differentiates and updates
every weight; the LoRA step (r 8 on every linear layer, model_zoo/lora.py) only the adapters: the frozen weights'
gradients are never asked for, so the graph holds no ``dW`` matmul for them. Each kind runs in its own process
(warm-up steps, then ``--steps`` timed), alternated ``--rounds`` times; the medians are reported.

Memory: the peak resident memory of a process that builds the model (LoRA attached), its optimizer and step graph
and runs two steps, above the resident memory after MindSpore's import (``VmHWM`` reset through
``/proc/self/clear_refs``, as benchmarks/plan_memory_cpu.py measures), against the plan's total for the same recipe
(porting/train/plan/memory.py, the frozen base weights only, the adapters' gradients, fp32 AdamW states), at
two widths; the full fine-tune beside it for scale.

    python benchmarks/lora_step.py                       # ~5 min on 2 cores
    python benchmarks/lora_step.py --json out.json --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB, HEADS_DIM = 32000, 128
MIB = float(1 << 20)


def config(width: int, layers: int, seq: int):
    from model_zoo.config import LlamaConfig

    inter = 5632 if width == 2048 else width * 11 // 4 // 64 * 64
    return LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=width // HEADS_DIM, max_position_embeddings=max(seq, 256),
                       tie_word_embeddings=False)


def recipe(seq: int, lora: bool):
    from porting.train.recipe.schema import validate_recipe

    raw = {"model": {"source": "measured"}, "data": {"path": "x.jsonl", "max_seq_length": seq},
           "batching": {"micro_batch_size": 1, "grad_accum_steps": 1}, "cluster": {"device": "cpu"}}
    if lora:
        raw["lora"] = {"r": 8, "alpha": 16, "target_modules": "all-linear"}
    return validate_recipe(raw, check_files=False)


def _rss() -> dict[str, int]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.plan_memory_cpu import proc_status   # one reader of /proc/self/status's VmRSS and VmHWM

    return proc_status()


def run_here(kind: str, width: int, layers: int, seq: int, steps: int) -> dict:
    """In this process: build, compile and run ``steps`` steps; seconds per step and the peak memory in MiB."""
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor

    from converters import lora_names
    from model_zoo import lora
    from model_zoo.llama import build
    from model_zoo.lora_spec import LoraSpec, draw_initial
    from porting.train.run.step import cells

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _rss()["VmRSS"]
    cfg = config(width, layers, seq)
    model = build(cfg, kernels_override={k: "reference" for k in ("attention", "rmsnorm", "rope", "swiglu")},
                  device="CPU")
    if kind == "lora":
        t = lora_names.resolve(cfg, "all-linear")
        lora.apply_lora(model, LoraSpec(8, 16.0), t.adapted.values())
        shapes = {p.name: tuple(p.shape) for p in model.get_parameters() if ".lora_" in p.name}
        lora.set_values(model, draw_initial(shapes, 0))
    params = list(model.trainable_params())
    opt = cells.AdamW(params, (0.9, 0.95), 1e-8, 0.0)
    step = cells.FusedTrainStep(model, opt, 1, 1.0)
    f32 = lambda x: Tensor(np.float32(x))  # noqa: E731
    ids = Tensor(np.random.default_rng(0).integers(0, VOCAB, (1, seq)).astype(np.int32))
    args = (ids, ids, f32(1.0 / seq), f32(1.0), f32(1e-4), f32(0.1), f32(0.05))
    for _ in range(2):   # compile, then one warm step
        step(*args)[0].asnumpy()
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step(*args)[0].asnumpy()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = (_rss()["VmHWM"] - before) / MIB
    return {"step_s": statistics.median(times), "cpu_s": statistics.median(cpu), "peak_mib": peak,
            "trainable": sum(int(p.size) for p in params)}


def run(kind: str, width: int, layers: int, seq: int, steps: int) -> dict:
    """:func:`run_here` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", kind, str(width), str(layers),
                           str(seq), str(steps)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} at width {width} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def planned_mib(kind: str, width: int, layers: int, seq: int) -> float:
    from porting.train.plan.memory import estimate_memory

    return estimate_memory(config(width, layers, seq), recipe(seq, kind == "lora")).total * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--widths", default="1024,2048", help="the two widths of the memory comparison")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--memory-only", action="store_true", help="skip the step-time comparison")
    args = ap.parse_args()
    if args.one:
        kind, width, layers, seq, steps = args.one
        print(json.dumps(run_here(kind, int(width), int(layers), int(seq), int(steps))))
        return 0
    out: dict = {"step": None, "memory": []}
    timed: dict[str, list[dict]] = {"full": [], "lora": []}
    for _ in range(0 if args.memory_only else args.rounds):
        for kind in ("full", "lora"):
            timed[kind].append(run(kind, 2048, args.layers, args.seq, args.steps))
    if not args.memory_only:
        med = {(k, m): statistics.median(r[m] for r in timed[k]) for k in timed for m in ("step_s", "cpu_s")}
        out["step"] = {"width": 2048, "layers": args.layers, "seq": args.seq, "rounds": timed,
                       "ratio_wall": round(med["lora", "step_s"] / med["full", "step_s"], 3),
                       "ratio_cpu": round(med["lora", "cpu_s"] / med["full", "cpu_s"], 3)}
        print(f"step at hidden 2048, {args.layers} layers, seq {args.seq} (medians of {args.rounds} rounds x "
              f"{args.steps} steps): full {med['full', 'step_s']:.3f} s ({med['full', 'cpu_s']:.2f} CPU-s), LoRA "
              f"{med['lora', 'step_s']:.3f} s ({med['lora', 'cpu_s']:.2f} CPU-s); LoRA / full {out['step']['ratio_wall']} "
              f"wall, {out['step']['ratio_cpu']} CPU")
    for width in (int(w) for w in args.widths.split(",")):
        for kind in ("lora", "full"):
            m = run(kind, width, args.layers, 16, 1)["peak_mib"]
            p = planned_mib(kind, width, args.layers, 16)
            out["memory"].append({"kind": kind, "width": width, "measured_mib": round(m, 1),
                                  "planned_mib": round(p, 1), "planned_over_measured": round(p / m, 3)})
            print(f"{kind:<4} width {width}: measured {m:.0f} MiB, planned {p:.0f} MiB, planned / measured {p / m:.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
