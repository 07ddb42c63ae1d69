"""The memory plan's per-phase figures against measured memory of the same graphs on this CPU, at two
model widths.

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
(``porting/train/plan/memory_terms.py`` RESIDENT, the workspace among them). Three cases: the
forward/backward at 16 tokens a row (the parameter-sized terms), at 256 (the activations too), and the
update.

Found (BENCHMARKS.md): the parameter-sized terms and the update agree; the activations do not on the
CPU: the plan's per-token formula counts the tensors a fused-kernel graph keeps (checked against H200
measurements, tests/train/test_plan.py), and MindSpore's CPU reference graph (unfused RMSNorm, RoPE,
softmax, SiLU, through the CPU memory pool) holds about 3 times that per token.

    python benchmarks/plan_memory_cpu.py          # ~1 min on 2 cores
    python benchmarks/plan_memory_cpu.py --json out.json
    python benchmarks/plan_memory_cpu.py --widths 1024,5120 --layers 1 --cases fb16,apply   # a 13B layer
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
MICRO, LAYERS, VOCAB = 2, 2, 4096
# (phase, sequence length): the forward/backward at 16 tokens a row (the parameter-sized terms:
# gradients, their cast into the buffers) and at 256 (the activations too), the update (no tokens)
CASES = (("forward_backward", 16), ("forward_backward", 256), ("apply", 256))
MIB = float(1 << 20)


def config(width: int, seq: int):
    from model_zoo.config import LlamaConfig

    if width == 5120:   # Llama-2-13B's own layer (its config.json: intermediate 13824, 40 heads of 128)
        return LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=13824, num_hidden_layers=LAYERS,
                           num_attention_heads=40, max_position_embeddings=seq)
    return LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=width * 8 // 3 // 64 * 64,
                       num_hidden_layers=LAYERS, num_attention_heads=width // 64, max_position_embeddings=seq)


def recipe(seq: int):
    from porting.train.recipe.schema import validate_recipe

    return validate_recipe({"model": {"source": "measured"}, "data": {"path": "x.jsonl", "max_seq_length": seq},
                            "batching": {"micro_batch_size": MICRO, "grad_accum_steps": 2},
                            "cluster": {"device": "cpu"}}, check_files=False)


def planned_mib(width: int, seq: int) -> dict[str, float]:
    """The plan's figure of each phase above the resident terms (weights, buffers, states...), in MiB."""
    from porting.train.plan.memory import estimate_memory
    from porting.train.plan.memory_terms import RESIDENT

    m = estimate_memory(config(width, seq), recipe(seq))
    resident = sum(m.term(k) for k in RESIDENT)
    return {"forward_backward": (m.peak_forward_backward - resident) * 1024,
            "apply": (m.peak_apply - resident) * 1024}


def proc_status() -> dict[str, int]:
    """This process's resident (VmRSS) and peak resident (VmHWM) bytes, from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def measure_here(width: int, phase: str, seq: int) -> float:
    """In this process: build, reset the peak, run one call of the phase's graph; MiB above the resident."""
    import numpy as np
    import mindspore as ms
    from mindspore import ParameterTuple, Tensor

    from model_zoo.llama import build
    from porting.train.run.step import cells as train_step

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    cfg = config(width, seq)
    # the reference kernels: the plan's CPU activations are the reference attention's (S^2 scores kept)
    model = build(cfg, kernels_override={k: "reference" for k in ("attention", "rmsnorm", "rope", "swiglu")},
                  device="CPU")
    params = list(model.trainable_params())
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.0)
    buffers = train_step.accumulation_buffers(ParameterTuple(params))
    f32 = lambda x: Tensor(np.float32(x))  # noqa: E731
    ids = Tensor(np.random.default_rng(0).integers(0, VOCAB, (MICRO, seq)).astype(np.int32))
    if phase == "forward_backward":
        cell = train_step.AccumGradStep(model, opt.params, buffers)
        run = lambda: cell(ids, ids, f32(1e-3))  # noqa: E731
    else:
        cell = train_step.ApplyStep(opt, buffers, 1, 1.0)
        run = lambda: cell(f32(1.0), f32(1.0), f32(1.0), f32(1e-3), f32(0.1), f32(0.05))  # noqa: E731
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # reset VmHWM to the current RSS
    before = proc_status()["VmRSS"]
    out = run()
    out[0].asnumpy()
    return (proc_status()["VmHWM"] - before) / MIB


def measure(width: int, phase: str, seq: int, timeout_s: float = 1800.0) -> float:
    """:func:`measure_here` in a fresh process (this file run with --one WIDTH PHASE SEQ)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--layers", str(LAYERS), "--one", str(width),
                           phase, str(seq)],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {phase} at width {width} failed: {proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def compare_case(phase: str, seq: int) -> dict:
    """Measured and planned MiB of one phase at both widths, and planned / measured of the difference."""
    measured = [measure(w, phase, seq) for w in WIDTHS]
    planned = [planned_mib(w, seq)[phase] for w in WIDTHS]
    return {"phase": phase, "seq": seq, "widths": list(WIDTHS), "measured_mib": [round(m, 1) for m in measured],
            "planned_mib": [round(p, 1) for p in planned],
            "ratio_planned_over_measured": round((planned[1] - planned[0]) / (measured[1] - measured[0]), 3)}


def main() -> int:
    global WIDTHS, LAYERS, CASES   # the run's choices, read by the measuring child (--layers) and compare_case
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", nargs=3, metavar=("WIDTH", "PHASE", "SEQ"), help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="two hidden sizes (5120: Llama-2-13B's layer)")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--cases", default="fb16,fb256,apply", help="of fb16, fb256, apply")
    args = ap.parse_args()
    WIDTHS, LAYERS = tuple(int(w) for w in args.widths.split(",")), args.layers
    named = {"fb16": ("forward_backward", 16), "fb256": ("forward_backward", 256), "apply": ("apply", 256)}
    CASES = tuple(named[c] for c in args.cases.split(","))
    if args.one:
        print(f"{measure_here(int(args.one[0]), args.one[1], int(args.one[2])):.3f}")
        return 0
    rows = [compare_case(phase, seq) for phase, seq in CASES]
    for r in rows:
        print(f"{r['phase']:<17} seq {r['seq']:>3}, widths {r['widths']}: measured {r['measured_mib']} MiB, planned "
              f"{r['planned_mib']} MiB; width-dependent planned/measured {r['ratio_planned_over_measured']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
