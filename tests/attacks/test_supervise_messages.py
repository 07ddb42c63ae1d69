"""Hostile files in the exchange of a multi-node supervised run (porting/launch/nodes.py): the supervisors
read what the other nodes wrote in the shared run directory, so a damaged or planted message stops the run
with one line naming the file, is bounded in size and depth, and never names a path outside the run
directory. Also `port report`'s reading of RUN/incidents.jsonl."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from porting.report.incidents import read_incidents
from porting.launch.nodes import Peers, PeersError
from porting.launch.supervise import Incident
from tests.attacks import inputs as I


def _incident(**kw) -> Incident:
    return Incident(**{**dict(n=1, at=time.time(), kind="exit", seen="rank 3: its process 1 is gone", step=4,
                              verdict=None, observed_rank=3, suspect=3), **kw})


def _pair(tmp_path: Path) -> tuple[Peers, Peers, Path]:
    p0, p1 = Peers(tmp_path, 0, 2, answer_s=0.5, poll_s=0.05), Peers(tmp_path, 1, 2, answer_s=0.5, poll_s=0.05)
    launch = tmp_path / "supervise" / "sessions" / (tmp_path / "supervise" / "session").read_text().strip() / "launch_0"
    launch.mkdir(parents=True)
    return p0, p1, launch


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 600, msg
    return msg


@pytest.mark.parametrize("sid", ["../../../etc", "/etc", "a/b", ".."])
def test_a_session_id_that_is_a_path_is_refused(tmp_path, sid):
    Peers(tmp_path, 0, 2, answer_s=0.2)
    (tmp_path / "supervise" / "session").write_text(sid)
    with pytest.raises(PeersError) as e:
        Peers(tmp_path, 1, 2, answer_s=0.2, poll_s=0.05).report(0, _incident())
    assert "expected a plain file name" in _one_line(e) and str(tmp_path / "supervise" / "session") in str(e.value)
    assert not (tmp_path / "etc").exists() and not list(tmp_path.parent.glob("launch_0"))


@pytest.mark.parametrize("body", [b"x" * (2 << 20), I.deep_json().encode(), b"[1, 2]", b"\xff\xfe not utf-8",
                                  json.dumps({"node": True, "at": 1}).encode(), json.dumps({"node": 1, "at": "soon"}).encode()],
                         ids=["2 MiB", "nested", "a list", "not utf-8", "node is a boolean", "at is text"])
def test_a_damaged_fault_message_stops_with_one_line_naming_it(tmp_path, body):
    p0, _, launch = _pair(tmp_path)
    (launch / "fault_node1.json").write_bytes(body)
    with pytest.raises(PeersError) as e:
        p0.peer_fault(0)
    assert str(launch / "fault_node1.json") in _one_line(e)


def test_a_damaged_decision_stops_node_k_with_one_line(tmp_path):
    _, p1, launch = _pair(tmp_path)
    (launch / "decision.json").write_text(json.dumps({"incident": {}, "resume_from": 2, "windows": [["a", 1]]}))
    with pytest.raises(PeersError) as e:
        p1.settle(0, _incident(kind="peer"), lambda i, c: "x", lambda: None, [])
    assert "windows" in _one_line(e) and "decision.json" in str(e.value)


@pytest.mark.parametrize("evidence", ["/etc", "../../outside", "incidents/../../x", "incidents/1/../../.."])
def test_an_adopted_fault_never_points_outside_the_incidents_folder(tmp_path, evidence):
    p0, p1, launch = _pair(tmp_path)
    (launch / "fault_node1.json").write_text(json.dumps({"node": 1, "at": time.time(), "kind": "exit", "seen": "x",
                                                         "observed_rank": 2, "suspect": 2, "evidence": evidence}))
    (launch / "stopped_node1").write_text("")
    inc, _ = p0.settle(0, _incident(kind="peer"), lambda i, c: "relaunched", lambda: None, [])
    assert inc.suspect == 2 and inc.evidence == ""


def test_a_deep_or_broken_incident_line_is_skipped_by_the_report(tmp_path):
    good = json.dumps({"n": 1, "kind": "exit"})
    (tmp_path / "incidents.jsonl").write_text("\n".join([I.deep_json(), "{not json", good]) + "\n")
    assert read_incidents(tmp_path) == [{"n": 1, "kind": "exit"}]


def test_an_incident_number_already_there_is_skipped_and_a_planted_link_is_not_written_through(tmp_path):
    """`RUN/incidents/1` planted (or left by an earlier session): the snapshot takes the next free name instead of
    crashing; `RUN/incidents.jsonl` a link to a file outside the run: refused in one line, the file unchanged."""
    from porting.launch.supervise import _record, snapshot
    from porting.rundir.records import RunDirError

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "rank_0.log").write_text("step 1/2 loss 1.0\n")
    (run / "incidents" / "1").mkdir(parents=True)
    (run / "incidents" / "1" / "planted.txt").write_text("x")
    dest = snapshot(run, 1, {})
    assert dest == run / "incidents" / "1.2" and (dest / "logs" / "rank_0.log").is_file()
    assert sorted(p.name for p in (run / "incidents" / "1").iterdir()) == ["planted.txt"]
    outside = tmp_path / "outside.jsonl"
    outside.write_text("mine\n")
    (run / "incidents.jsonl").symlink_to(outside)
    with pytest.raises(RunDirError, match="incidents.jsonl: cannot be appended to"):
        _record(run / "incidents.jsonl", _incident())
    assert outside.read_text() == "mine\n"
    (run / "supervise").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(RunDirError, match="is a link"):
        _record(run / "supervise" / "incidents_node1.jsonl", _incident())
    assert not (tmp_path / "incidents_node1.jsonl").exists()
