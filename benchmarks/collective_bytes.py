"""Collective bytes per optimizer step per rank of the shipped 910C plans, side by side:
plain data parallel, the earlier sharding (gradients all-reduced, then every parameter all-reduced
in fp32 as ``param x mask``), the CPU emulation (AllReduce + slice, AllGather) and the Ascend path
(ReduceScatter + AllGather). The numbers are the plan's (porting/train/plan/sharding.py), from the model
shapes; no device is needed.

    python benchmarks/collective_bytes.py            # markdown table (BENCHMARKS.md)
    python benchmarks/collective_bytes.py --json
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPES = ("7b-8card", "7b-a2-8dev", "13b-32card")


def rows() -> list[dict]:
    from porting.train.plan import sharding
    from porting.train.plan.make import plan_config
    from porting.train.recipe.schema import load_recipe

    out = []
    for name in RECIPES:
        recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml", check_files=False)
        cfg, _ = plan_config(recipe)
        choice = sharding.choose(recipe, cfg)
        plain = dataclasses.replace(choice, enabled=False, stage=0, reduce_scatter="")
        variants = {
            "data parallel, no sharding": sharding.collectives(recipe, cfg, plain),
            "before: sharded, param x mask all-reduce": sharding.collectives(recipe, cfg, choice, legacy_mask=True),
            # the CPU gathers by AllReduce where the data-parallel group is a sub-group (tensor parallel)
            "CPU emulation: AllReduce + slice, AllGather (AllReduce with TP)": sharding.collectives(
                recipe, cfg, dataclasses.replace(choice, reduce_scatter=sharding.EMULATED, all_gather=(
                    sharding.GATHER_EMULATED if recipe.parallel.tensor_parallel > 1 else sharding.GATHER_NATIVE))),
            "after: Ascend ReduceScatter + AllGather": sharding.collectives(
                recipe, cfg, dataclasses.replace(choice, reduce_scatter=sharding.NATIVE)),
        }
        for label, cols in variants.items():
            s = sharding.bytes_summary(cols)
            out.append({"recipe": name, "layout": f"TP {recipe.parallel.tensor_parallel} x DP "
                        f"{recipe.data_parallel_size}, accum {recipe.batching.grad_accum_steps}, ZeRO-{choice.stage}",
                        "variant": label, "ops": sum(c.count for c in cols if c.group == "dp"),
                        "dp_payload_gib": round(sum(c.payload_bytes for c in cols if c.group == "dp") / 2**30, 2),
                        "dp_wire_gib": round(s.dp_wire_bytes / 2**30, 2),
                        "tp_wire_gib": round(s.tp_wire_bytes / 2**30, 2)})
    return out


def main() -> None:
    data = rows()
    if "--json" in sys.argv:
        print(json.dumps(data, indent=2))
        return
    print("| recipe | layout | variant | data-parallel ops | DP payload GiB | DP wire GiB | TP wire GiB |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in data:
        print(f"| {r['recipe']} | {r['layout']} | {r['variant']} | {r['ops']} | {r['dp_payload_gib']} | "
              f"{r['dp_wire_gib']} | {r['tp_wire_gib']} |")


if __name__ == "__main__":
    main()
