"""Issue 53: a diagnosis that never says "no failure found" over a failure. Numerical faults read from the numbers a
run prints, crashes and the wrappers around them, install causes as data, links that fail both ways, a rank frozen
inside a checkpoint save, and confidence that is earned.

Port's own lines are written by port's own writers (porting/rundir/ranklog.py); other formats are the documented
ones (the HCCL guide's LINK_ERROR_INFO table, torch elastic's failure summary, Ray's RayTaskError), as
test_taxonomy.py builds them; the real excerpts are the field corpus (tests/diagnostics/fixtures/field, splits
tune53 and heldout53, sources in its README)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from porting.diagnostics import load_yaml
from porting.diagnostics.diagnose import diagnose
from porting.rundir import ranklog

FIELD = Path(__file__).with_name("fixtures") / "field"
EXPECTED = yaml.safe_load((FIELD / "expected.yaml").read_text())
STEP = dict(lr=1e-3, tokens_per_s=1000.0, step_time_s=0.1, padding=0.0, compile=False, shapes=(64,), graphs=1,
            skip_reason=None)


def rank_log(rank: int, world: int, losses: list[float], norms: list[float] | None = None, extra: str = "") -> str:
    """A `port train` rank log of these steps, every line from ranklog's own writer (time and prefix as its
    Formatter writes them)."""
    lines = [ranklog.pid_line(rank, world, 4000 + rank, "parallel_mode data_parallel")]
    for i, loss in enumerate(losses, 1):
        lines.append(ranklog.step_line(i, 100, loss=loss, grad_norm=(norms or losses)[i - 1], **STEP))
    return "".join(f"2026-12-07T10:00:{i:02d}.000 rank={rank} INFO {ln}\n" for i, ln in enumerate(lines)) + extra


def logs(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    d = tmp_path / "logs"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return d


# ------------------------------------------------------------------ numerical faults

def test_a_run_whose_loss_turns_nan_is_a_numerical_fault_at_the_step_and_rank_it_began(tmp_path):
    nan = float("nan")
    d = diagnose(logs(tmp_path, {"rank_0.log": rank_log(0, 2, [2.1, 2.0, 1.9, 1.8, 1.8, 1.7]),
                                 "rank_1.log": rank_log(1, 2, [2.1, 2.0, 1.9, nan, nan, nan])}))
    assert (d["cause_class"], d["fault"], d["first_failing_rank"], d["confidence"]) == \
        ("numerical", "nonfinite_loss", 1, "high")
    facts = d["evidence"][0]["facts"]
    assert facts["step"] == 4 and facts["value"] == "nan" and facts["nonfinite_lines"] == 3
    assert "port bisect" in d["reason"] and "--nan-origin" in d["reason"] and "nonfinite.max_consecutive_skips" in d["reason"]


def test_one_nonfinite_grad_norm_is_weak_two_are_a_fault_and_a_spike_is_a_divergence(tmp_path):
    """A dynamic loss scale skips a step with a non-finite gradient and goes on: one such line is at most medium."""
    nan = float("nan")
    one = diagnose(logs(tmp_path / "a", {"rank_0.log": rank_log(0, 1, [2.0, 1.9, 1.8], [0.5, nan, 0.4])}))
    assert (one["cause_class"], one["fault"], one["confidence"]) == ("numerical", "nonfinite_grad", "medium")
    two = diagnose(logs(tmp_path / "b", {"rank_0.log": rank_log(0, 1, [2.0, 1.9, 1.8], [0.5, nan, nan])}))
    assert (two["fault"], two["confidence"]) == ("nonfinite_grad", "high")
    spike = diagnose(logs(tmp_path / "c", {"rank_0.log": rank_log(0, 1, [2.0, 1.9, 1.8, 1.7, 40.0, 41.0])}))
    assert (spike["cause_class"], spike["fault"], spike["confidence"]) == ("numerical", "divergence", "medium")
    assert spike["evidence"][0]["facts"]["step"] == 5
    calm = diagnose(logs(tmp_path / "d", {"rank_0.log": rank_log(0, 1, [9.0, 4.0, 2.0, 1.5, 2.5, 1.2])}))
    assert calm["reason_kind"] == "none" and calm["confidence"] == "high"   # noise, not a 10x spike


# ------------------------------------------------------------------ earned confidence

def test_no_failure_found_is_high_only_over_a_text_with_no_failure_in_it(tmp_path):
    healthy = rank_log(0, 1, [2.0, 1.9]) + "2026-12-07T10:00:09.000 rank=0 INFO eval: 0 errors in 12 batches\n"
    assert diagnose(logs(tmp_path / "a", {"rank_0.log": healthy}))["confidence"] == "high"
    odd = diagnose(logs(tmp_path / "b", {"job.log": "epoch 1 done\nfatal: the reducer got into a state it cannot "
                                                    "leave\nepoch 2 done\n"}))
    assert (odd["reason_kind"], odd["confidence"], odd["role"]) == ("unclassified", "low", "culprit")
    assert odd["reason"].startswith("unclassified failure: fatal: the reducer") and "job.log:2" in odd["reason"]
    loader = diagnose(logs(tmp_path / "c", {"job.log": "train.py: error while loading shared libraries: libfoo.so.3: "
                                                       "cannot open shared object file: No such file or directory\n"}))
    assert (loader["cause_class"], loader["confidence"], loader["suspect"]["text"]) == ("config", "medium", "file")


def test_a_text_that_names_a_class_only_as_a_possibility_is_not_high(tmp_path):
    d = diagnose(logs(tmp_path, {"job.log": "[ERROR] Training failed. This may be caused by NPU out of memory or a "
                                            "data error; see the worker logs\n"}))
    assert d["cause_class"] == "memory" and d["confidence"] != "high"
    assert "names the failure's class but not its reason" in d["why"]


# ------------------------------------------------------------------ crashes and wrappers

def test_a_remote_exception_is_unwrapped_to_its_cause_and_names_the_actor_s_process_and_node(tmp_path):
    """Ray's RayTaskError(X) wraps the worker's own traceback: the cause is the nested error, the where is the
    wrapper's pid and ip (Ray's documented form: ray::Actor.method() (pid=P, ip=A, ...))."""
    text = ("ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.actor_rollout_update_actor() (pid=7021, "
            "ip=10.1.2.3, actor_id=ab12, repr=<WorkerDict object>)\n"
            "  File \"/opt/verl/workers/fsdp_workers.py\", line 412, in update_actor\n"
            "    metrics = self.actor.update_policy(data=data)\n"
            "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 5; 60.97 GiB total capacity; 58.10 GiB "
            "already allocated)\n")
    d = diagnose(logs(tmp_path, {"driver.log": text}))
    assert (d["cause_class"], d["suspect"]["text"]) == ("memory", "device 5")
    assert {("host", "10.1.2.3"), ("pid", 7021)} <= {(x["type"], x["id"]) for x in d["entities"]}


def test_torchrun_s_abort_report_names_the_root_cause_rank_with_its_host_and_pid_at_medium(tmp_path):
    d = diagnose(logs(tmp_path, {"pasted.log": (FIELD / "mmsegmentation_3106_sigabrt_root_cause_rank0.log").read_text()}))
    s = d["suspect"]
    assert (s["id"], s["host"], s["pid"]) == (0, "neptun.informatik.uni-kl.de", 2385922)
    assert (d["cause_class"], d["fault"], d["confidence"]) == ("process_exit", "signal", "medium")
    assert "exitcode -6" in d["reason"] and "says how rank 0's process ended, not why" in d["why"]


# ------------------------------------------------------------------ links across nodes

def link_plog(rank: int, me: str, peer: str, peer_rank: int, sec: int) -> str:
    """HCCL's link set-up timeout with its LINK_ERROR_INFO table, as the HCCL guide prints it (param_link_stage)."""
    head = f"[ERROR] HCCL(17528,python3):2026-03-18-10:33:{sec:02d}.113.403 [hccl_socket_manager.cc:797] [18744]"
    return (f"{head}[Wait][LinkEstablish]wait socket establish timeout, role[1] rank[{rank}] timeout[120 s]\n"
            f"{head}   _________________________LINK_ERROR_INFO___________________________\n"
            f"{head}   |  dest_ip(user_rank)  |   dest_port   |  src_ip(user_rank)   |   src_port   |   MyRole   |"
            f"   Status   |    TlsStatus   |\n"
            f"{head}   |  {peer}({peer_rank})   |  16666  |   {me}({rank})   |  3234403008  |  client  | time out |"
            f"   DISABLE  | LinkInfo\n")


def test_links_that_fail_both_ways_between_two_nodes_name_the_pair_not_one_peer(tmp_path):
    both = {"plog-1_1.log": link_plog(0, "192.0.2.10", "192.0.3.20", 8, 52),
            "plog-2_1.log": link_plog(8, "192.0.3.20", "192.0.2.10", 0, 53)}
    d = diagnose(logs(tmp_path / "a", both))
    assert d["suspect"]["text"] == "link 192.0.2.10 <-> 192.0.3.20" and d["cause_class"] == "socket_timeout"
    assert d["confidence"] == "medium" and "the network between the two ends" in d["reason"]
    one_way = diagnose(logs(tmp_path / "b", {"plog-1_1.log": both["plog-1_1.log"]}))
    assert one_way["suspect"]["text"] == "rank 8"   # one side only: the remote end, as before


# ------------------------------------------------------------------ a rank frozen inside a save

def save_log(rank: int, parts: list[str]) -> str:
    lines = [ranklog.saving_line(4)] + [ranklog.save_part_line(4, p) for p in parts]
    return rank_log(rank, 2, [2.0, 1.9, 1.8, 1.7]) + "".join(
        f"2026-12-07T10:01:{i:02d}.000 rank={rank} INFO {ln}\n" for i, ln in enumerate(lines))


def test_the_rank_still_in_its_own_part_of_a_save_is_named_not_the_ones_at_its_barrier(tmp_path):
    sched = ("[ERROR] DISTRIBUTED(9,7f,python):2026-12-07-10:01:40.007.940 [mindspore/ccsrc/cluster/topology/"
             "meta_server_node.cc:548] UpdateTopoState] The node: 1 is timed out. It may exit with exception, please "
             "check this node's log.\n")
    d = diagnose(logs(tmp_path, {"rank_0.log": save_log(0, ["wait", "write", "barrier"]),
                                 "rank_1.log": save_log(1, ["wait", "write"]), "scheduler.log": sched}), world_size=2)
    assert (d["first_failing_rank"], d["cause_class"], d["fault"], d["confidence"]) == (1, "process_exit", "stuck", "high")
    assert "writing its own file" in d["reason"] and "msrun's scheduler then lost its heartbeat" in d["reason"]
    both_waiting = diagnose(logs(tmp_path / "b", {"rank_0.log": save_log(0, ["wait", "write", "barrier"]),
                                                  "rank_1.log": save_log(1, ["wait", "write", "barrier"])}))
    assert both_waiting["reason_kind"] == "none"   # no part tells one from the other: no such verdict


# ------------------------------------------------------------------ the cause model stays linear

def _starts_unbounded(items) -> bool:
    """Whether a parsed pattern can begin with an unbounded repeat (``\\w+ do tiling``): a search retries it at every
    position of a long word, which is quadratic (issue 51: 23 MB of logs took over 60 s)."""
    try:
        from re import _constants as C, _parser as P   # Python 3.11+
    except ImportError:   # pragma: no cover - Python 3.9 / 3.10
        import sre_constants as C  # noqa: N812
        import sre_parse as P  # noqa: N812,F401
    for op, av in items:
        if op is C.AT:
            return False   # ^ or \b: it starts only at line starts or word boundaries, a long word has two
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            return av[1] == C.MAXREPEAT or _starts_unbounded(av[2])
        if op is C.SUBPATTERN:
            return _starts_unbounded(av[-1])
        if op is C.BRANCH:
            return any(_starts_unbounded(b) for b in av[1])
        return False
    return False


def test_no_pattern_of_the_cause_model_or_the_tail_reader_starts_with_an_unbounded_repeat():
    try:
        from re import _parser as P
    except ImportError:   # pragma: no cover
        import sre_parse as P
    from porting.diagnostics import causes, tail

    patterns = [p for c in load_yaml("cause_model.yaml")["classes"] for f in c["faults"]
                for p in f.get("patterns", []) + f.get("weak", [])]
    patterns += [rx.pattern.decode() for _, rx in causes.ENTITY_RES]
    patterns += [rx.pattern.decode() for rx in (tail.METRIC_RE, tail.STEP_OF_RE, tail.QUIET_RE, causes.HEDGE_RE)]
    bad = [p for p in patterns if _starts_unbounded(P.parse(p))]
    assert not bad, bad
    assert _starts_unbounded(P.parse(r"\w+ do tiling failed"))   # the check finds what it is for


def test_every_new_class_and_fault_is_sourced_with_a_next_action():
    model = {c["name"]: c for c in load_yaml("cause_model.yaml")["classes"]}
    assert {f["name"] for f in model["numerical"]["faults"]} == {"nonfinite_loss", "nonfinite_grad",
                                                                "loss_scale_collapse", "divergence"}
    config = {f["name"]: f for f in model["config"]["faults"]}
    for name in ("disk_full", "backend", "driver_mount"):
        assert config[name]["sources"] and config[name]["next"] and config[name]["decisive"], name
        assert all(re.match(r"https://", s) for s in config[name]["sources"]), name
    assert "signal" in {f["name"] for f in model["process_exit"]["faults"]}
    assert "tiling" in {f["name"] for f in model["operator_error"]["faults"]}


@pytest.mark.parametrize("shape", ["device", "memory", "link", "heartbeat", "install", "operator", "numerical", "crash"])
def test_each_shape_of_the_issue_has_real_tuning_excerpts(shape):
    """Issue 53's done-criterion, on its tuning set: every shape has public excerpts (or port's own runs), and
    test_field_logs.py holds each to its expected suspect and class."""
    assert [n for n, w in EXPECTED.items() if w.get("split") == "tune53" and w.get("shape") == shape], shape
