"""The plan beside published throughput of the same models at the same sequence length: a comparison,
not a tuning target.

For each published configuration: the figure, its source and layout as published, port's plan for the nearest
recipe it can express (`port train --dry-run`'s roofline: 100% of the device's peak FLOP/s for compute, 100% of
HBM bandwidth for the optimizer, 100% of the link for every collective, nothing overlapped), and MFU of the
published figure by the plan's formula (6 N + 12 L H Q T per token, porting/train/plan/calibrated.py), beside the
MFU the source itself states where it states one. GPU configurations have no port plan (it plans 910B/910C);
their rows check the MFU formula against the source's own.

    python benchmarks/published_plan.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_zoo import presets  # noqa: E402
from porting.train import load_recipe, make_plan, plan_config  # noqa: E402
from porting.train.plan.calibrated import flops_per_token  # noqa: E402

A2 = str(ROOT / "recipes" / "7b-a2-8dev.yaml")
# 910B figures for an A2 server (third-party; issue 35's roofline table): 328 TFLOPS BF16, 149 GB/s in-server
B_PEAK, B_LINK = 328e12, 149e9

ROWS = [
    # (what, source, layout as published, model, seq, tokens/s/device, peak, stated MFU, port --set overrides or None)
    ("MindSpore Transformers Llama-2-7B, 8 x 910B (Atlas 800T A2), bf16",
     "mindspore-ai/docs mindformers/docs/source_zh_cn/start/models.md (r2.4.0): 4160 tokens/s/p, config "
     "mindformers configs/llama2/pretrain_llama2_7b_bf16.yaml",
     "DP 8, MP 1, PP 1, micro 1 x accumulation 8, optimizer parallel, no recompute, flash attention, graph O1",
     "llama2-7b", 4096, 4160, B_PEAK, None,
     ["batching.grad_accum_steps=8", "memory.recompute=false"]),
    ("MindSpeed-LLM LLaMA2-7B, 1 x 8 Atlas 900 A2 PODc",
     "Ascend/MindSpeed-LLM README.md (commit 01546f7, 1.0.RC3): 4672 tokens/p/s (Mcore, 4K); the issue quotes "
     "4,733 from another version; features README: MFU 69.0% for this model and cluster",
     "not in the README (the 7B script was not found); planned here as DP 8, micro 1 x 8, like MindFormers'",
     "llama2-7b", 4096, 4672, B_PEAK, 0.690, ["batching.grad_accum_steps=8", "memory.recompute=false"]),
    ("MindSpeed-LLM LLaMA2-13B, 1 x 8 Atlas 900 A2 PODc",
     "Ascend/MindSpeed-LLM README.md (commit 01546f7): 2016 tokens/p/s; layout from "
     "examples/mcore/llama2/pretrain_llama2_13b_ptd.sh",
     "TP 8, PP 1, sequence parallel, micro 4, global batch 512 (port has no sequence parallel)",
     "llama2-13b", 4096, 2016, B_PEAK, 0.647,
     ["model.source=llama2-13b", "parallel.tensor_parallel=8", "batching.micro_batch_size=4",
      "batching.grad_accum_steps=128", "memory.recompute=false", "parallel.optimizer_sharding=false"]),
    ("torchtitan Llama-2-13B, 64 x A100 80GB", "pytorch/torchtitan docs/performance.md, Llama 2 table",
     "FSDP2, local batch 2, seq 4096, no activation checkpointing", "llama2-13b", 4096, 2162, 312e12, 0.611, None),
    ("torchtitan Llama-3.1-8B, 8 x H100 (96 GB, 500 W)", "pytorch/torchtitan docs/performance.md, Table 1",
     "FSDP, local batch 2 (global 16), selective AC, seq 8192 (llama3_8b.toml)", "llama3.1-8b", 8192, 5762, 989e12,
     None, None),
    ("HF transformers Llama-7B, 1 x H200 (this project)", "../shared/data/baselines/h200_hf_llama_baseline.json",
     "one device, micro 1, seq 4096, bf16 params and fused AdamW, SDPA, no checkpointing", "llama2-7b", 4096,
     9810.8, 989e12, 0.465, None),
]


def plan_row(overrides: list[str]) -> dict:
    rec = load_recipe(A2, overrides, check_files=False)
    cfg = plan_config(rec)[0]
    p = make_plan(rec, cfg, "/tmp/port-published-plan")
    e, links, tput = p.estimated_step, p.links, p.throughput
    assert e is not None and links is not None and tput is not None, "an Ascend plan has its roofline estimate"
    seq_tokens = rec.global_batch_size * rec.data.max_seq_length / rec.world_size
    # the same roofline at the 910B's figures: compute x 390/328, in-server collectives x 200/149
    b_step = e.compute_s * 390e12 / B_PEAK + e.memory_s + e.comm_s * links.tp_bytes_per_s / B_LINK
    return {"fits": p.fits, "total_gib": p.memory_gib_by_phase.total, "step_s": e.step_s,
            "tps": tput.tokens_per_s_per_device, "tps_910b": seq_tokens / b_step}


def main() -> None:
    print("| published | tokens/s/device | MFU by 6N+12LHQT (source's) | port plan, roofline at peak | "
          "published / plan | layout |")
    print("|---|---|---|---|---|---|")
    for what, src, layout, model, seq, tps, peak, mfu, sets in ROWS:
        f = flops_per_token(presets.config(model), seq)
        ours = f"{tps * f / peak:.1%} of {peak / 1e12:g} TFLOP/s" + (f" ({mfu:.1%})" if mfu else "")
        if sets is None:
            plan, ratio = "no plan (a GPU)", "-"
        else:
            r = plan_row(sets)
            fit = "" if r["fits"] else f", does not fit port's memory plan ({r['total_gib']:.0f} GiB)"
            plan = (f"{r['step_s']:.2f} s/step, {r['tps']:,.0f} tok/s/device at 910C figures; "
                    f"{r['tps_910b']:,.0f} at 910B figures{fit}")
            ratio = f"{tps / r['tps_910b']:.0%} (of 910B plan)"
        print(f"| {what}: {src} | {tps:,} | {ours} | {plan} | {ratio} | {layout} |")


if __name__ == "__main__":
    main()
