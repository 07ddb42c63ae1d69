"""Memory-estimator check: `port train --dry-run`'s per-device estimate vs REAL peaks measured on an H200.

The measured side is porting/baseline/data/h200_*.json (HF transformers + torch, micro-batch 1,
seq 4096; see the README beside them). For each measured run the script builds the same settings as
a recipe (precision, recompute, micro 1, accumulation 1, one device) and asks
``porting.train.plan.estimate_memory``. Phases are composed from the estimator's components the way
the measurement defines them (grads are freed after each optimizer step, AdamW states persist):
  forward   = weights + optimizer_states + activations(used)
  backward  = weights + optimizer_states + gradients + activations(used)   (an upper bound)
  optimizer = weights + optimizer_states + gradients
and the estimate's total (which adds workspace and comm buffers) is set against the largest phase.
Attention is estimated as fused (cluster.device=ascend), as SDPA's flash kernel keeps no S^2 scores;
the 2 GiB Ascend workspace is shown apart, since torch's allocator peaks exclude any workspace.

The port keeps AdamW states in fp32 always; the bf16 H200 runs keep them in bf16 (torch's AdamW
follows the parameter dtype). The "like-for-like" columns replace the estimator's states by the
bf16 ones for those runs, so the remaining error is the estimator's model of the rest.

Usage: python benchmarks/baseline_estimator.py [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from porting.train.plan.memory import MemoryByPhase  # noqa: E402

DATA = ROOT / "porting" / "baseline" / "data"
FILES = {"bf16": DATA / "h200_hf_llama_baseline.json", "fp32-master": DATA / "h200_hf_llama_baseline_fp32master.json"}
# shape name in the H200 files -> zoo preset (parameter counts equal, checked below), or a config dict
TINY = dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, vocab_size=1024, max_position_embeddings=4096)
SHAPES = {"tiny": TINY, "tinyllama-1.1b": "tinyllama-1.1b", "llama-7b": "llama-7b", "llama2-13b": "llama2-13b"}
PRECISION = {"bf16": ("bfloat16", "bfloat16"), "fp32-master": ("float32", "bfloat16")}
GIB = float(1 << 30)


def config_for(shape: str):
    from model_zoo import presets
    from model_zoo.config import LlamaConfig

    spec = SHAPES[shape]
    return presets.config(spec) if isinstance(spec, str) else LlamaConfig.from_hf(spec)


def recipe_for(run: dict, variant: str):
    from porting.train.recipe.schema import validate_recipe

    param, compute = PRECISION[variant]
    raw = {"model": {"source": run["shape"]}, "data": {"path": "unused.jsonl", "max_seq_length": run["seq"]},
           "batching": {"micro_batch_size": run["micro_batch"], "grad_accum_steps": 1},
           "precision": {"param_dtype": param, "compute_dtype": compute},
           "memory": {"recompute": run["grad_checkpointing"]},
           "cluster": {"device": "ascend", "nodes": 1, "devices_per_node": 1, "device_hbm_gib": 141}}
    return validate_recipe(raw, "<h200 run>", check_files=False)


def phases(est: MemoryByPhase, recompute: bool, states: float) -> dict[str, float]:
    from porting.baseline.estimate import phase_estimate

    return phase_estimate(est, recompute, states)


def check() -> list[dict]:
    from porting.train.plan.memory import estimate_memory

    rows = []
    for variant, path in FILES.items():
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            if "error" in run:
                continue
            cfg = config_for(run["shape"])
            if cfg.num_parameters() != run["params"]:
                raise SystemExit(f"{path}: {run['shape']} has {run['params']} parameters, the config "
                                 f"{cfg.num_parameters()}: shapes differ")
            est = estimate_memory(cfg, recipe_for(run, variant))
            p = float(run["params"])
            torch_states = 2 * p * 2 / GIB if variant == "bf16" else est.optimizer_states
            measured = {ph: run[f"peak_{ph}_gib"] for ph in ("forward", "backward", "optimizer")}
            raw_ph = phases(est, run["grad_checkpointing"], est.optimizer_states)
            lfl_ph = phases(est, run["grad_checkpointing"], torch_states)
            m_max = max(measured.values())
            rows.append({
                "variant": variant, "shape": run["shape"], "seq": run["seq"], "recompute": run["grad_checkpointing"],
                "measured_gib": measured, "estimate_gib": {k: round(v, 3) for k, v in raw_ph.items()},
                "like_for_like_gib": {k: round(v, 3) for k, v in lfl_ph.items()},
                "ratio_estimate_over_measured": {k: round(raw_ph[k] / measured[k], 3) for k in measured},
                "ratio_like_for_like": {k: round(lfl_ph[k] / measured[k], 3) for k in measured},
                "estimate_total_gib": est.total, "workspace_gib": est.workspace,
                "measured_max_gib": m_max,
                "ratio_total_over_measured_max": round(est.total / m_max, 3),
                "ratio_like_for_like_max": round(max(lfl_ph.values()) / m_max, 3),
                "components_gib": dataclasses.asdict(est),
            })
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'variant':<11} {'shape':<15} {'rc':<3} {'phase':<9} {'measured':>9} {'estimate':>9} {'ratio':>6} "
            f"{'l-f-l':>8} {'ratio':>6}")
    out = [head, "-" * len(head)]
    for r in rows:
        for ph in ("forward", "backward", "optimizer"):
            out.append(f"{r['variant']:<11} {r['shape']:<15} {'yes' if r['recompute'] else 'no':<3} {ph:<9} "
                       f"{r['measured_gib'][ph]:>9.2f} {r['estimate_gib'][ph]:>9.2f} "
                       f"{r['ratio_estimate_over_measured'][ph]:>6.2f} {r['like_for_like_gib'][ph]:>8.2f} "
                       f"{r['ratio_like_for_like'][ph]:>6.2f}")
        out.append(f"{'':<11} {'':<15} {'':<3} {'TOTAL':<9} {r['measured_max_gib']:>9.2f} {r['estimate_total_gib']:>9.2f} "
                   f"{r['ratio_total_over_measured_max']:>6.2f}   (estimate total incl. {r['workspace_gib']:.2f} GiB workspace)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = check()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
