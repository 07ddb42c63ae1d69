"""`port diagnose` on field logs: real excerpts from public issue threads (tests/diagnostics/fixtures/field,
each file headed by its URL) and the real CANN/HCCL logs in ../shared. Every format of issue 12's
grammar is covered: torch_npu/torch watchdog SeqNum, EI/EJ/EE/EL codes, EI0002 remote rank with group
and rankSize, fftsplus/notify/stream-sync timeouts, HCCL Cluster Exception Location, socket/connect
timeouts with the peer (mapped through --rank-table), OOM of torch_npu/MindSpore/CANN, torchrun and
msrun worker exits, one file split by [rankN]: prefixes, and plog directories."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from porting.cluster import generate
from benchmarks.diagnose_accuracy import score
from porting.diagnostics.diagnose import diagnose
from porting.diagnostics.suspect import FILE_OK

ROOT = Path(__file__).resolve().parents[2]
FIELD = Path(__file__).with_name("fixtures") / "field"
EXPECTED = yaml.safe_load((FIELD / "expected.yaml").read_text())


def one(tmp_path: Path, src: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    shutil.copy(src, d / src.name)
    return d


def test_corpus_is_complete_and_sourced():
    files = sorted(p.name for p in FIELD.glob("*.log"))
    runs = sorted(p.name + "/" for p in FIELD.iterdir() if p.is_dir())   # a run's own log directory
    assert len(files) >= 80 and set(files) | set(runs) == set(EXPECTED)
    readme = (FIELD / "README.md").read_text()
    for name in files:
        head = (FIELD / name).read_text().splitlines()[0]
        assert head.startswith("# source: https://"), name
        assert f"`{name}`" in readme, name
    for name in runs:   # port's own runs: described in the README, the logs as port and msrun wrote them
        assert f"`{name}`" in readme and any((FIELD / name).glob("rank_*.log")), name
    assert sum(w.get("split") == "heldout" for w in EXPECTED.values()) >= 20


TUNED = sorted(n for n, w in EXPECTED.items()
               if w.get("split", "tune") in ("tune", "tune38", "tune38b", "tune38c", "tune38d", "tune53"))
# tuning excerpts the model does not get right, kept visible rather than dropped (the expectation was written
# before the tool ran; a miss is not edited away). Each is a strict xfail: fixing one fails the test, so the
# fix shows and the entry is removed. paddle_72458: its EE1001 line names the class with a documented code, so
# the verdict is high where the expectation says medium.
KNOWN_MISSES = {
    "paddle_72458_aclinit_507008_ee1001.log": "EE1001 is a documented code: high, expected medium",
    "simpler_1019_aicpu_exception_device2.log": "expected medium (a 207001 cascade competes), got high",
    "vllm_ascend_237_swiglu_binary_info_config.log": "expected medium, got high (rank prefix + documented text)",
    "mindocr_615_getnext_task_fail_slow_data.log": "the device is on the task-fail line, not the GetNext one",
    "mxnet_18224_dataloader_worker_timed_out.log": "'Slow transform' follows a blank line, outside the block",
    "vllm_2682_nccl_watchdog_terminated_rank7.log": "expected medium, got low (read as a waiter)",
    "vllm_ascend_3196_comm_init_root_info_config_error_11.log": "expected low, got medium (a weak comm_init match)",
    # issue 38's first held-back batch (tune38): suspect and class right, the confidence expected otherwise
    "ms_swift_9135_enable_p2p_507899_rank54.log": "expected medium, got high",
    "vllm_ascend_8360_fftsplus_aicore_chip4_die1_device9.log": "expected high, got medium (chip 4 die 1 vs device 9)",
    "vllm_8054_aclnn_not_in_libopapi.log": "expected medium, got high",
    # issue 38's third held-back batch (tune38c)
    "gpustack_3352_set_visible_device_failed_device0.log": "the reason quotes the EE8888 line, not 'open device 0 failed'",
}


@pytest.fixture(scope="module")
def scored() -> dict[str, dict]:
    """Every corpus excerpt diagnosed once (under a neutral file name), scored as the benchmark does; issue 53's
    held-back batch is scored by the benchmark's runs only (BENCHMARKS.md), never read here."""
    return {name: score(name, want) for name, want in EXPECTED.items() if want.get("split") != "heldout53"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[n]))
                                  if n in KNOWN_MISSES else n for n in TUNED])
def test_field_fixture_verdict(scored, name):
    assert scored[name]["pass"], scored[name]


@pytest.mark.parametrize("kind", ["consequence", "peer", "device", "markerless", "undetermined"])
def test_each_kind_of_issue_28_miss_is_right_on_real_excerpts(scored, kind):
    # the expected verdicts were written before the tool ran on these excerpts (expected.yaml, split tune)
    cases = [r for n, r in scored.items() if kind in r["kinds"] and r["split"] == "tune" and n not in KNOWN_MISSES]
    assert len(cases) >= 2 and all(r["pass"] for r in cases), [r for r in cases if not r["pass"]]


def test_held_back_excerpts_stay_at_their_measured_accuracy(scored):
    # BENCHMARKS.md records 20/25 for the held-back split (never tuned on); a change that loses one fails
    held = [r for r in scored.values() if r["split"] == "heldout"]
    assert len(held) >= 20 and sum(r["pass"] for r in held) >= 20


def test_no_documented_fault_reads_as_no_failure_and_undetermined_is_not_high(scored):
    for name, r in scored.items():
        assert not r["no_failure_found"], name
        got = r["got"]
        if got["suspect"] == "file" and got["class"] not in FILE_OK:
            assert got["confidence"] != "high", (name, got)
        for text in (got["reason"], got["why"]):
            assert not re.search(r"\b(a|an) (a|an)\b", text), (name, text)


def test_json_carries_every_entity_with_its_line(tmp_path):
    logs = one(tmp_path, FIELD / "vllm_ascend_8186_el0001_device1_lost_heartbeat.log")
    r = subprocess.run([sys.executable, "-m", "porting", "diagnose", str(logs), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["suspect"]["text"] == "device 1" and d["cause_class"] == "device_fault"
    ents = {(x["type"], x["id"], x["line"]) for x in d["entities"]}
    # line 7 of the file: "Device[1] lost heartbeat.", line 5: "halCqReportRecv failed: device_id=1"
    assert ("device", 1, 7) in ents and ("device", 1, 8) in ents and ("pid", 389, 3) in ents
    lines = (FIELD / "vllm_ascend_8186_el0001_device1_lost_heartbeat.log").read_text().splitlines()
    assert d["entities"] and all(str(x["id"]) in lines[x["line"] - 1] for x in d["entities"])


def test_rank_prefixes_split_one_file_into_ranks(tmp_path):
    d = diagnose(one(tmp_path, FIELD / "basicsr_737_workncll_same_seqnum.log"))
    files = {r["rank"]: r["files"] for r in d["ranks"]}
    assert files[1] == ["basicsr_737_workncll_same_seqnum.log[rank1]"]
    assert all(r["status"] != "no error" for r in d["ranks"] if isinstance(r["rank"], int))


def test_missing_ranks_become_the_suspects_with_world_size(tmp_path):
    # ranks 0,3,4 report SeqNum 7753; with --world-size 5, ranks 1 and 2 never reported
    d = diagnose(one(tmp_path, FIELD / "llamafactory_6269_reduce_scatter_seqnum.log"), world_size=5)
    assert d["first_failing_rank"] == 1 and d["confidence"] == "medium"
    assert "rank(s) [1, 2] never reported" in d["reason"]


def test_socket_peer_is_mapped_to_a_rank_through_the_rank_table(tmp_path):
    table = generate.generate([{"server_id": "node_0", "host_ip": "10.0.0.1",
                                "devices": [{"device_id": i, "device_ip": f"192.168.0.{i + 1}"} for i in range(8)]},
                               {"server_id": "node_1", "host_ip": "0.104.99.143",
                                "devices": [{"device_id": i, "device_ip": f"192.168.1.{i + 1}"} for i in range(8)]}])
    rt = tmp_path / "rank_table.json"
    generate.write_table(table, rt)
    logs = one(tmp_path, FIELD / "opensora_667_c10d_failed_to_connect.log")
    d = diagnose(logs, rank_table=rt)
    # a connect timeout says who waited; the address maps to rank 8, still a waiter's evidence: medium
    assert d["first_failing_rank"] == 8 and d["confidence"] == "medium" and d["role"] == "waiter"
    assert "the rank table maps to rank 8" in d["reason"]
    r = subprocess.run([sys.executable, "-m", "porting", "diagnose", str(logs), "--rank-table", str(rt), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["first_failing_rank"] == 8
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 100_000 + "]" * 100_000)
    r = subprocess.run([sys.executable, "-m", "porting", "diagnose", str(logs), "--rank-table", str(bad)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "nests deeper" in r.stderr


def test_text_report_says_how_sure_and_what_to_collect(tmp_path):
    r = subprocess.run([sys.executable, "-m", "porting", "diagnose",
                        str(one(tmp_path, FIELD / "vllm_ascend_3413_ei0002_remote_rank_24.log"))],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "FIRST FAILING RANK: 24" in r.stdout and "confidence: medium" in r.stdout
    assert "collect next: the log and plog of remote rank 24" in r.stdout


@pytest.fixture(scope="module")
def shared_logs(shared) -> Path:
    return shared / "data" / "ascend" / "logs"


@pytest.mark.parametrize("name,rank,kind,code", [
    ("mindspore_docs_cann_error_cases/12_EI0002_notify_wait_timeout.log", 0, "comm_timeout", "EI0002"),
    ("mindspore_docs_cann_error_cases/15_EJ0001_HCCP_Initialization_Failure.log", None, None, "EJ0001"),
    ("mindspore_docs_cann_error_cases/07_EE9999_On_Chip_Video_Memory_Allocation_Failure.log", None, "oom", "EE9999"),
    ("mindspore_docs_cann_error_cases/11_EI0006_Socket_Build_Timeout.log", None, None, "EI0006"),
    # MindCluster FaultDiag's parser example mixes lines of several jobs; HCCL's own heartbeat report
    # (INFO "rank [ip/5] status[LOST]", read since issue 28) names rank 5 first, rank 2 later (medium)
    ("mind-cluster-faultdiag-fixtures/st_module_testcase_rc_parse_example.log", 5, "comm_timeout", None),
])
def test_shared_real_logs(tmp_path, shared_logs, name, rank, kind, code):
    d = diagnose(one(tmp_path, shared_logs / name))
    assert d["reason_kind"] != "none" and d["why"]
    if rank is not None:
        assert d["first_failing_rank"] == rank, d["reason"]
    if kind is not None:
        assert d["reason_kind"] == kind
    if code is not None:
        assert any(c["code"] == code and c["next_step"] for c in d["error_codes"])


def test_plog_directory_layout(tmp_path, shared_logs):
    # ~/ascend/log/{run,debug}/plog/plog-PID_TS.log as CANN writes them: ranks from the run plogs' SetupAgent lines
    src = shared_logs / "mind-cluster-faultdiag-fixtures"
    for f in src.glob("st_event_timeout_testcase_*"):
        kind = "run" if "_run_plog_" in f.name else "debug"
        dest = tmp_path / "ascend" / "log" / kind / "plog"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest / f.name.split("_plog_")[-1])
    d = diagnose(tmp_path / "ascend")
    assert d["formats"].get("plog", 0) >= 4
    assert sorted(r["rank"] for r in d["ranks"]) == [0, 1, 2]
    assert d["first_failing_rank"] in (0, 1, 2) and d["why"]


# ------------------------------------------------------------------ local and group-local ranks -> global
EGOVLP = FIELD / "egovlp_21_torchrun_exitcode_minus9.log"
EI0002_24 = FIELD / "vllm_ascend_3413_ei0002_remote_rank_24.log"


def test_torchrun_local_rank_becomes_global_with_the_launch_layout_the_log_shows(tmp_path):
    # the real exit line (showlab/EgoVLP#21), pasted with the launch command above it, in the form users
    # quote it (karpathy/nanoGPT#222: torchrun --nproc_per_node=8 --nnodes=2 --node_rank=1 ...)
    d = tmp_path / "logs"
    d.mkdir()
    (d / "node1.log").write_text("torchrun --nproc_per_node=4 --nnodes=2 --node_rank=1 --master_addr=10.0.0.1 "
                                 "--master_port=1234 run.py\n" + EGOVLP.read_text())
    r = diagnose(d)
    assert r["first_failing_rank"] == 7 and r["reason_kind"] == "crash"
    assert "local_rank 3 on node 1 with nproc_per_node 4 (from the log) is global rank 7" in r["reason"]
    # torch elastic's rendezvous block says the same (group_rank=N, local_world_size=M)
    (d / "node1.log").write_text("  group_rank=1\n  group_world_size=2\n  local_world_size=4\n" + EGOVLP.read_text())
    assert diagnose(d)["first_failing_rank"] == 7


def test_torchrun_local_rank_without_a_layout_says_what_is_missing_or_uses_the_rank_table(tmp_path):
    d = one(tmp_path, EGOVLP)
    r = diagnose(d)
    assert r["first_failing_rank"] == f"file:{EGOVLP.name}"
    assert "names local_rank 3 only" in r["reason"] and "node rank and nproc_per_node" in r["reason"]
    # a one-server rank table: node 0, whose 4th rank id is the global rank
    table = generate.generate([{"server_id": "10.0.0.1", "devices": [{"device_id": i} for i in range(4)]}])
    rt = tmp_path / "rt.json"
    generate.write_table(table, rt)
    r = diagnose(d, rank_table=rt)
    assert r["first_failing_rank"] == 3 and "the rank table's server 0" in r["reason"]
    # two servers and no node rank in the log: still not mappable, and it says so
    two = generate.generate([{"server_id": f"10.0.0.{n}",
                              "devices": [{"device_id": i, "device_ip": f"10.1.{n}.{i}"} for i in range(4)]}
                             for n in (1, 2)])
    rt2 = tmp_path / "rt2.json"
    generate.write_table(two, rt2)
    r = diagnose(d, rank_table=rt2)
    assert r["first_failing_rank"] == f"file:{EGOVLP.name}" and "does not show the node rank" in r["reason"]


def plog(rank_in_world: int, world: int, group_rank: int, group: str, size: int) -> str:
    """A CANN plog of one process with HCCL's communicator set-up lines, in the formats MindCluster
    FaultDiag's plog parser (ascend_fd) documents."""
    head = "[INFO] HCCL(7001,python):2025-10-11-15:00:0{}.000.000 [op_base.cc:{}][HCCL_TRACE]"
    return (head.format(1, 210) + f"HcclCommInitRootInfo success,take time [237063]us, rankNum[{world}], "
            f"rank[{rank_in_world}], rootInfo identifier[hccl_world_group], server[10.0.0.4], device[0]\n"
            + head.format(2, 211) + f"HcclCommInitRootInfo success,take time [227304]us, rankNum[{size}], "
            f"rank[{group_rank}], rootInfo identifier[{group}], server[10.0.0.4], device[0]\n")


def test_ei0002_remote_rank_of_a_sub_group_maps_to_the_global_rank_when_a_plog_shows_the_group(tmp_path):
    d = one(tmp_path, EI0002_24)
    r = diagnose(d)   # alone: group-local, and which group
    assert r["first_failing_rank"] == 24 and "group-local rank" in r["reason"] and "group_name_1654" in r["reason"]
    # the plog of the process that is rank 24 of group_name_1654 (global rank 120 of 128)
    (d / "plog").mkdir()
    (d / "plog" / "plog-7001_20251011150000000.log").write_text(plog(120, 128, 24, "group_name_1654", 32))
    r = diagnose(d)
    assert r["first_failing_rank"] == 120 and r["reason_kind"] == "comm_timeout"
    assert "remote rank 24 of communication group group_name_1654 (rankSize 32), which is global rank 120" in r["reason"]
    assert "plog-7001_20251011150000000.log" in r["reason"] and "global rank 120's log" in r["collect_next"][0]
    # the same group-local number in another group does not map
    (d / "plog" / "plog-7001_20251011150000000.log").write_text(plog(120, 128, 24, "group_name_99", 32))
    assert diagnose(d)["first_failing_rank"] == 24
