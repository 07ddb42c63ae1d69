"""PyNative's gradient-bucket overlap against the step without it, side by side, DP 2 under msrun on this CPU
(issue 48).

Two msrun workers each build the same random-weight Llama, 2048 wide x 2 layers (intermediate 5632, 16 heads,
vocabulary 512: about 120 M parameters, the 2048-wide shape of benchmarks/pynative_pipeline.py), and port's own
one-graph step cell (porting/train/run/step/cells.py ``FusedTrainStep``) three times over the same parameters and
optimizer, in PyNative:

- ``overlapped``: the step `port train` runs in PyNative: each gradient bucket's AllReduce launched during the
  backward as its last gradient arrives (porting/train/run/step/buckets.py ``OverlappedGradBuckets``);
- ``after the backward``: the same buckets reduced once the backward has returned (``GradBuckets``, what graph mode
  and accumulation run);
- ``no collective`` (world size 1 in the cell: the same step without any gradient reduction), the compute alone,
  for scale.

The three are called in turn every round (so a change in the machine's load hits all of them), after one warm-up
round; each time is the step cell's call until its outputs are on the host. Rank 0 prints the medians and the
per-round times. MindSpore's default PyNative pipeline (asynchronous, ``MS_DEV_LAUNCH_BLOCKING`` unset), as a
user's run has it.

    python benchmarks/grad_overlap.py                      # 6 rounds, micro-batch 1 x 256 tokens, comm_fusion auto
    python benchmarks/grad_overlap.py --rounds 4 --seq 512 --fusion-mb 256
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
sys.path.insert(0, str(ROOT))

KINDS = ("overlapped", "after the backward", "no collective")
WORKER_ENV = "GRAD_OVERLAP_WORKER"   # a worker's settings, JSON: msrun reads every --option after the script as its own


def _cpu() -> str:
    sys.path.insert(0, str(ROOT))
    from porting.env import cpu_model   # the one reader of /proc/cpuinfo's model name

    return f"{cpu_model()}, {os.cpu_count()} logical cores"


def worker(args: argparse.Namespace) -> None:
    """One msrun worker: the three step cells, timed in turn."""
    import mindspore as ms
    import numpy as np
    from mindspore.communication import get_group_size, get_rank, init
    from mindspore.device_context.cpu.op_tuning import threads_num

    from model_zoo import LlamaConfig, build
    from porting.train.recipe.schema import CommFusionSection
    from porting.train.run.step import cells

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    threads_num(max(1, (os.cpu_count() or 1) // 2))   # as port train caps a CPU worker (run/step/runtime.py)
    init()
    rank, world = get_rank(), get_group_size()
    cfg = LlamaConfig(vocab_size=512, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=max(args.seq, 256))
    model = build(cfg, param_dtype="float32", compute_dtype="float32", seed=0)
    params = list(model.trainable_params())
    opt = cells.AdamW(params, (0.9, 0.95), 1e-8, 0.0)
    fusion = CommFusionSection(allreduce_mode="size", allreduce_config=args.fusion_mb) if args.fusion_mb \
        else CommFusionSection()
    steps = {"overlapped": cells.FusedTrainStep(model, opt, world, 1.0, comm_fusion=fusion, overlap=True),
             "after the backward": cells.FusedTrainStep(model, opt, world, 1.0, comm_fusion=fusion, overlap=False),
             "no collective": cells.FusedTrainStep(model, opt, 1, 1.0)}
    buckets = steps["overlapped"].reducer
    rng = np.random.default_rng(rank)
    ids = ms.Tensor(rng.integers(0, cfg.vocab_size, (1, args.seq)).astype(np.int32))
    f = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
    hyper = (f(1e-6), f(0.1), f(0.05))   # a tiny lr: the weights barely move between the timed calls
    scale = f(1.0 / (world * (args.seq - 1)))
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for rnd in range(args.rounds + 1):
        for kind in KINDS:
            t0 = time.perf_counter()
            out = steps[kind](ids, ids, scale, f(1.0), *hyper)
            [o.asnumpy() for o in out]
            if rnd:   # round 0 warms every path up
                times[kind].append(time.perf_counter() - t0)
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "times": times, "buckets": buckets.describe(), "launched_in_backward": buckets.launched_in_backward,
            "bucket_count": len(buckets.bucket_idx), "parameters": sum(int(p.size) for p in params)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--fusion-mb", type=float, default=0.0, help="comm_fusion size in 256 KiB units; 0: auto (64)")
    if os.environ.get(WORKER_ENV):
        worker(argparse.Namespace(**json.loads(os.environ[WORKER_ENV])))
        return
    args = ap.parse_args()
    from porting.cluster.preflight import free_port

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory(prefix="grad_overlap.") as tmp:
        out = Path(tmp) / "result.json"
        env = {k: v for k, v in os.environ.items() if k != "MS_DEV_LAUNCH_BLOCKING"}
        env.update(PYTHONPATH=str(ROOT), GLOG_v="3", **{WORKER_ENV: json.dumps(
            {"out": str(out), "rounds": args.rounds, "seq": args.seq, "fusion_mb": args.fusion_mb})})
        cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
               f"--log_dir={tmp}/logs", "--join=True", __file__]
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0 or not out.is_file():
            logs = "\n".join(f.read_text()[-2000:] for f in sorted(Path(tmp, "logs").glob("worker_*.log")))
            raise SystemExit(f"msrun failed ({p.returncode}):\n{logs}")
        doc = json.loads(out.read_text())
    print(f"CPU: {_cpu()}; load average at the start: {load}")
    print(f"DP 2 under msrun, PyNative, 2048 wide x 2 layers ({doc['parameters'] / 1e6:.0f} M parameters, fp32), "
          f"micro-batch 1 x {args.seq} tokens; {doc['buckets']}; buckets launched during the last overlapped "
          f"backward: {doc['launched_in_backward']} of {doc['bucket_count']}; {args.rounds} rounds")
    base = statistics.median(doc["times"]["after the backward"])
    print(f"{'step':22} {'median s':>9} {'vs after the backward':>22}  each round (s)")
    for kind in KINDS:
        t = doc["times"][kind]
        print(f"{kind:22} {statistics.median(t):9.2f} {statistics.median(t) / base:21.2f}x  "
              + ", ".join(f"{x:.2f}" for x in t))


if __name__ == "__main__":
    main()
