"""Shrink a supervised run onto the devices that remain: ``port train RECIPE --supervise --shrink``.

After an incident that names a rank (its process died or stalled), the supervisor probes that rank's
device in a process of its own (porting/launch/device_probe.py: open the device, run a checked matmul,
under a deadline). Only when the probe fails, so the device itself is confirmed bad and relaunching on
it would fail again, the run is re-planned on the node's other devices:

- tensor parallel is kept (it is tied to the model's head split), data parallel becomes the largest size
  that the remaining devices hold and that the global batch divides with the recipe's micro-batch;
  gradient accumulation makes up the rest, so every optimizer step sees the same sequences;
- the new layout is planned and must fit the device memory like any recipe (``check_fits``);
- the relaunch resumes the last complete checkpoint in the new layout: the per-rank checkpoint files
  (format 2) are read by byte range in any DP/TP/ZeRO layout, and the resume identity
  (porting/train/run/checkpoint/format.py ``identity``: seed, global batch, model, every non-layout key) must
  still match;
- on Ascend the relaunch sees only the healthy dies (``ASCEND_RT_VISIBLE_DEVICES``), which its workers
  open as local devices 0..n-1.

A probe that passes means the fault was the process, not the device: the supervisor resumes on the same
devices as without ``--shrink``. One node only: ranks of other nodes wait in their own collectives, so a
multi-node shrink needs every node relaunched together, which one node's supervisor cannot do.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

from model_zoo.errors import PortingError, RecipeError
from porting.job import Job
from porting.launch.children import child_env
from porting.train.recipe.schema import Recipe

PROBE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Shrunk:
    """The layout a shrink relaunches with."""

    values: dict[str, int | None]   # {"section.key": value} set on the job's recipe (its next revision)
    devices: list[int]          # the node's devices the relaunch uses (local ids)
    tensor_parallel: int
    data_parallel: int
    grad_accum_steps: int
    text: str


def probe(device: str, device_id: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when device ``device_id`` answers the probe; else why it does not, in one line. A probe that cannot
    run at all (exit 2: its command line or a test hook does not parse) says nothing about the device: PortingError."""
    argv = [sys.executable, "-m", "porting.launch.device_probe", device, str(device_id)]
    try:
        r = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"device {device_id}: the probe did not finish in {timeout_s:.0f} s"
    if r.returncode == 0:
        return None
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    why = (errors or lines or [f"device {device_id}: the probe exited with {r.returncode}"])[-1].removeprefix("error: ")
    if r.returncode == 2:
        raise PortingError(f"the device probe could not run: {why}")
    return why


def derive(recipe: Recipe, devices: list[int], bad: set[int]) -> Shrunk:
    """The layout on ``devices`` minus ``bad`` with the recipe's global batch, or RecipeError saying why none."""
    tp = recipe.parallel.tensor_parallel
    micro = recipe.batching.micro_batch_size
    glob = recipe.global_batch_size
    left = [d for d in devices if d not in bad]
    dp = next((d for d in range(len(left) // tp, 0, -1) if glob % (d * micro) == 0), 0)
    if dp == 0:
        raise RecipeError(f"cannot shrink: {len(left)} device(s) remain, fewer than tensor_parallel {tp}")
    accum = glob // (dp * micro)
    use = left[:dp * tp]
    n, dies = dp * tp, recipe.cluster.dies_per_chip or 1
    # the job's recipe holds the derived hardware shape (chips x dies = devices, a server preset): the shrunk node
    # is n devices of the same dies where whole chips remain, else n single devices (a die left alone)
    values: dict[str, int | None] = {"cluster.devices_per_node": n, "batching.grad_accum_steps": accum,
                                     "cluster.chips_per_node": n // dies if n % dies == 0 else n,
                                     "cluster.dies_per_chip": dies if n % dies == 0 else 1}
    if recipe.cluster.server is not None:
        values["cluster.server"] = None   # no longer the whole server the preset describes
    if recipe.parallel.data_parallel is not None:
        values["parallel.data_parallel"] = dp
    text = (f"shrunk to {dp * tp} device(s) {use} (TP {tp} x DP {dp}, micro-batch {micro} x accumulation {accum}: "
            f"global batch {glob} kept) without device(s) {sorted(bad)}")
    return Shrunk(values, use, tp, dp, accum, text)


def check_plan(job: Job) -> None:
    """The shrunk job's plan holds like any recipe's: RecipeError (one line) when it does not fit."""
    from porting import train as T

    try:
        T.check_fits(job.plan, str(job.run.path / "job.json"))
    except PortingError as e:
        raise RecipeError(f"cannot shrink: the layout on fewer devices does not fit: {e}") from None


def confirm_bad(recipe: Recipe, devices: list[int], suspect_local: int) -> dict[int, str]:
    """{device: why} of the suspect's device when its probe fails, else {}."""
    d = devices[suspect_local]
    why = probe(recipe.cluster.device, d)
    return {d: why} if why else {}


def apply_shrink(hook: Callable[[Any], tuple[list[int], int, str] | None], inc: Any, ranks: list[int],
                 world: int) -> tuple[list[int], int]:
    """The supervisor's shrink step for an incident about to be relaunched that names a rank (a process that
    died or stalled): the ranks and world size of the next launch; ``inc.action`` says what was done, or
    that the run stops when no layout on fewer devices can continue it."""
    if not inc.action.startswith("relaunched") or inc.suspect is None or inc.kind not in ("exit", "stall"):
        return ranks, world
    try:
        moved = hook(inc)
    except PortingError as e:
        inc.action = f"stopped: {e}"
        return ranks, world
    if not moved:
        return ranks, world
    inc.action = f"{moved[2]}; {inc.action}"
    return moved[0], moved[1]
