"""The suspect a verdict names, and the confidence it has earned.

The suspect is the most specific entity the evidence supports: the peer when the event is about a peer
(HCCL's heartbeat report names a lost rank; a transport or socket set-up names its destination rank),
else a rank, else a device (NPU / chip, with its PID), else a host, else the file. Which rank: the one
a file name gives (``worker_3.log``), else one named in the event's own block, else a device named there
(a ``[rank7]:`` warning elsewhere in a pasted file is another process), else the file's rank.

Confidence is high only when the evidence names one entity consistently and the cause class dominates
(a documented text that says why, an entity more specific than the file where the class needs one);
each shortfall is said in one clause, with what to collect next.
"""

from __future__ import annotations

from porting.diagnostics.grammar import Event

# classes whose cause is clear from the text alone, even when it names no rank or device
FILE_OK = {"memory", "host_oom", "process_exit", "config", "address_port", "numerical"}
PEER_CLASSES = {"nic_link_init", "socket_timeout", "collective_timeout"}


def _first(ents: list[dict], types: tuple[str, ...], context: bool = False):
    return next((x["id"] for x in ents if x["type"] in types and bool(x.get("context")) == context), None)


def _pid_devices(view) -> dict[int, int]:
    """PID -> device, from lines of the view that name both (``(PID:324, Device:5, RankID:-1)``)."""
    out: dict[int, int] = {}
    for e in getattr(view, "events", []):
        by_line: dict[int, dict] = {}
        for x in e.entities:
            if x["type"] in ("pid", "device"):
                by_line.setdefault(x["line"], {})[x["type"]] = x["id"]
        for d in by_line.values():
            if "pid" in d and "device" in d:
                out.setdefault(d["pid"], d["device"])
    return out


def _pids(view) -> set:
    return {x["id"] for e in getattr(view, "events", []) for x in e.entities if x["type"] == "pid"}


def entity_of(view, e: Event) -> dict:
    """The suspect entity of one event on one view (a rank's or a file's merged logs)."""
    ents = e.entities
    own = {x["id"] for x in ents if x["type"] == "pid" and not x.get("context")}
    before = {x["id"] for x in ents if x["type"] == "pid" and x.get("context")}
    if own and before and not own & before:
        ents = [x for x in ents if not x.get("context")]   # the lines before it are another process's
    own_pid = _first(ents, ("pid",))
    pid = own_pid if own_pid is not None else _first(ents, ("pid",), True)
    # the logical device where the block names one (device_id=2 beside "device(chipId:0,dieId:0)"): chip and die
    # are the physical place, kept as details (entities from the line that carries them)
    device = _first(ents, ("device",))
    device = device if device is not None else _first(ents, ("chip",))
    ctx_device = _first(ents, ("device",), True)
    ctx_device = ctx_device if ctx_device is not None else _first(ents, ("chip",), True)
    if device is None and ctx_device is None and pid is not None:
        ctx_device = _pid_devices(view).get(pid)
    extra = {k: v for k, v in (("pid", pid), ("chip", _first(ents, ("chip",))), ("die", _first(ents, ("die",))),
                               ("nic_ip", _first(ents, ("nic_ip",))),
                               # the operator, from the block or the lines just before it ("call aclnnArange failed")
                               ("op", _first(ents, ("op",)) if _first(ents, ("op",)) is not None
                                else _first(ents, ("op",), True))) if v is not None}
    lost, peer = _first(ents, ("lost_rank",)), _first(ents, ("peer_rank",))
    if lost is not None:
        return {"entity": "rank", "id": lost, "text": f"rank {lost}", "via": "lost peer", **extra}
    if peer is not None and e.cause in PEER_CLASSES:
        return {"entity": "rank", "id": peer, "text": f"rank {peer}", "via": "peer", **extra}
    # the remote end of a link a line names (an ERROR CQE's peer server, an EI0006 dstRank's server): the evidence
    # is about that end, not the rank that printed it (entities from the line that carries them)
    peer_host = _first(ents, ("peer_host",))
    if peer_host is not None and e.cause in PEER_CLASSES:
        return {"entity": "host", "id": peer_host, "text": f"host {peer_host}", "via": "peer host", **extra}
    rank = view.rank if isinstance(view.rank, int) and view.rank_by_name else None
    for found in (lambda: _first(ents, ("rank",)), lambda: _first(ents, ("rank",), True),
                  # the rank a file's text names is this event's when one process wrote the file
                  lambda: view.rank if isinstance(view.rank, int) and len(_pids(view)) <= 1 else None):
        rank = rank if rank is not None else found()
    if rank is None and device is None:
        rank = view.rank if isinstance(view.rank, int) else e.facts.get("reporter")
    dev = device if device is not None else ctx_device
    if rank is not None and device is not None and e.cause == "device_fault":
        # a fault of the NPU itself, on a line that names the device: the device is the suspect (its rank a detail;
        # a "[rank0]:" prefix is the process that printed it, the device the one that failed)
        return {"entity": "device", "id": device, "text": f"device {device}", "via": "device", "rank": rank, **extra}
    if rank is not None:
        return {"entity": "rank", "id": rank, "text": f"rank {rank}", "via": "rank",
                **({"device": dev} if dev is not None else {}), **extra}
    if dev is not None:
        return {"entity": "device", "id": dev, "text": f"device {dev}", "via": "device", **extra}
    host = _first(ents, ("host",))
    host = host if host is not None else _first(ents, ("peer_host",))
    if host is not None:
        return {"entity": "host", "id": host, "text": f"host {host}", "via": "host", **extra}
    return {"entity": "file", "id": e.source, "text": "file", "via": "file", **extra}


def describe(s: dict) -> str:
    """'device 3 (pid 45464)', 'rank 5 (device 5, pid 324)', 'file'."""
    parts = [f"{k} {s[k]}" for k in ("device", "chip", "die", "host", "pid", "nic_ip", "op", "signal") if k in s
             and not (k in ("device", "chip") and s["entity"] == "device" and s[k] == s["id"])]
    return s["text"] + (f" ({', '.join(parts)})" if parts else "")


def _aliases(s: dict) -> set[str]:
    """The names one suspect goes by: its text, and the rank / device it carries as a detail."""
    out = {s["text"]}
    if s.get("entity") == "device" and s.get("rank") is not None:
        out.add(f"rank {s['rank']}")
    if s.get("entity") == "rank" and s.get("device") is not None:
        out.add(f"device {s['device']}")
    return out


def earned(view, e: Event, suspect: dict, competitors: list[tuple[object, Event]]) -> tuple[str, str, tuple[str, ...]]:
    """(confidence, why not higher, what to collect next) for a cause verdict."""
    short, collect = [], []
    logical = {x["id"] for x in e.entities if x["type"] == "device"}
    chips = {x["id"] for x in e.entities if x["type"] == "chip"}
    # a logical device and a different chip id may be one NPU (ASCEND_RT_VISIBLE_DEVICES renumbers), or two
    devices = logical | chips if logical and chips - logical else logical or chips
    # a competitor that names no entity (the file) does not contradict the suspect
    # one process names itself as a rank and as a device ("[rank1]:" beside "Device:1"): the same suspect
    same = _aliases(suspect)
    others = sorted({s2["text"] for s2 in (entity_of(v, x) for v, x in competitors)
                     if s2["text"] != "file" and not _aliases(s2) & same})
    if not e.sure:
        short.append("the text names the failure's class but not its reason")
        collect.append("the full block of that error (CANN prints the reason in the indented lines below it)")
    if e.cause == "comm_init":
        short.append("a communicator that cannot be created is often the fallout of another rank's failure")
        collect.append("the logs of the other ranks of the group, for an earlier error")
    if suspect["entity"] == "file" and e.cause not in FILE_OK:
        short.append("the text names no rank or device")
        collect.append("the process's rank or device: its launcher log line, or `npu-smi info` with its PID")
    if suspect.get("via") == "peer":
        short.append(f"only the reporting side names {suspect['text']}")
        collect.append(f"{suspect['text']}'s own log and plog")
    if getattr(e, "fault", "") == "error_cqe":
        short.append("an ERROR CQE says the link to the remote end failed: the network between the two ends, or the "
                     "remote process")
        collect.append("`hccn_tool -i <device> -link_stat -g` on both ends, and the remote end's own log")
    if len(devices) > 1:
        short.append(f"the block names devices {sorted(devices)}")
    if others:
        short.append(f"the same class also shows on {', '.join(others[:4])}")
        collect.append(f"the logs of {', '.join(others[:4])}, to see which failed first (clocks, plog times)")
    return ("medium" if short else "high"), "; ".join(short), tuple(collect)
