"""Several nodes under `port train --launch-node N --supervise`: the supervisors of one run agree on each
incident and relaunch together.

Each node's supervisor watches only its own ranks (porting/launch/supervise.py), but a fault anywhere stops the
whole job: the other nodes' ranks wait in a collective until they time out. So the supervisors talk through
the run directory, which every node shares (the checkpoints are already read from it on resume):

- ``RUN/supervise/session``: node 0 writes a fresh id when it starts; every exchange of this supervised
  run lives under ``RUN/supervise/sessions/<id>/`` (an earlier supervised run's files are never read).
- ``launch_<e>/fault_node<k>.json``: node k saw a fault during launch ``e`` (what, when, which rank, its
  evidence). Every supervisor reads the others' each poll, so a rank killed on node 1 stops node 0's launch
  within a poll instead of after node 0's stall timeout.
- ``launch_<e>/stopped_node<k>``: node k has stopped its launch. Node 0 waits for every node's, so the last
  complete checkpoint cannot change under it, then writes
- ``launch_<e>/decision.json``: the incident as node 0 settles it (the first fault seen, by time), the step
  every node resumes from and the data windows to skip, or the stop. The other nodes wait for it and do
  what it says; node 0's ``RUN/incidents.jsonl`` is the run's record, node k's own view goes to
  ``RUN/supervise/incidents_node<k>.jsonl``.

A node whose supervisor does not answer within ``answer_s`` stops the run with a line that names it.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from pathlib import Path
from typing import Any, Callable

from model_zoo.files import plain_name, read_json_object, read_text, write_atomic
from porting.launch.supervise import SuperviseError
from porting.rundir.paths import RunDir

MAX_FILE = 1 << 20     # a message is a few hundred bytes; the bounds keep a damaged or planted one cheap
MAX_DEPTH = 16
SEEN = ("kind", "seen", "step", "verdict", "observed_rank", "suspect", "evidence", "skip_window")   # what a node saw
SETTLED = (*SEEN, "action", "resumed_from", "steps_lost")                                        # and what node 0 did


class PeersError(SuperviseError):
    """The supervisors of a multi-node run could not agree (one did not answer)."""


class Peers:
    """Node ``node`` of ``nodes``: its side of the exchange described in the module docstring."""

    def __init__(self, run_dir: Path, node: int, nodes: int, answer_s: float, poll_s: float = 0.5) -> None:
        self.root, self.node, self.nodes = RunDir(run_dir).supervise(), node, nodes
        self.answer_s, self.poll_s = answer_s, poll_s
        self.started = time.time()
        self._session: Path | None = None
        self.root.mkdir(parents=True, exist_ok=True)
        if node == 0:
            sid = f"{int(self.started)}-{secrets.token_hex(4)}"
            (self.root / "sessions" / sid).mkdir(parents=True)
            write_atomic(self.root / "session", sid + "\n", error=PeersError)
            self._session = self.root / "sessions" / sid

    def _dir(self, launch: int, wait: bool) -> Path | None:
        """This run's folder of launch ``launch``; node k > 0 reads node 0's session id (written after node k
        started, or shortly before: nodes are started together)."""
        if self._session is None:
            deadline = time.monotonic() + (self.answer_s if wait else 0)
            while True:
                p = self.root / "session"
                try:
                    fresh = p.stat().st_mtime >= self.started - 300
                except OSError:
                    fresh = False
                if fresh:   # a name inside RUN/supervise/sessions, never a path
                    sid = plain_name(read_text(p, what="supervise session", max_bytes=256, error=PeersError).strip(),
                                     where=str(p), key="session id", error=PeersError)
                    self._session = self.root / "sessions" / sid
                    break
                if time.monotonic() > deadline:
                    if not wait:
                        return None
                    raise PeersError(f"supervise: node 0's supervisor has not started ({p} missing or older than "
                                     "this node's start): start `port train --launch-node 0 --supervise` as well")
                time.sleep(self.poll_s)
        d = self._session / f"launch_{launch}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _read(self, path: Path) -> dict[str, Any] | None:
        """A message (None while it is not there); a damaged one stops the run with a line naming it."""
        if not path.is_file():
            return None
        d = read_json_object(path, what="supervise message", max_bytes=MAX_FILE, max_depth=MAX_DEPTH, error=PeersError)
        for key, kind in (("node", int), ("at", (int, float)), ("incident", dict), ("windows", list)):
            if key in d and (not isinstance(d[key], kind) or isinstance(d[key], bool)):
                raise PeersError(f"{path}: {key}: found {d[key]!r}, expected {getattr(kind, '__name__', 'a number')}; "
                                 "the file was edited or is not one port wrote")
        return d

    def faults(self, launch: int) -> list[dict[str, Any]]:
        """Every node's fault message of launch ``launch`` so far, first seen first."""
        d = self._dir(launch, wait=False)
        if d is None:
            return []
        found = [m for p in sorted(d.glob("fault_node*.json")) if (m := self._read(p)) is not None]
        return sorted(found, key=lambda m: float(m.get("at") or 0))

    def peer_fault(self, launch: int) -> dict[str, Any] | None:
        """The first fault another node reported during launch ``launch``, or None."""
        return next((m for m in self.faults(launch) if m.get("node") != self.node), None)

    def report(self, launch: int, inc: Any) -> None:
        """Tell the others what this node saw (once a launch)."""
        p = self._dir(launch, wait=True) / f"fault_node{self.node}.json"
        if not p.exists():
            write_atomic(p, json.dumps({"node": self.node, **dataclasses.asdict(inc)}, default=str), error=PeersError)

    def settle(self, launch: int, inc: Any, decide: Callable[[Any, int | None], str],
               latest_step: Callable[[], int | None], windows: list[tuple[int, int]]) -> tuple[Any, int | None]:
        """After this node stopped its launch: node 0 waits for every node to stop, takes the first fault any
        node saw as the incident, reads the last complete checkpoint and ``decide(incident, step)``s the
        action; the others wait for that decision. Returns (incident, resume step); ``windows`` gains the
        decision's data windows."""
        d = self._dir(launch, wait=True)
        write_atomic(d / f"stopped_node{self.node}", "", error=PeersError)
        if self.node == 0:
            self._wait(lambda: all((d / f"stopped_node{k}").exists() for k in range(self.nodes)),
                       f"every node's supervisor to stop launch {launch}",
                       lambda: [k for k in range(self.nodes) if not (d / f"stopped_node{k}").exists()])
            found = self.faults(launch)
            if found and found[0].get("node") != 0:   # another node saw the fault first: its view is the incident
                own = found[0]
                inc = _take(inc, own, SEEN)
                inc.seen = f"node {own.get('node')}: {inc.seen}"
            ck = latest_step()
            inc.resumed_from = ck
            inc.steps_lost = (inc.step or 0) - (ck or 0)
            inc.action = decide(inc, ck)
            write_atomic(d / "decision.json", json.dumps({"incident": dataclasses.asdict(inc), "resume_from": ck,
                                                          "windows": [list(w) for w in windows]}, default=str),
                         error=PeersError)
            return inc, ck
        dec = self._wait(lambda: self._read(d / "decision.json"), f"node 0's decision on launch {launch}", lambda: [0])
        own = inc.evidence
        inc = _take(inc, dec.get("incident") or {}, SETTLED)
        inc.evidence = inc.evidence or own
        for w in dec.get("windows") or []:
            if not (isinstance(w, list) and len(w) == 2 and all(type(x) is int for x in w)):
                raise PeersError(f"{d / 'decision.json'}: windows: found {w!r}, expected [first step, last step]")
            if tuple(w) not in windows:
                windows.append((w[0], w[1]))
        return inc, dec.get("resume_from")

    def _wait(self, ready: Callable[[], Any], what: str, missing: Callable[[], list[int]]) -> Any:
        deadline = time.monotonic() + self.answer_s
        while True:
            got = ready()
            if got:
                return got
            if time.monotonic() > deadline:
                raise PeersError(f"supervise: node {self.node} waited {self.answer_s:.0f} s for {what}; node(s) "
                                 f"{missing()} did not answer (is `port train --launch-node N --supervise` running "
                                 "there?); the run directory keeps its last complete checkpoint, continue with "
                                 "--resume")
            time.sleep(self.poll_s)


def _take(inc: Any, src: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """``inc`` with ``keys`` taken from another node's message; its evidence kept only when it names a folder
    of ``RUN/incidents`` (never a path out of the run directory)."""
    for key in keys:
        setattr(inc, key, src.get(key))
    ev = str(inc.evidence or "").split("/")
    inc.evidence = "/".join(ev) if len(ev) == 2 and ev[0] == "incidents" and ev[1] not in ("", ".", "..") else ""
    return inc
