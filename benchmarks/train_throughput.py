"""Training throughput on this CPU, side by side in one run.

1. `port train`'s step (MindSpore graph mode, forward + backward + clip + AdamW in one graph) against
   HF transformers' LlamaForCausalLM with torch eager AdamW, same shapes, same threads, random weights:
   - hidden 256, 4 layers, 8 heads / 4 KV heads, vocab 1024, seq 256, batch 8;
   - the stories260K shape (hidden 64, 5 layers, 8/4 heads, vocab 512), seq 256, batch 8.
   Also the same MindSpore step built as two graphs (value_and_grad, then the optimizer), the way the
   accumulation path runs, to show why one graph is used when there is nothing to accumulate, and the
   one-graph step with the plain-op reference attention, RoPE and RMSNorm instead of port's C++ CPU kernels
   (before/after).
2. Effective tokens/s (real, non-padding tokens) of the real stories260K fine-tune on Alpaca with length
   bucketing against padding every row to max length (`port train`'s own loop, compile time apart).

    python benchmarks/train_throughput.py                 # everything (~6 min on 2 cores)
    python benchmarks/train_throughput.py --part step     # only 1
    python benchmarks/train_throughput.py --part profile  # attention's share of the step, per shape
    python benchmarks/train_throughput.py --part kernels  # port's attention per code path vs torch SDPA
    python benchmarks/train_throughput.py --part matmul   # the step's matmuls: MindSpore (oneDNN) vs torch (MKL)
    python benchmarks/train_throughput.py --part gemm     # GEMM share of each step, per library (gemm_share.py)
    python benchmarks/train_throughput.py --part bucketing --alpaca ../shared/data/instruct/alpaca_en_demo.json
    python benchmarks/train_throughput.py --part step --emulate native,avx2 --rounds 2   # this CPU and,
        # in the same run, an AVX2-only CPU emulated on it (benchmarks/cpu_isa.py)

Every result names the CPU (model, vector extensions) and the emulation it ran under. With --emulate
each round runs every emulation in a fresh process (the libraries read their ISA limits when loaded),
emulations alternating, so a burst of load from other jobs hits each alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import blas_linear, cpu_isa, gemm_share  # noqa: E402

SHAPES = {
    "h256-l4": dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512),
    "stories260k": dict(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=5,
                        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                        tie_word_embeddings=True),
}


def batch(cfg: dict, b: int, s: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, cfg["vocab_size"], size=(b, s), dtype=np.int64).astype(np.int32)
    return ids, ids.copy()


def time_steps(fn, warmup: int, steps: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, times


REFERENCE = {"attention": "reference", "rope": "reference", "rmsnorm": "reference"}  # plain ops, no C++ kernels


def ms_step(cfg_d: dict, b: int, s: int, fused: bool, warmup: int, steps: int, override: dict | None = None,
            blas: bool = False) -> dict:
    """``override``: kernel choices for model_zoo.build; None = auto (port's C++ CPU attention and RMSNorm);
    ``blas``: every x @ W^T through numpy's OpenBLAS (benchmarks/blas_linear.py) instead of oneDNN."""
    step, model = make_ms_step(cfg_d, b, s, fused, override, blas)
    first, times = time_steps(step, warmup, steps)
    return {"first_steps_s": round(first, 3), "times": times,
            "kernels": {c.kernel: c.impl for c in model.plan.choices()}}


def make_ms_step(cfg_d: dict, b: int, s: int, fused: bool = True, override: dict | None = None, blas: bool = False):
    """(one call of `port train`'s step on random weights, the model)."""
    import mindspore as ms
    from mindspore import ParameterTuple

    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build
    from porting.train.run.step import cells as train_step

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    cfg = LlamaConfig(model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0, **cfg_d)
    model = build(cfg, seed=0, kernels_override=override)
    if blas:
        blas_linear.patch(model)
    params = list(model.trainable_params())
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.0)
    ids, labels = batch(cfg_d, b, s)
    x, y = ms.Tensor(ids), ms.Tensor(labels)
    f = lambda v: ms.Tensor(np.float32(v))  # noqa: E731
    count = float((labels[:, 1:] != -100).sum())
    if fused:
        cell = train_step.FusedTrainStep(model, opt, 1, 1.0)

        def step():
            out = cell(x, y, f(1 / count), f(1.0), f(1e-4), f(0.1), f(0.05))
            return float(out[0].asnumpy())
    else:
        bufs = train_step.accumulation_buffers(ParameterTuple(params))
        grad = train_step.AccumGradStep(model, opt.params, bufs)
        apply = train_step.ApplyStep(opt, bufs, 1, 1.0)

        def step():
            tot, cnt = grad(x, y, f(1 / count))
            out = apply(tot, cnt, f(1.0), f(1e-4), f(0.1), f(0.05))
            return float(out[0].asnumpy())
    return step, model


def torch_step(cfg_d: dict, b: int, s: int, warmup: int, steps: int, args_attn: str = "sdpa") -> dict:
    import torch

    first, times = time_steps(make_torch_step(cfg_d, b, s, args_attn), warmup, steps)
    return {"first_steps_s": round(first, 3), "times": times, "torch_threads": torch.get_num_threads(),
            "attn_implementation": args_attn}


def make_torch_step(cfg_d: dict, b: int, s: int, args_attn: str = "sdpa"):
    """One call of HF LlamaForCausalLM's step with torch eager AdamW, on random weights."""
    import torch
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = HFConfig(**cfg_d, rms_norm_eps=1e-5, rope_theta=10000.0, attn_implementation=args_attn)
    model = LlamaForCausalLM(cfg).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ids, labels = batch(cfg_d, b, s)
    x, y = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(labels.astype(np.int64))
    count = float((labels[:, 1:] != -100).sum())

    def step():
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), y[:, 1:].flatten(),
                                                 ignore_index=-100, reduction="sum") / count
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def _merge(runs: list[dict], tokens: int) -> dict:
    """Rounds of one variant: median and best (min) step time over all timed steps of all rounds.
    Other jobs share this machine's cores, so the min is reported next to the median."""
    times = [t for r in runs for t in r.pop("times")]
    med, best = statistics.median(times), min(times)
    out = dict(runs[0])
    out.update(step_s=round(med, 4), best_step_s=round(best, 4), tokens_per_s=round(tokens / med, 1),
               best_tokens_per_s=round(tokens / best, 1), rounds=len(runs), timed_steps=len(times))
    return out


VARIANTS = ("torch", "one", "two", "one_ref", "one_blas")


def step_raw(args) -> dict[str, dict[str, list[dict]]]:
    """Timed runs of every variant per shape, ``args.rounds`` interleaved rounds (a burst of load hits
    every variant alike)."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if "one_blas" in args.variants:  # forward and backward against torch first (SystemExit beyond 1e-4)
        print(json.dumps({"openblas_linear_vs_torch_max_rel": blas_linear.check()}), flush=True)
    raw: dict[str, dict[str, list[dict]]] = {}
    for name, cfg in SHAPES.items():
        runs = raw.setdefault(name, {k: [] for k in args.variants})
        for _ in range(args.rounds):
            for key in args.variants:
                if key == "torch":
                    runs[key].append(torch_step(cfg, args.batch, args.seq, args.warmup, args.steps, args.torch_attn))
                else:
                    runs[key].append(ms_step(cfg, args.batch, args.seq, key != "two", args.warmup, args.steps,
                                             REFERENCE if key == "one_ref" else None, key == "one_blas"))
    return raw


def step_rows(raw: dict, args, env: dict) -> list[dict]:
    """One row per shape from the timed runs (median and best over all their steps)."""
    rows = []
    tok = args.batch * args.seq
    names = {"torch": "torch_eager_adamw", "one": "port_train_one_graph", "two": "port_train_two_graphs",
             "one_ref": "port_train_one_graph_reference_kernels", "one_blas": "port_train_one_graph_openblas"}
    for name, runs in raw.items():
        m = {k: _merge(v, tok) for k, v in runs.items() if v}
        row = {"shape": name, "batch": args.batch, "seq": args.seq, **env, **{names[k]: v for k, v in m.items()}}
        if "torch" in m:
            for k, label in (("one", "one_graph"), ("two", "two_graphs"), ("one_ref", "reference_kernels"),
                             ("one_blas", "openblas")):
                if k in m:
                    row[f"ratio_{label}_vs_torch"] = round(m[k]["tokens_per_s"] / m["torch"]["tokens_per_s"], 3)
                    row[f"ratio_{label}_vs_torch_best"] = round(m[k]["best_tokens_per_s"]
                                                                / m["torch"]["best_tokens_per_s"], 3)
        for k in ("two", "one_blas"):  # one graph on oneDNN against the same as two graphs / on OpenBLAS
            if "one" in m and k in m:
                row[f"ratio_one_vs_{k}"] = round(m["one"]["tokens_per_s"] / m[k]["tokens_per_s"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def profile_raw(args) -> dict[str, dict[str, list[dict]]]:
    """Attention's share of the MindSpore step, per shape: the step with port's C++ CPU attention, with
    the reference attention (S^2 float32 scores, causal mask, softmax, repeated K/V), and with attention
    swapped for an identity, interleaved; RMSNorm on the CPU kernel throughout. A diagnosis only; the
    numbers of that last model are meaningless."""
    import model_zoo.llama as zoo_llama

    real = zoo_llama.reference_attention
    raw: dict[str, dict[str, list[dict]]] = {}
    for name, cfg in SHAPES.items():
        runs = raw.setdefault(name, {"cpu": [], "reference": [], "none": []})
        for _ in range(args.rounds):
            zoo_llama.reference_attention = real
            for key in ("cpu", "reference"):
                runs[key].append(ms_step(cfg, args.batch, args.seq, True, args.warmup, args.steps, {"attention": key}))
            zoo_llama.reference_attention = lambda q, k, v, scale, n_rep, q_offset: q
            runs["none"].append(ms_step(cfg, args.batch, args.seq, True, args.warmup, args.steps,
                                        {"attention": "reference"}))
        zoo_llama.reference_attention = real
    return raw


def profile_rows(raw: dict, args, env: dict) -> list[dict]:
    rows = []
    tok = args.batch * args.seq
    for name, runs in raw.items():
        m = {k: _merge(v, tok) for k, v in runs.items()}
        row = {"profile": name, **env, **{f"{k}_step_s": v["step_s"] for k, v in m.items()},
               **{f"{k}_best_s": v["best_step_s"] for k, v in m.items()}}
        for k in ("cpu", "reference"):
            row[f"attention_share_{k}_median"] = round(1 - m["none"]["step_s"] / m[k]["step_s"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# The h256-l4 step's matmuls, forward: (rows = batch x seq, in, out) -> how many per step (4 layers:
# q and o, k and v, gate and up, down; the LM head once). The backward runs each twice more.
GEMMS = {(256, 256): 8, (256, 128): 8, (256, 688): 8, (688, 256): 4, (256, 1024): 1}


def matmul_raw(args) -> dict[str, dict[str, list[dict]]]:
    """The step's forward matmuls, one op each: MindSpore's (oneDNN, or nnacl for small ones; what its
    Dense runs) against torch's F.linear (MKL), interleaved; the step's total weighted by count."""
    import mindspore as ms
    import torch

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    torch.set_num_threads(os.cpu_count() or 1)
    mm = ms.ops.MatMul(transpose_b=True)
    rng = np.random.default_rng(0)
    raw: dict[str, dict[str, list[dict]]] = {}
    for (k, n), count in GEMMS.items():
        x = rng.standard_normal((args.batch * args.seq, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        mx, mw, tx, tw = ms.Tensor(x), ms.Tensor(w), torch.from_numpy(x), torch.from_numpy(w)
        fns = {"mindspore": lambda: mm(mx, mw).asnumpy(), "torch": lambda: torch.nn.functional.linear(tx, tw).numpy()}
        runs = raw.setdefault(f"{args.batch * args.seq}x{k}->{n} (x{count})", {key: [] for key in fns})
        for _ in range(args.rounds):
            for key, fn in fns.items():
                runs[key].append({"times": time_steps(fn, args.warmup, args.steps)[1]})
    return raw


def matmul_rows(raw: dict, args, env: dict) -> list[dict]:
    rows, total = [], {"mindspore": 0.0, "torch": 0.0}
    for name, runs in raw.items():
        count = int(name.rsplit("(x", 1)[1].rstrip(")"))
        med = {key: statistics.median(t for r in v for t in r["times"]) for key, v in runs.items()}
        for key in total:
            total[key] += count * med[key]
        rows.append({"matmul": name, **{f"{key}_ms": round(1e3 * v, 3) for key, v in med.items()},
                     "torch_over_mindspore": round(med["torch"] / med["mindspore"], 3)})
    rows.append({"matmul": "forward matmuls of one h256-l4 step", "emulation": env.get("emulation"),
                 **{f"{key}_ms": round(1e3 * v, 2) for key, v in total.items()},
                 "torch_over_mindspore": round(total["torch"] / total["mindspore"], 3)})
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


PARTS = {"step": (step_raw, step_rows), "profile": (profile_raw, profile_rows), "matmul": (matmul_raw, matmul_rows),
         "gemm": (lambda args: gemm_share.gemm_raw(args, SHAPES, make_torch_step, make_ms_step), gemm_share.gemm_rows)}


def run_part(part: str, args) -> list[dict]:
    """``part`` in this process (its environment as it is), or with --emulate once per round per
    emulation in a child process, emulations alternating; rows per emulation."""
    raw_fn, rows_fn = PARTS[part]
    if not args.emulate:
        return rows_fn(raw_fn(args), args, cpu_isa.describe(None))
    merged: dict[str, dict] = {}
    for _ in range(args.rounds):
        for emu in args.emulate:
            got = cpu_isa.run_child(Path(__file__), part, emu, args)
            for shape, runs in got["raw"].items():
                for key, value in runs.items():
                    merged.setdefault(emu, {}).setdefault(shape, {}).setdefault(key, []).extend(value)
            merged[emu]["__info__"] = got["info"]
    rows = []
    for emu in args.emulate:
        info = merged[emu].pop("__info__")
        rows += rows_fn(merged[emu], args, info)
    return rows


def part_kernels(args) -> list[dict]:
    """port's C++ attention, forward + backward, per code path this CPU runs, against torch's SDPA in the
    same process, at each shape's attention (batch x heads x seq x head_dim); rounds interleaved."""
    import mindspore as ms
    import torch

    from model_zoo import cpu_kernels
    from model_zoo.cpu_cells import CpuCausalAttention

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    for name, cfg in SHAPES.items():
        n, g = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        d = cfg["hidden_size"] // n
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((args.batch, h, args.seq, d)).astype(np.float32) for h in (n, g, g))
        tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))

        def torch_fb():
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True).sum().backward()

        fns = {"torch_sdpa": torch_fb}
        for isa in cpu_kernels.supported_isas():
            grad = ms.value_and_grad(lambda a, b, c, cell=CpuCausalAttention(isa): cell(a, b, c).sum(), (0, 1, 2))
            fns[f"port_{isa}"] = lambda f=grad, t=(ms.Tensor(q), ms.Tensor(k), ms.Tensor(v)): f(*t)[0].asnumpy()
        times: dict[str, list[float]] = {key: [] for key in fns}
        for _ in range(args.rounds):
            for key, fn in fns.items():
                times[key] += time_steps(fn, args.warmup, args.steps)[1]
        row = {"kernels": name, "attention": f"{args.batch}x{n}/{g}x{args.seq}x{d}", "cpu": cpu_kernels.cpu_model(),
               **{f"{k}_fwd_bwd_ms": round(1e3 * statistics.median(t), 2) for k, t in times.items()},
               **{f"{k}_best_ms": round(1e3 * min(t), 2) for k, t in times.items()}}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def part_bucketing(args) -> list[dict]:
    import tempfile

    from porting.train.run.loop import train
    from porting.train.recipe.schema import load_recipe

    rows = []
    common = [f"data.path={args.alpaca}", "data.format=alpaca", "data.long_text=truncate",
              f"data.max_seq_length={args.alpaca_seq}", "batching.micro_batch_size=4",
              f"schedule.max_steps={args.alpaca_steps}", "checkpointing.every_steps=0",
              "checkpointing.export_hf=false", "batching.bucketing.max_shapes=8"]
    for mode in ("true", "false"):
        with tempfile.TemporaryDirectory() as d:
            train(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", common + [f"batching.bucketing.enabled={mode}"]),
                  d, echo=False)
            recs = [json.loads(l) for l in (Path(d) / "metrics.jsonl").read_text().splitlines()]
        summ = recs[-1]
        steady = [r for r in recs[:-1] if not r["compile"]]
        real = sum(r["tokens"] for r in steady)
        padded = sum(r["padded_tokens"] for r in steady)
        secs = sum(r["step_time_s"] for r in steady)
        row = {"bucketing": mode == "true", "steps": summ["steps"], "shapes": summ["shapes_seen"],
               "compiled_graphs": summ["compiled_graphs"], "compile_time_s": summ["compile_time_s"],
               "effective_tokens_per_s": round(real / secs, 1), "padded_tokens_per_s": round(padded / secs, 1),
               "padding_fraction": summ["padding_fraction"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    rows.append({"effective_speedup_bucketing": round(rows[0]["effective_tokens_per_s"] / rows[1]["effective_tokens_per_s"], 3)})
    print(json.dumps(rows[-1]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", type=lambda v: v.split(","), default=["all"],
                    help="comma-separated, of all,step,profile,matmul,gemm,kernels,bucketing")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", type=lambda v: v.split(","), default=list(VARIANTS),
                    help=f"step variants, comma-separated, of {','.join(VARIANTS)} (one = port train's step, "
                         "two = the same as two graphs, one_ref = one graph on plain-op kernels, one_blas = one "
                         "graph with its matmuls on numpy's OpenBLAS, benchmarks/blas_linear.py)")
    ap.add_argument("--emulate", type=lambda v: v.split(","), default=[],
                    help=f"run step/profile under these CPU emulations, comma-separated, of "
                         f"{','.join(cpu_isa.EMULATIONS)} (native = this CPU as it is), each in a child process")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-attn", default="sdpa", choices=["sdpa", "eager"],
                    help="HF attention implementation of the torch reference (sdpa is its fastest on CPU)")
    ap.add_argument("--alpaca", default=str(ROOT.parent / "shared" / "data" / "instruct" / "alpaca_en_demo.json"))
    ap.add_argument("--alpaca-seq", type=int, default=512)
    ap.add_argument("--alpaca-steps", type=int, default=60)
    args = ap.parse_args()
    bad = sorted(set(args.part) - {"all", "step", "profile", "matmul", "gemm", "kernels", "bucketing"})
    bad += sorted(set(args.variants) - set(VARIANTS)) + sorted(set(args.emulate) - set(cpu_isa.EMULATIONS))
    if bad:
        ap.error(f"unknown variant or emulation {bad}")
    if args.child:  # one round of one part under the emulation set up by the parent
        if len(args.part) != 1 or args.part[0] not in PARTS:
            ap.error(f"--child runs one of {list(PARTS)}")
        print(cpu_isa.CHILD_TAG + json.dumps(cpu_isa.child_result(PARTS[args.part[0]][0](args))), flush=True)
        return
    print(json.dumps({"cpu": cpu_isa.cpu_summary(), "loadavg_start": os.getloadavg()}), flush=True)
    if {"all", "step"} & set(args.part):
        run_part("step", args)
    if {"all", "profile"} & set(args.part):
        run_part("profile", args)
    if {"all", "matmul"} & set(args.part):
        run_part("matmul", args)
    if {"all", "gemm"} & set(args.part):
        run_part("gemm", args)
    if {"all", "kernels"} & set(args.part):
        part_kernels(args)
    if {"all", "bucketing"} & set(args.part):
        part_bucketing(args)
    print(json.dumps({"loadavg_end": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
