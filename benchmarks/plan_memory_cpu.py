"""The memory plan's per-phase figures against measured memory of the same graphs on this CPU, at two
model widths (issue 22 part 2).

What is measured: MindSpore's own device-memory statistics read 0 on the CPU backend
(``mindspore.runtime.max_memory_allocated`` counts the Ascend/GPU device pools only), so the CPU
measurement is the process's peak resident memory, ``VmHWM`` in ``/proc/self/status``, reset before the
phase by writing 5 to ``/proc/self/clear_refs`` (Linux, proc(5)). Each phase runs in its own process
(the CPU memory pool keeps what an earlier graph freed, so a second phase in the same process would
reuse it and read low): build the model, AdamW and the float32 accumulation buffers, reset the peak,
then run ONE call of the graph: ``AccumGradStep`` (forward and backward of one micro-batch, gradients
added into the buffers) or ``ApplyStep`` (identity copy, unscale, global norm, clip, AdamW), the cells
``porting/train/run/loop.py`` uses with ``grad_accum_steps > 1``. The phase's figure is the peak above
the resident memory just before the call.

That first call also compiles the graph, whose host memory does not depend on the tensor sizes; so the
comparison is of the width-dependent part: (measured at width 2 - measured at width 1) against (plan at
width 2 - plan at width 1), where the plan's phase figure is its peak less the resident terms
(``porting/train/plan/memory_terms.py`` RESIDENT) and the workspace.

    python benchmarks/plan_memory_cpu.py          # ~1 min on 2 cores
    python benchmarks/plan_memory_cpu.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (512, 1024)
SEQ, MICRO, LAYERS, VOCAB = 256, 2, 2, 4096
PHASES = ("forward_backward", "apply")
MIB = float(1 << 20)


def config(width: int):
    from model_zoo.config import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=width * 8 // 3 // 64 * 64,
                       num_hidden_layers=LAYERS, num_attention_heads=width // 64, max_position_embeddings=SEQ)


def recipe():
    from porting.train.recipe.schema import validate_recipe

    return validate_recipe({"model": {"source": "measured"}, "data": {"path": "x.jsonl", "max_seq_length": SEQ},
                            "batching": {"micro_batch_size": MICRO, "grad_accum_steps": 2},
                            "cluster": {"device": "cpu"}}, check_files=False)


def planned_mib(width: int) -> dict[str, float]:
    """The plan's width-dependent bytes of each phase: its peak less the resident terms, in MiB."""
    from porting.train.plan.memory import estimate_memory
    from porting.train.plan.memory_terms import RESIDENT

    m = estimate_memory(config(width), recipe())
    resident = sum(m[k] for k in RESIDENT)
    return {"forward_backward": (m["peak_forward_backward"] - resident) * 1024,
            "apply": (m["peak_apply"] - resident) * 1024}


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def measure_here(width: int, phase: str) -> float:
    """In this process: build, reset the peak, run one call of the phase's graph; MiB above the resident."""
    import numpy as np
    import mindspore as ms
    from mindspore import ParameterTuple, Tensor

    from model_zoo.llama import build
    from porting.train.run import step as train_step

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    cfg = config(width)
    # the reference kernels: the plan's CPU activations are the reference attention's (S^2 scores kept)
    model = build(cfg, kernels_override={k: "reference" for k in ("attention", "rmsnorm", "rope", "swiglu")},
                  device="CPU")
    params = list(model.trainable_params())
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.0)
    buffers = train_step.accumulation_buffers(ParameterTuple(params))
    f32 = lambda x: Tensor(np.float32(x))  # noqa: E731
    ids = Tensor(np.random.default_rng(0).integers(0, VOCAB, (MICRO, SEQ)).astype(np.int32))
    if phase == "forward_backward":
        cell = train_step.AccumGradStep(model, opt.params, buffers)
        run = lambda: cell(ids, ids, f32(1e-3))  # noqa: E731
    else:
        cell = train_step.ApplyStep(opt, buffers, 1, 1.0)
        run = lambda: cell(f32(1.0), f32(1.0), f32(1.0), f32(1e-3), f32(0.1), f32(0.05))  # noqa: E731
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # reset VmHWM to the current RSS
    before = _status()["VmRSS"]
    out = run()
    out[0].asnumpy()
    return (_status()["VmHWM"] - before) / MIB


def measure(width: int, phase: str, timeout_s: float = 300.0) -> float:
    """:func:`measure_here` in a fresh process (this file run with --one WIDTH PHASE)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", str(width), phase],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {phase} at width {width} failed: {proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def compare() -> dict:
    """Measured and planned MiB per phase and width, and the ratio of their width-dependent parts."""
    rows = {}
    for phase in PHASES:
        measured = [measure(w, phase) for w in WIDTHS]
        planned = [planned_mib(w)[phase] for w in WIDTHS]
        rows[phase] = {"widths": list(WIDTHS), "measured_mib": [round(m, 1) for m in measured],
                       "planned_mib": [round(p, 1) for p in planned],
                       "ratio_planned_over_measured": round((planned[1] - planned[0]) / (measured[1] - measured[0]), 3)}
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", nargs=2, metavar=("WIDTH", "PHASE"), help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.one:
        print(f"{measure_here(int(args.one[0]), args.one[1]):.3f}")
        return 0
    rows = compare()
    for phase, r in rows.items():
        print(f"{phase:<17} widths {r['widths']}: measured {r['measured_mib']} MiB, planned {r['planned_mib']} MiB; "
              f"width-dependent planned/measured {r['ratio_planned_over_measured']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
