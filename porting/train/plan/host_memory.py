"""Predicted peak host RAM of one `port train` worker and of one node, for the dry run.

Resident for the whole run, per worker (each term: formula, source):

- ``base``: the process with Python, MindSpore and port's training loop imported. CPU: 0.40 GiB, the
  RSS of ``import mindspore, porting.train.run.loop`` measured on this project's CPU machines
  (benchmarks/host_rss_plan.py prints it; benchmarks/checkpoint_scale.py ``import_baseline``). Ascend:
  3.0 GiB, an estimate of the same plus the CANN runtime's host side (no device measurement is held).
- ``device_state`` (CPU only): the CPU backend's "device" memory is host memory, so the device plan's
  peak (porting/train/plan/memory.py: weights, gradients, AdamW states, activations, copies) is resident.
- ``weights_host`` (Ascend only): the HF load gives each weight to MindSpore as a host tensor
  (converters/loading.py ``ms.Tensor(array)`` then ``Parameter.set_data``); the device copy is made when
  the graph first runs and the host one is counted as kept (P_local x parameter bytes) until a device run
  measures otherwise. Nothing else of the model or the optimizer is on the host: no weight is drawn
  (model_zoo/linear.py ``deferred_parameters``), and the accumulation buffers, AdamW m and v and the fp32
  masters are made on the device (porting/train/run/step/cells.py, zero.py ``on_device``).
- ``restored_states_host`` (Ascend only, a resume): the restore gives each optimizer state to MindSpore as a host
  tensor too (porting/train/run/checkpoint/read.py ``_fill_optimizer``: ``Tensor(buf)`` then ``set_data``, one ZeRO
  bucket's shard or one parameter at a time), so a resumed worker holds its share of the fp32 masters (bf16/fp16
  parameters), AdamW m and v on the host as well, counted as kept like the weights' copies: P_local x (4 + 4 + 4) /
  dp with ZeRO (all of its slice's without): 2.3 GiB a worker at 13B TP 8 x DP 8. On the CPU those tensors are the
  device state already counted. ``worker_gib`` is a resumed worker's peak (the larger); ``fresh_worker_gib`` a fresh
  start's.
- ``data``: the worker's token arrays, ``ids`` and ``labels`` int32 (porting/train/data/token_file.py
  ``ARRAYS``: 8 bytes a token), the tokens estimated as the data file's bytes / 4 (about 4 characters a
  token for English text with a Llama tokenizer; an estimate, 0 when the file is not where the plan runs).

Transient, one at a time (the largest counts; they run one after another, before or between steps):
the HF load (converters/loading.py ``read_slice``: this rank's slice of the largest tensor as read, widened
to fp32, and the parameter-dtype copy given to MindSpore); a save (porting/train/run/checkpoint/format.py: one
piece sliced on the device, as fp32 and as the bytes written); a resume (porting/train/run/checkpoint/read.py:
one ZeRO bucket's shard or one parameter, the piece read, and the tensor handed to the device).

The node total is the worker's peak times the workers per node (``cluster.devices_per_node``): all workers
start and save at the same time. A plan whose node total exceeds ``cluster.host_memory_gib`` is refused
with what to change. Measured against real one-device runs at two widths (benchmarks/host_rss_plan.py,
BENCHMARKS.md; tests/train/test_host_rss_measured.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from porting.train.plan.comm import parameter_numels
from porting.train.plan.layout import DTYPE_BYTES
from porting.train.plan.sharding import flat_buckets
from porting.train.recipe.schema import Recipe

HOST_BASE_GIB = {"cpu": 0.40, "ascend": 3.0}   # see the module docstring: CPU measured, Ascend an estimate
DATA_BYTES_PER_FILE_BYTE = 2.0                  # 8 bytes a token (ids + labels, int32), ~4 characters a token
GIB = float(1 << 30)


@dataclass(frozen=True)
class HostTerms:
    """GiB of each resident term of one worker and of its largest transient (the module docstring)."""

    base: float
    device_state: float
    weights_host: float
    data: float
    largest_transient: float
    restored_states_host: float = 0.0   # a resumed worker's optimizer states as host tensors (Ascend)


@dataclass(frozen=True)
class Transients:
    """GiB of each start-up and checkpoint path's largest transient (one at a time)."""

    hf_load: float
    save: float
    resume: float


@dataclass(frozen=True)
class HostMemory:
    """Predicted peak host RAM of one worker and one node (plan.json ``host_memory``)."""

    worker_gib: float
    node_gib: float
    terms_gib: HostTerms
    transients_gib: Transients
    limit_gib: float | None            # cluster.host_memory_gib (None: not given, not checked)
    formula: str
    fresh_worker_gib: float | None = None   # a fresh start's peak (worker_gib: a resumed worker's, the larger)


def _largest_param(cfg: LlamaConfig, tp: int) -> tuple[int, int]:
    """(elements of the largest full parameter, of the largest TP-local one)."""
    return max(parameter_numels(cfg, 1)), max(parameter_numels(cfg, tp))


def data_bytes(recipe: Recipe) -> float:
    """The token arrays' bytes: 2 x the data file's (module docstring), 0 when it is not where the plan runs."""
    try:
        return DATA_BYTES_PER_FILE_BYTE * Path(recipe.data.path).stat().st_size
    except (OSError, TypeError, ValueError):
        return 0.0


def transients(recipe: Recipe, cfg: LlamaConfig) -> dict[str, float]:
    """Bytes of each start-up and checkpoint path's largest transient."""
    tp = recipe.parallel.tensor_parallel
    dp = recipe.data_parallel_size
    _, local = _largest_param(cfg, tp)
    pb = DTYPE_BYTES[recipe.precision.param_dtype]
    piece = local
    bucket = 0
    if recipe.parallel.optimizer_sharding and dp > 1:   # the largest bucket's shard, as zero.py forms them
        bucket = max(b.shard(dp) for b in flat_buckets(parameter_numels(cfg, tp), 4, recipe.parallel.comm_fusion, dp))
        piece = min(local, bucket)
    return {"hf_load": local * (2 + 4 + pb),            # the slice as read (bf16), widened, the parameter copy
            "save": piece * (4 + pb),                   # one piece as fp32 and as the bytes written
            "resume": 4 * bucket + local * (4 + 4 + pb)}  # a bucket's shard; a parameter, its piece, the tensor


def state_bytes_per_element(recipe: Recipe) -> int:
    """fp32 optimizer bytes of one parameter: AdamW m and v, and the master when parameters are not fp32."""
    return 8 + (4 if DTYPE_BYTES[recipe.precision.param_dtype] != 4 else 0)


def restored_states_bytes(recipe: Recipe, cfg: LlamaConfig) -> float:
    """Bytes of the optimizer states a resumed rank restores as host tensors (module docstring)."""
    tp, dp = recipe.parallel.tensor_parallel, recipe.data_parallel_size
    per = state_bytes_per_element(recipe)
    share = dp if recipe.parallel.optimizer_sharding and dp > 1 else 1
    return sum(parameter_numels(cfg, tp)) * per / share


def host_memory(recipe: Recipe, cfg: LlamaConfig, device_total_gib: float) -> HostMemory:
    """Per-worker peak and per-node total in GiB, with the terms and the formula."""
    dev = recipe.cluster.device
    tp = recipe.parallel.tensor_parallel
    base = HOST_BASE_GIB[dev]
    device = device_total_gib if dev == "cpu" else 0.0
    weights = 0.0 if dev == "cpu" else sum(parameter_numels(cfg, tp)) * DTYPE_BYTES[recipe.precision.param_dtype] / GIB
    data = data_bytes(recipe) / GIB
    trans = transients(recipe, cfg)
    transient = max(trans.values()) / GIB
    states = 0.0 if dev == "cpu" else restored_states_bytes(recipe, cfg) / GIB
    fresh = base + device + weights + data + transient
    worker = fresh + states
    node = worker * recipe.cluster.devices_per_node
    return HostMemory(
        worker_gib=round(worker, 3), node_gib=round(node, 3),
        terms_gib=HostTerms(base=base, device_state=round(device, 3), weights_host=round(weights, 3),
                            data=round(data, 3), largest_transient=round(transient, 3),
                            restored_states_host=round(states, 3)),
        transients_gib=Transients(**{k: round(v / GIB, 3) for k, v in trans.items()}),
        limit_gib=recipe.cluster.host_memory_gib,
        formula=f"worker = {base} GiB base ({dev}) + device state (CPU: the device plan's peak) + the "
                "weights' host copies (Ascend: P_local x parameter bytes) + on a resume the optimizer states "
                "restored as host tensors (Ascend: P_local x 12 bytes / dp with ZeRO) + the token arrays (2 x the "
                "data file's bytes) + the largest transient of HF load, save and resume "
                f"(porting/train/plan/host_memory.py); node = worker x {recipe.cluster.devices_per_node} workers; a "
                f"fresh start {fresh:.2f} GiB a worker", fresh_worker_gib=round(fresh, 3))


def check_host_memory(hm: HostMemory, where: str) -> None:
    """Refuse a plan whose node total exceeds ``cluster.host_memory_gib``, with the fix."""
    limit = hm.limit_gib
    if limit is None or hm.node_gib <= limit:
        return
    raise RecipeError(f"{where}: cluster.host_memory_gib: {limit:g} GiB per node, but the plan needs "
                      f"{hm.node_gib:.1f} GiB ({hm.worker_gib:.2f} GiB per worker x workers per node); "
                      "change: parallel.optimizer_sharding=true or a larger parallel.tensor_parallel (smaller "
                      "shards), fewer cluster.devices_per_node, or raise cluster.host_memory_gib to the node's RAM")
