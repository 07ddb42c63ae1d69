"""A verdict from partial evidence: when the logs hold only some ranks (often one file pasted into an
issue), name the suspect the timeouts point at, say how sure that is and why, and what to collect
next.

Three kinds of evidence, strongest first:

1. **watchdog SeqNum** (torch_npu / torch ``WorkHCCL(SeqNum=N)``): every rank counts its
   collectives; the rank with the lowest SeqNum is behind (it never entered the collective the
   others wait in). All equal: every reporting rank waits in the same collective, so the missing one
   is a rank that did not report (outside these logs).
2. **named peers**: HCCL ``Cluster Exception Location[IP/ID]`` (a heartbeat report naming the faulty
   rank) and ``remote rank: [N]`` of EI0002/EI0006. A remote rank is the rank *within the group*
   (``group:[...]``, ``rankSize[...]``); with the default (world) group it is the global rank. A
   sub-group's rank maps to a global rank when a plog here shows which process is that rank of that
   group (``HcclCommInitRootInfo success ... rank[N] ... identifier[GROUP]``); otherwise the verdict
   says the rank is group-local and which group.
3. **socket peers**: a connect/socket timeout names the peer address; with ``--rank-table`` the
   address maps to a rank (``device_ip``/``host_ip``), else the verdict names the address.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from porting.diagnostics.grammar import Event
from porting.diagnostics.links import from_links
from porting.diagnostics.outcome import Verdict
from porting.diagnostics.ranks import RankView

ENTRY_LOG = "HCCL_ENTRY_LOG_ENABLE=1 on a rerun (logs every collective's entry per rank)"


@dataclasses.dataclass(frozen=True)
class EvidenceContext:
    """What the user told us besides the logs (the world size; from the rank table: who an address is
    and each server's rank ids in server_list order), and what the logs said about communication
    groups: (group, rank within the group) -> global rank, from HCCL's communicator set-up lines of
    processes whose global rank is known."""
    world_size: int | None = None
    rank_of_ip: dict[str, int] = dataclasses.field(default_factory=dict)
    server_ranks: tuple[tuple[int, ...], ...] = ()
    group_members: dict[tuple[str, int], tuple[int, str]] = dataclasses.field(default_factory=dict)
    host_of_ip: dict[str, str] = dataclasses.field(default_factory=dict)   # rank table: device/host IP -> server


def global_from_local(facts: dict, ctx: EvidenceContext) -> tuple[int | None, str]:
    """torch elastic's ``local_rank: L`` as a global rank: with the node rank and nproc_per_node the
    log shows (global = node_rank x nproc_per_node + L), or the rank table's server of that node (its
    L-th rank id; a one-server table is node 0). Else None, and what is missing."""
    local = facts["local_rank"]
    node, per = facts.get("node_rank"), facts.get("nproc_per_node")
    if node is None and len(ctx.server_ranks) == 1:
        node = 0
    if node is not None and node < len(ctx.server_ranks) and local < len(ctx.server_ranks[node]):
        g = ctx.server_ranks[node][local]
        return g, f"; local_rank {local} on node {node} is global rank {g} (the rank table's server {node})"
    if node is not None and per:
        g = node * per + local
        return g, (f"; local_rank {local} on node {node} with nproc_per_node {per} (from the log) is global "
                   f"rank {g}")
    missing = " and ".join(w for w, v in (("the node rank", node), ("nproc_per_node", per)) if v is None)
    return None, (f"; torchrun names local_rank {local} only: the global rank is node_rank x nproc_per_node + "
                  f"{local}, and this log does not show {missing} (paste the launch command, or pass --rank-table)")


def _events(views: dict[int | str, RankView]) -> list[tuple[RankView, Event]]:
    return [(v, e) for v in views.values() for e in v.events]


def _reporter(v: RankView, e: Event) -> int | None:
    rep = e.facts.get("reporter")
    return rep if rep is not None else (v.rank if isinstance(v.rank, int) else None)


def _from_seqnums(views: dict[int | str, RankView], ctx: EvidenceContext) -> Verdict | None:
    seqs: dict[int, tuple[int, str, Event]] = {}
    for v, e in _events(views):
        if "seq" in e.facts and (rank := _reporter(v, e)) is not None:
            if rank not in seqs or e.facts["seq"] < seqs[rank][0]:
                seqs[rank] = (e.facts["seq"], e.facts.get("op", "?"), e)
    if not seqs:
        return None
    low = min(s for s, _, _ in seqs.values())
    behind = sorted(r for r, (s, _, _) in seqs.items() if s == low)
    ahead = sorted(r for r, (s, _, _) in seqs.items() if s > low)
    if ahead:
        r = behind[0]
        top = max(s for s, _, _ in seqs.values())
        why = (f"watchdog SeqNum: rank(s) {behind} at {low} while rank(s) {ahead[:8]} reached up to {top}; the "
               f"lowest SeqNum is behind: it never entered the collective the others wait in")
        return Verdict(r, None, f"behind: rank {r} is at collective SeqNum {low} ({seqs[r][1]}) while others "
                                f"are at up to {top}; the others' watchdog timeouts wait for it", "comm_timeout",
                       (seqs[r][2].as_dict(),), "high" if len(behind) == 1 else "medium", why,
                       (f"rank {r}'s own log and plog around SeqNum {low}: what it did instead (a hang in the data "
                        f"loader, a longer step, an exception)", ENTRY_LOG))
    world = ctx.world_size or max((e.facts.get("rank_size", 0) for _, e in _events(views)), default=0) or None
    missing = sorted(set(range(world)) - set(seqs)) if world else []
    if missing:
        why = (f"every reporting rank ({sorted(seqs)[:8]}) times out at the same SeqNum {low}; rank(s) {missing[:8]} "
               f"of {world} did not report, so one of them did not arrive")
        return Verdict(missing[0], None, f"not in these logs: rank(s) {missing[:8]} never reported while every other "
                                         f"rank waits at SeqNum {low}", "comm_timeout", (), "medium", why,
                       (f"the logs of rank(s) {missing[:8]} (they are missing here)", ENTRY_LOG))
    first = sorted(seqs)[0]
    return Verdict(first, None, f"all reporting ranks ({sorted(seqs)[:8]}) wait in the same collective (SeqNum "
                                f"{low}); the rank that did not arrive is not in these logs", "comm_timeout",
                   (seqs[first][2].as_dict(),), "low",
                   "the same SeqNum everywhere: the watchdog cannot tell who is behind",
                   ("the logs of every rank of the job (pass --world-size to list the missing ones)",
                    "each rank's CANN plog (~/ascend/log/debug/plog)", ENTRY_LOG))


def _from_named_peers(views: dict[int | str, RankView], ctx: EvidenceContext) -> Verdict | None:
    remote: Counter = Counter()
    groups: dict[int, tuple[str | None, int | None]] = {}
    sample: dict[int, Event] = {}
    for _v, e in _events(views):
        # heartbeat reports (located / crimer ranks) are heartbeat.py's: decide() reads them first
        if "located_rank" not in e.facts and e.facts.get("remote_rank") is not None:
            r = e.facts["remote_rank"]
            remote[r] += 1
            groups.setdefault(r, (e.facts.get("group"), e.facts.get("rank_size")))
            sample.setdefault(r, e)
    logged = {v.rank for v in views.values() if v.files}
    if not remote:
        return None
    r, n = remote.most_common(1)[0]
    group, size = groups[r]
    e = sample[r]
    member = ctx.group_members.get((group, r)) if group else None
    if member is not None:
        g, source = member
        if g in logged and any(v.rank == g and v.first_cause for v in views.values()):
            return None   # its own log is here and shows a cause: the cause logic reads it
        return Verdict(g, None, f"waited for: {n} timeout report(s) wait for remote rank {r} of communication group "
                                f"{group}" + (f" (rankSize {size})" if size else "") + f", which is global rank {g} "
                                f"(HCCL's communicator set-up line in {source} says so)", "comm_timeout",
                       (e.as_dict(),), "high" if n > 1 else "medium",
                       f"EI0002/EI0006 name remote rank {r} of group {group}; {source} is rank {r} of that group "
                       f"and global rank {g}", (f"global rank {g}'s log and plog", ENTRY_LOG))
    if r in logged and not group:
        return None   # that rank's own log is here: the cause/stall logic reads it
    scope = (f"rank {r} of communication group {group}" + (f" (rankSize {size})" if size else "")
             if group else f"rank {r}")
    note = ("; a remote rank is numbered within its group: this is the group-local rank, and no log here says "
            f"which global rank is rank {r} of {group} (each rank's plog does: 'HcclCommInitRootInfo success ... "
            f"rank[{r}] ... identifier[{group}]')" if group else "")
    return Verdict(r, None, f"waited for: {n} timeout report(s) wait for remote {scope}, whose log is not here{note}",
                   "comm_timeout", (e.as_dict(),), "medium" if n == 1 else "high",
                   f"EI0002/EI0006 name remote rank {r}" + (f" of group {group}" if group else ""),
                   (f"the log and plog of remote {scope}" + (" (every rank's plog, to map it to a global rank)"
                                                             if group else ""), ENTRY_LOG))


def _from_socket_peers(views: dict[int | str, RankView], ctx: EvidenceContext) -> Verdict | None:
    peers: Counter = Counter()
    sample: dict[str, Event] = {}
    for _v, e in _events(views):
        if e.kind == "comm_timeout" and e.facts.get("peer"):
            peers[e.facts["peer"]] += 1
            sample.setdefault(e.facts["peer"], e)
    if not peers:
        return None
    ip, n = peers.most_common(1)[0]
    e = sample[ip]
    port = e.facts.get("peer_port")
    where = f"{ip}:{port}" if port else ip
    rank = ctx.rank_of_ip.get(ip)
    if rank is not None:
        return Verdict(rank, None, f"unreachable: {n} socket timeout(s) to {where}, which the rank table maps to rank "
                                   f"{rank}", "comm_timeout", (e.as_dict(),), "high",
                       f"the connect timeout's peer {ip} is rank {rank}'s address in the rank table",
                       (f"is rank {rank}'s process up and listening? check its log, and the network "
                        f"(`hccn_tool -i N -ip -g`, ping {ip})",))
    hint = " (pass --rank-table FILE to map it to a rank)" if not ctx.rank_of_ip else " (not in the rank table)"
    return Verdict(f"peer {where}", None, f"unreachable: {n} socket timeout(s) to {where}{hint}; for torch's TCPStore "
                                          f"this is MASTER_ADDR:MASTER_PORT (rank 0's host)", "comm_timeout",
                   (e.as_dict(),), "medium", f"every connect timeout names peer {where}",
                   (f"is the process at {where} up (rank 0 / the master)? check MASTER_ADDR, MASTER_PORT and the "
                    f"firewall between the nodes", "the log of the rank that runs there"))


def _from_peer_ranks(views: dict[int | str, RankView]) -> Verdict | None:
    """A socket or link set-up that names the rank at the other end (``from [0] via c10d key-value store``,
    ``dst_rank[N]``, ``wait socket establish timeout, role[1] rank[N]``): that rank, not the reporter."""
    peers: Counter = Counter()
    sample: dict[int, Event] = {}
    for v, e in _events(views):
        for x in e.entities:
            if x["type"] == "peer_rank" and not x.get("context") and x["id"] != _reporter(v, e):
                peers[x["id"]] += 1
                sample.setdefault(x["id"], e)
    logged = {v.rank for v in views.values() if v.files}
    for r in [r for r in peers if r in logged]:
        del peers[r]   # that rank's own log is here: the cause / stall logic reads it
    if not peers:
        return None
    r, n = peers.most_common(1)[0]
    e = sample[r]
    return Verdict(r, None, f"waited for: {n} report(s) name rank {r} as the other end of a connection that "
                            f"timed out ({e.label}): {e.text[:200]}", "comm_timeout", (e.as_dict(),),
                   "medium" if n == 1 or len(peers) > 1 else "high",
                   f"the timeout names rank {r} as its peer" + ("; only one report does" if n == 1 else ""),
                   (f"rank {r}'s own log: did it start, and reach the same set-up (a crash or a slow start "
                    f"there explains the timeout)?", "HCCL_CONNECT_TIMEOUT / the c10d timeout, if start-up is slow"),
                   {"entity": "rank", "id": r, "text": f"rank {r}", "via": "peer"}, e.cause)


def from_field_evidence(views: dict[int | str, RankView], ctx: EvidenceContext) -> Verdict | None:
    """The strongest suspect the timeout reports point at, or None when they name nobody."""
    for finder in (lambda: from_links(views, ctx.host_of_ip), lambda: _from_named_peers(views, ctx),
                   lambda: _from_peer_ranks(views),
                   lambda: _from_seqnums(views, ctx), lambda: _from_socket_peers(views, ctx)):
        found = finder()
        if found is not None:
            return found
    return None
