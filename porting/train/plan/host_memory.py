"""Predicted peak host RAM of one `port train` worker and of one node, for the dry run.

What a worker holds in host memory besides its device (an estimate, each term from the code path):

- ``base``: the process with MindSpore, CANN and the data plan loaded (HOST_BASE_GIB, an estimate:
  ``benchmarks/checkpoint_scale.py`` measures the import baseline on the CPU);
- ``device_state`` (CPU runs only): on the CPU backend the "device" memory (weights, gradients,
  optimizer states, activations: porting/train/plan/memory.py) is host memory;
- the largest transient of the start-up and checkpoint paths, which run one after another:
  HF load (converters/loading.py) reads one tensor at a time, widened to fp32, and slices it for the
  rank: the largest HF tensor in bf16 + fp32 + its fp32 slice; ZeRO start-up (porting/train/run/zero.py
  ``_own_numpy``) builds this rank's range of one bucket at a time from one fp32 parameter copy;
  a save (porting/train/run/ckpt_shards.py) copies one parameter to fp32 and slices it; a resume
  (porting/train/run/ckpt_read.py) holds one bucket's shard (ZeRO) or one parameter (replicated) and the
  piece being read.

The node total is the worker's peak times the workers per node (``cluster.devices_per_node``): all
workers start and save at the same time. A plan whose node total exceeds ``cluster.host_memory_gib``
is refused with what to change.
"""

from __future__ import annotations

from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from porting.train.plan.comm import parameter_numels
from porting.train.plan.sharding import flat_buckets
from porting.train.recipe.schema import Recipe

HOST_BASE_GIB = 3.0
GIB = float(1 << 30)


def _largest_param(cfg: LlamaConfig, tp: int) -> tuple[int, int]:
    """(elements of the largest full parameter, of the largest TP-local one)."""
    return max(parameter_numels(cfg, 1)), max(parameter_numels(cfg, tp))


def host_memory(recipe: Recipe, cfg: LlamaConfig, device_total_gib: float) -> dict:
    """Per-worker peak and per-node total in GiB, with the terms and the formula."""
    tp = recipe.parallel.tensor_parallel
    dp = recipe.data_parallel_size
    zero = recipe.parallel.optimizer_sharding and dp > 1
    full, local = _largest_param(cfg, tp)
    bucket = 0.0
    if zero:   # the largest bucket's shard (porting/train/plan/sharding.py flat_buckets, as zero.py forms them)
        numels = parameter_numels(cfg, tp)
        bucket = max(b.shard(dp) for b in flat_buckets(numels, 4, recipe.parallel.comm_fusion, dp))
    load = full * (2 + 4) + local * 4                   # bf16 read, fp32 widened, fp32 slice
    zero_start = 4 * bucket + 4 * local                 # one bucket's range, one fp32 parameter copy
    save = 2 * 4 * local                                # fp32 copy of a parameter and its piece
    resume = 4 * bucket + 2 * 4 * local                 # one bucket's shard (ZeRO), one parameter and its piece
    transient = max(load, zero_start, save, resume) / GIB
    device = device_total_gib if recipe.cluster.device == "cpu" else 0.0
    worker = HOST_BASE_GIB + device + transient
    node = worker * recipe.cluster.devices_per_node
    return {"worker_gib": round(worker, 3), "node_gib": round(node, 3),
            "terms_gib": {"base": HOST_BASE_GIB, "device_state": round(device, 3),
                          "largest_transient": round(transient, 3)},
            "transients_gib": {k: round(v / GIB, 3) for k, v in
                               (("hf_load", load), ("zero_start", zero_start), ("save", save), ("resume", resume))},
            "limit_gib": recipe.cluster.host_memory_gib,
            "formula": f"worker = {HOST_BASE_GIB} GiB base + device state (CPU only) + the largest transient of "
                       "HF load, ZeRO start-up, save and resume (porting/train/plan/host_memory.py); node = worker x "
                       f"{recipe.cluster.devices_per_node} workers"}


def check_host_memory(plan: dict, where: str) -> None:
    """Refuse a plan whose node total exceeds ``cluster.host_memory_gib``, with the fix."""
    limit = plan.get("limit_gib")
    if limit is None or plan["node_gib"] <= limit:
        return
    raise RecipeError(f"{where}: cluster.host_memory_gib: {limit:g} GiB per node, but the plan needs "
                      f"{plan['node_gib']:.1f} GiB ({plan['worker_gib']:.2f} GiB per worker x workers per node); "
                      "change: parallel.optimizer_sharding=true or a larger parallel.tensor_parallel (smaller "
                      "shards), fewer cluster.devices_per_node, or raise cluster.host_memory_gib to the node's RAM")
