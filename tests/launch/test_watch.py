"""The supervisor's watch (porting/launch/watch.py): a heartbeat per rank with an allowance per phase, read with a
clock the test moves, so every limit is checked at its exact second instead of racing real sleeps."""

from __future__ import annotations

import math

import os
import signal
import subprocess
import sys
import time

from porting.launch.proctable import state
from porting.launch.watch import Limits, Watch, derive_limits
from porting.train.plan.allowances import INIT_MARGIN_S
from porting.train.plan.allowances import Allowances
from porting.train.plan.make import TrainPlan
from porting.rundir.heartbeat import Heartbeat

LIMITS = Limits(stall_s=30, compile_s=100, save_s=60)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _setup(tmp_path, ranks=(0, 1), limits=LIMITS):
    clock = Clock()
    w = Watch(tmp_path, list(ranks), limits, now=clock)
    return w, clock, {r: Heartbeat(tmp_path, r) for r in ranks}


def _recipe(name: str, *sets: str):
    from porting.train import load_recipe
    from tests.train.conftest import ROOT

    return load_recipe(ROOT / "recipes" / name, list(sets), check_files=False)


def _limits(name: str, *sets: str) -> tuple[TrainPlan, Limits]:
    """The plan and the watch's limits of a real recipe (the dry run's planner: no MindSpore)."""
    from porting.train import make_plan, plan_config

    rec = _recipe(name, *sets)
    cfg, _ = plan_config(rec)
    plan = make_plan(rec, cfg, "runs/x")
    return plan, derive_limits(plan.allowances, None, 3)


def test_heartbeat_limits_are_the_plan_s_allowances_and_the_step_s_stays_under_hccl_exec_timeout():
    plan, lim = _limits("7b-8card.yaml")
    assert plan.launch is not None
    a, hccl = plan.allowances, float(plan.launch.env["HCCL_EXEC_TIMEOUT"])
    assert (lim.compile_s, lim.restore_s, lim.save_s, lim.stall_s) == (max(a.setup_s, a.compile_s),
                                                                       max(a.step_s, a.restore_s), a.save_s, a.step_s)
    assert lim.stall_s <= hccl / 2 and lim.save_s < hccl   # HCCL's timeout is derived from the save: 3 x save + 600
    assert a.graphs == 5 and a.shapes == 4                 # 4 bucket shapes + the update graph (grad_accum_steps 4)
    short = derive_limits(a, 30.0, 1)                       # --stall-timeout: the step's, and no phase allows less
    assert (short.stall_s, short.compile_s, short.save_s, short.max_restarts) == (30.0, lim.compile_s, lim.save_s, 1)
    assert derive_limits(a, 10 ** 6, 1).compile_s == 10 ** 6


def test_a_slow_filesystem_or_many_shapes_raise_their_own_allowance_and_nothing_else():
    """A 16x slower filesystem multiplies the save allowance and a restored group's (7B: above their floors) by 16,
    and the setup's follows HCCL_CONNECT_TIMEOUT, which the plan derives from the save (comm.py hccl_env); 4 bucket
    shapes instead of 1 multiply the whole time before step 1 by the graphs to compile (2 -> 5 with the
    update graph) but not the watch's limit, which is one graph's silence; every other limit stays as it was."""
    import dataclasses

    base_plan, base = _limits("7b-8card.yaml", "batching.bucketing.max_shapes=1")
    gib = _recipe("7b-8card.yaml").checkpointing.fs_gib_per_s / 16
    slow_plan, slow = _limits("7b-8card.yaml", "batching.bucketing.max_shapes=1", f"checkpointing.fs_gib_per_s={gib}")
    shapes_plan, shapes = _limits("7b-8card.yaml", "batching.bucketing.max_shapes=4")

    def others(lim: Limits, *changed: str) -> dict:
        return {k: v for k, v in dataclasses.asdict(lim).items() if k not in changed}

    def planned(plan: TrainPlan, name: str) -> float:
        return next(p.planned_s for p in plan.allowances.phases if p.name == name)

    assert others(slow, "restore_s", "save_s", "compile_s") == others(base, "restore_s", "save_s", "compile_s")
    assert slow.compile_s == slow_plan.allowances.setup_s == math.ceil(
        float(slow_plan.launch.env["HCCL_CONNECT_TIMEOUT"]) + INIT_MARGIN_S) > base.compile_s
    assert abs(slow.save_s - 16 * base.save_s) <= 16 and base.save_s > 120
    assert slow.restore_s > 120 and abs(slow.restore_s - 3 * 16 * planned(base_plan, "restore")) <= 1
    assert others(shapes) == others(base)
    assert base_plan.allowances.graphs == 2 and shapes_plan.allowances.graphs == 5
    assert abs(shapes_plan.allowances.compile_total_s - base_plan.allowances.compile_total_s * 5 / 2) <= 3


def test_each_phase_has_its_allowance():
    lim = Limits(stall_s=10, compile_s=20, save_s=30, restore_s=40)
    assert {p: lim.allowance(p) for p in ("setup", "compile", "restore", "step", "save", "finished")} == \
        {"setup": 20, "compile": 20, "restore": 40, "step": 10, "save": 30, "finished": 30}


def test_a_rank_is_late_only_past_its_phases_allowance_to_the_second(tmp_path):
    w, clock, hb = _setup(tmp_path)
    for r in (0, 1):
        hb[r].beat("step", 1)
    assert w.poll() is None
    clock.t += 20
    hb[0].beat("step", 2)
    hb[0].beat("save", 2)           # rank 0 saves: 60 s allowed
    hb[1].beat("step", 2)
    assert w.poll() is None
    clock.t += 30                   # exactly the step allowance: not late yet
    assert w.poll() is None
    clock.t += 1
    assert w.poll() == (1, "stall", "rank 1: no heartbeat or log line for 31 s (after step 2; limit 30 s)")
    hb[1].beat("step", 3)           # rank 1 beats again; rank 0's save is still inside its 60 s
    assert w.poll() is None
    clock.t += 30
    assert w.poll() == (0, "stall", "rank 0: no heartbeat or log line for 61 s (saving a checkpoint; limit 60 s)")


def test_before_its_first_beat_of_this_launch_a_rank_has_the_compile_allowance(tmp_path):
    Heartbeat(tmp_path, 0).beat("step", 7)     # an earlier launch's record: not a beat of this launch
    w, clock, _ = _setup(tmp_path, ranks=(0,))
    clock.t += 100
    assert w.poll() is None
    clock.t += 1
    assert w.poll() == (0, "stall", "rank 0: no heartbeat or log line for 101 s (compiling or before its first step; "
                                    "limit 100 s)")
    assert w.last_step() is None                # the earlier launch's step 7 is not this launch's


def test_a_growing_log_is_a_sign_of_life_and_a_damaged_record_is_none(tmp_path):
    w, clock, hb = _setup(tmp_path, ranks=(0,))
    hb[0].beat("step", 1)
    assert w.poll() is None
    log = tmp_path / "logs" / "rank_0.log"
    log.parent.mkdir()
    for _ in range(3):
        clock.t += 25
        with open(log, "a") as f:
            f.write("2026-01-01T00:00:00.000 rank=0 WARNING something\n")
        assert w.poll() is None
    (tmp_path / "heartbeat" / "rank_0.json").write_text('{"phase": "step", "step": 9')   # cut: no beat
    clock.t += 31
    late = w.poll()
    assert late is not None and late[:2] == (0, "stall") and "after step 1;" in late[2]


def test_watch_sees_a_rank_whose_process_is_gone(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    w, clock, _ = _setup(tmp_path)
    Heartbeat(tmp_path, 0).beat("setup")
    Heartbeat(tmp_path, 1, pid=gone.pid).beat("step", 3)
    assert w.poll() == (1, "exit", f"rank 1: its process {gone.pid} is gone (after step 3)")


def test_a_stopped_process_is_named_while_the_others_wait(tmp_path):
    """SIGSTOP freezes a rank without a trace in any log: the watch names it from its process state."""
    frozen = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10   # the signal is delivered asynchronously: wait for the stopped state
        while state(frozen.pid) != "T":
            assert time.monotonic() < deadline, state(frozen.pid)
            time.sleep(0.01)
        w, clock, hb = _setup(tmp_path)
        hb[0].beat("step", 4)
        Heartbeat(tmp_path, 1, pid=frozen.pid).beat("step", 4)
        assert w.poll() is None
        clock.t += 31
        rank, kind, what = w.poll()
        assert (rank, kind) == (1, "stall") and what.endswith(f"its process {frozen.pid} is stopped (SIGSTOP or a "
                                                              "debugger)"), what
    finally:
        frozen.kill()
        frozen.wait()


def test_the_first_worker_msrun_reports_dead_is_the_suspect(tmp_path):
    """msrun kills the other workers within half a second of the first death, so the supervisor reads
    msrun's own line (as MindSpore 2.10's process_entity/_api.py prints it) and maps its pid to the rank."""
    w, _, _ = _setup(tmp_path)
    for r, pid in ((0, 17591), (1, 17593)):
        Heartbeat(tmp_path, r, pid=pid).beat("setup")
    launch = tmp_path / "launch_1.log"
    launch.write_text("[ERROR] ME(17546:1,MainProcess):2026-12-03-09:07:14.759.000 [mindspore/parallel/cluster/"
                      "process_entity/_api.py:365] Worker process 17593 exit with exception. Error code: -9.\n"
                      "[WARNING] ME(17546:1,MainProcess):2026-12-03-09:07:14.759.000 [mindspore/parallel/cluster/"
                      "process_entity/_api.py:370] There's worker exits with exception, kill all other workers.\n")
    w.poll()
    assert w.first_dead_by_msrun(launch) == (1, "msrun: rank 1's worker (pid 17593) exited with -9")


def test_a_save_gets_its_predicted_time_and_a_save_that_hangs_is_named_as_such(tmp_path):
    """While a rank saves a checkpoint, the heartbeat allows the plan's save allowance, not the step limit; past
    it the stall is named as a hanging save."""
    a = Allowances(line_s=120, compile_s=120, restore_s=120, save_s=660, step_s=300, graphs=1, shapes=1,
                   seconds_per_graph=10.0, formula="a save of 220 s, 3 x")
    lim = derive_limits(a, 30.0, 1)
    assert lim.stall_s == 30.0 and lim.save_s == 660   # a slow filesystem is not a step stall
    w, clock, hb = _setup(tmp_path, limits=lim)
    for r in (0, 1):
        hb[r].beat("save", 4)
    assert w.poll() is None
    clock.t += 600                      # far past the step limit, inside the save's
    hb[0].beat("step", 4)               # rank 0's save ends; rank 1's never does
    assert w.poll() is None
    clock.t += 61                       # both are late now; rank 1 showed life first, so it stopped first
    assert w.poll() == (1, "stall", "rank 1: no heartbeat or log line for 661 s (saving a checkpoint; limit 660 s)")


def test_in_a_save_the_rank_still_writing_is_named_not_the_ranks_waiting_at_its_barrier(tmp_path):
    """Issue 53: every rank's phase says "save" until the save ends; the part says who waits. Rank 0 reached the
    save's barrier after rank 1 began writing, and stopped beating later: ordering by the last beat alone would name
    rank 1 only by luck, ordering by step not at all (both at step 4)."""
    w, clock, hb = _setup(tmp_path)
    hb[0].beat("save", 4, part="wait")
    hb[1].beat("save", 4, part="wait")
    hb[1].beat("save", 4, part="write")   # rank 1 freezes here
    assert w.poll() is None
    clock.t += 5
    hb[0].beat("save", 4, part="write")
    hb[0].beat("save", 4, part="barrier")   # rank 0 is written and waits
    assert w.poll() is None
    clock.t += 61
    rank, kind, what = w.poll()
    assert (rank, kind) == (1, "stall") and "in checkpoint step 4's save: writing its own file" in what
    assert what.endswith("while rank(s) [0] reached the save's barrier and wait for it")
    clock.t += 100   # rank 0's beat is now the older one, and still it is not named: it waits
    assert w.poll()[0] == 1
