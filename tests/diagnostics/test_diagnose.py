"""`port diagnose` on real Ascend logs from ../shared, hand-written `port train` rank logs (with
clock skew between hosts), and bad input. The real-msrun fault jobs are in test_diagnose_msrun.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from porting.diagnostics import DiagnosticsError
from porting.diagnostics.diagnose import diagnose

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "porting", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def cases(shared) -> Path:
    return shared / "data" / "ascend" / "logs" / "mindspore_docs_cann_error_cases"


@pytest.fixture(scope="module")
def faultdiag(shared) -> Path:
    return shared / "data" / "ascend" / "logs" / "mind-cluster-faultdiag-fixtures"


def one_case(tmp_path: Path, src: Path) -> Path:
    d = tmp_path / src.stem
    d.mkdir()
    shutil.copy(src, d / src.name)
    return d


def test_ei0002_notify_timeout_is_a_consequence_naming_the_remote_rank(tmp_path, cases):
    d = diagnose(one_case(tmp_path, cases / "12_EI0002_notify_wait_timeout.log"))
    codes = {c["code"]: c for c in d["error_codes"]}
    assert "EI0002" in codes and "remote rank" in codes["EI0002"]["meaning"]
    assert "named remote rank" in codes["EI0002"]["next_step"]
    # the timeout and its "Heartbeat Lost" note are consequences; they blame remote rank 0
    row = d["ranks"][0]
    ev = [e for e in d["timeline"] if "EI0002" in e["text"]]
    assert ev and ev[0]["role"] == "consequence"
    assert row["status"] == "timed out (consequence)"
    # the verdict names the remote rank the timeout waits for, not the file
    assert d["first_failing_rank"] == 0 and "remote rank 0" in d["reason"] and d["confidence"] == "medium"
    assert any("remote rank 0" in c for c in d["collect_next"])


def test_hbm_allocation_failure_is_reported_as_oom(tmp_path, cases):
    d = diagnose(one_case(tmp_path, cases / "07_EE9999_On_Chip_Video_Memory_Allocation_Failure.log"))
    assert d["reason_kind"] == "oom"
    assert "Malloc device memory failed" in d["reason"]
    assert any(c["code"] == "EE9999" and "HBM" in c["meaning"] for c in d["error_codes"])


@pytest.mark.parametrize("name,code,kind", [
    ("13_EI0004_Illegal_ranktable_configuration.log", "EI0004", None),
    ("14_EI0005_Inconsistent_Communication_Parameters_Between_Cards.log", "EI0005", None),
    ("05_EZ9999_AICORE_Operator_Execution_Failure.log", "EZ9999", "device_error"),
    ("11_EI0006_Socket_Build_Timeout.log", "EI0006", None),
    ("15_EJ0001_HCCP_Initialization_Failure.log", "EJ0001", None),
])
def test_every_documented_case_gets_its_code_explained(tmp_path, cases, name, code, kind):
    d = diagnose(one_case(tmp_path, cases / name))
    entry = next(c for c in d["error_codes"] if c["code"] == code)
    assert entry["meaning"] != "not in the table" and entry["next_step"]
    if kind:
        assert d["reason_kind"] == kind


def test_whole_case_directory_reads_every_file(cases):
    d = diagnose(cases)
    assert d["files_read"] == len(list(cases.iterdir()))
    assert {c["code"] for c in d["error_codes"]} >= {"EI0002", "EI0004", "EI0005", "EI0006", "EE9999", "EZ9999"}


def test_cann_plogs_grouped_by_pid_into_ranks(tmp_path, faultdiag):
    d = tmp_path / "job"
    d.mkdir()
    for f in faultdiag.glob("st_event_timeout_testcase_*"):
        shutil.copy(f, d / f.name)
    res = diagnose(d)
    # run plogs name rank[0..2] (SetupAgent); debug plogs of the same pid join them
    assert sorted(r["rank"] for r in res["ranks"]) == [0, 1, 2]
    assert all(r["first_error"] is not None for r in res["ranks"])
    assert res["first_failing_rank"] in (0, 1, 2)
    assert any(r["last_collective"] for r in res["ranks"])


def _fmt(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(round((t % 1) * 1000)) % 1000:03d}"


def write_port_rank_logs(logs: Path, *, skew: dict[int, float], events: dict[int, tuple[int, float, str]],
                         ranks: int = 4, steps: int = 20) -> None:
    """`port train` rank logs: steps every 1 s on one true clock, shifted by each host's skew.
    events[r] = (stop after step, seconds after that step, final line)."""
    t0 = 1_795_000_000.0
    logs.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        off = skew.get(r, 0.0)
        last, delay, final = events.get(r, (steps, 0.0, ""))
        lines = [f"{_fmt(t0 + off)} rank={r} INFO start world_size={ranks}"]
        for s in range(1, last + 1):
            lines.append(f"{_fmt(t0 + s + off)} rank={r} step={s} loss={2 + 1 / s:.4f} lr=1e-4 step_time_s=1.0")
        if final:
            lines.append(f"{_fmt(t0 + last + delay + off)} rank={r} {final}")
        (logs / f"rank_{r}.log").write_text("\n".join(lines) + "\n")


def test_port_train_logs_with_clock_skew_pick_the_true_first_error(tmp_path):
    # ranks 2,3 are on a host whose clock runs 600 s ahead. True order: rank 2 OOMs 5 s after step 10,
    # rank 1 raises 8 s after step 10 (3 s later); on raw clocks rank 2 looks 597 s later than rank 1.
    logs = tmp_path / "logs"
    write_port_rank_logs(logs, skew={2: 600.0, 3: 600.0}, events={
        2: (10, 5.0, "ERROR RuntimeError: out of memory: tried to allocate 2.00 GiB"),
        1: (10, 8.0, "ERROR ValueError: bad batch shape (3, 17)"),
        0: (10, 30.0, "ERROR collective AllReduce timed out waiting for peers"),
        3: (10, 30.0, "ERROR collective AllReduce timed out waiting for peers"),
    })
    d = diagnose(logs)
    assert d["first_failing_rank"] == 2 and d["last_step"] == 10 and d["reason_kind"] == "oom"
    offs = {r["rank"]: r["clock_offset_s"] for r in d["ranks"]}
    assert offs[2] == pytest.approx(600.0, abs=0.01) and offs[3] == pytest.approx(600.0, abs=0.01)
    assert any("clock differs" in w for w in d["warnings"])
    status = {r["rank"]: r["status"] for r in d["ranks"]}
    assert status[0] == status[3] == "timed out (consequence)"


def test_silent_rank_with_lowest_progress_is_the_stalled_one(tmp_path):
    logs = tmp_path / "logs"
    write_port_rank_logs(logs, skew={}, events={
        r: (7, 1800.0, "ERROR HCCL EI0002: The wait execution of the Notify register times out. Reason: "
                       "The Notify register has not received the Notify record from remote rank [3].")
        for r in (0, 1, 2)} | {3: (7, 0.0, "")})
    d = diagnose(logs)
    assert d["first_failing_rank"] == 3 and d["last_step"] == 7 and d["reason_kind"] == "stall"


def test_truncated_binary_and_mixed_files_do_not_stop_the_diagnosis(tmp_path):
    logs = tmp_path / "logs"
    write_port_rank_logs(logs, skew={}, events={1: (5, 2.0, "ERROR RuntimeError: injected")}, ranks=2, steps=9)
    (logs / "rank_0.log").write_bytes((logs / "rank_0.log").read_bytes()[:-25])  # cut mid-line
    (logs / "core.bin.log").write_bytes(bytes(range(256)) * 64)                     # binary garbage
    (logs / "dangling.log").symlink_to(tmp_path / "nowhere.log")                    # unreadable
    (logs / "notes.txt").write_text("operator notes\nno timestamps here\n")         # other format
    d = diagnose(logs)
    assert d["first_failing_rank"] == 1 and d["reason_kind"] == "exception"
    joined = " | ".join(d["warnings"])
    assert "core.bin.log: binary content" in joined and "dangling.log: unreadable" in joined
    assert "rank_0.log: last line has no newline" in joined


@pytest.mark.parametrize("make,needle", [
    (lambda p: p, "no log files found"),
    (lambda p: p / "missing", "no such directory"),
    (lambda p: (p / "f.log").write_text("x") and p / "f.log", "is a file"),
])
def test_bad_log_dirs_fail_with_one_line(tmp_path, make, needle):
    target = make(tmp_path)
    with pytest.raises(DiagnosticsError, match=needle):
        diagnose(target)
    r = run_cli("diagnose", str(target))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_only_garbage_files_is_a_clear_error(tmp_path):
    (tmp_path / "worker_0.log").write_bytes(b"\0\1\2" * 5000)
    r = run_cli("diagnose", str(tmp_path))
    assert r.returncode == 2 and "could be read" in r.stderr and "binary" in r.stderr


def test_cli_json_has_the_contract_fields(tmp_path):
    logs = tmp_path / "logs"
    write_port_rank_logs(logs, skew={}, events={0: (4, 1.0, "ERROR RuntimeError: boom")}, ranks=2, steps=6)
    out = tmp_path / "diag.json"
    r = run_cli("diagnose", str(logs), "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("first_failing_rank", "last_step", "reason", "ranks", "error_codes", "timeline"):
        assert key in d
    assert d["first_failing_rank"] == 0 and d["last_step"] == 4
    assert {r["rank"]: r["last_step"] for r in d["ranks"]} == {0: 4, 1: 6}
    assert json.loads(out.read_text())["first_failing_rank"] == 0
    assert not list(tmp_path.glob("*.tmp"))
    r = run_cli("diagnose", "--help")
    assert "Examples:" in r.stdout


def test_rank_without_any_log_is_no_output(tmp_path):
    logs = tmp_path / "logs"
    write_port_rank_logs(logs, skew={}, events={r: (6, 1800.0, "ERROR collective AllReduce timed out")
                                                for r in (0, 1, 3)})
    (logs / "rank_2.log").unlink()
    d = diagnose(logs)
    assert any("no log for rank(s) [2]" in w for w in d["warnings"])
    d = diagnose(logs, world_size=4)
    assert d["first_failing_rank"] == 2 and d["reason_kind"] == "no_output" and d["last_step"] is None
    r = run_cli("diagnose", str(logs), "--world-size", "4", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["first_failing_rank"] == 2


def _ms(level: str, module: str, pid: int, t: float, where: str, msg: str) -> str:
    import time as _time

    stamp = _time.strftime("%Y-%m-%d-%H:%M:%S", _time.gmtime(t)) + f".{int((t % 1) * 1000):03d}.000"
    return f"[{level}] {module}({pid},7f00,python):{stamp} [{where}] {msg}"


def test_scheduler_names_the_lost_rank_when_nobody_logged_an_error(tmp_path):
    # msrun-format logs of a job whose rank 1 froze (its heartbeat stopped with it): no worker logs an
    # error; the scheduler names rank 1. Rank 0 was killed by the cluster callback.
    t0 = 1_795_000_000.0
    (tmp_path / "worker_0.log").write_text("\n".join([
        _ms("WARNING", "DISTRIBUTED", 10, t0, "cluster_context.cc:428", "PostProcess] This node 0 rank id: 0"),
        "step 1 loss 1.0", "step 2 loss 0.9"]) + "\n")
    (tmp_path / "worker_1.log").write_text("\n".join([
        _ms("WARNING", "DISTRIBUTED", 11, t0, "cluster_context.cc:428", "PostProcess] This node 1 rank id: 1"),
        "step 1 loss 1.0"]) + "\n")
    (tmp_path / "scheduler.log").write_text("\n".join([
        _ms("ERROR", "DISTRIBUTED", 9, t0 + 40, "meta_server_node.cc:548",
            "UpdateTopoState] The node: 1 is timed out. It may exit with exception, please check this node's log."),
        "RuntimeError: The total number of timed out node is 1. Timed out node list is: [const vector]{1}, "
        "worker 1 is the first one timed out, please check its log."]) + "\n")
    d = diagnose(tmp_path)
    assert d["first_failing_rank"] == 1 and d["last_step"] == 1 and d["reason_kind"] == "lost"
    assert d["scheduler"] == {"timed_out_ranks": [1], "first_timed_out": 1}
    # with the cluster's kill message on rank 0, rank 0 is a consequence and rank 1 the stalled one
    with open(tmp_path / "worker_0.log", "a") as f:
        f.write(_ms("WARNING", "DISTRIBUTED", 10, t0 + 41, "init.cc:135", "operator()] Kill this process with SIGTERM.")
                + "\n")
    d = diagnose(tmp_path)
    assert d["first_failing_rank"] == 1 and d["reason_kind"] == "stall"
    assert {r["rank"]: r["status"] for r in d["ranks"]}[0] == "timed out (consequence)"
