"""Failed links, read from the lines that carry them: the remote end of each link is the evidence.

HCCL prints a link set-up timeout with a table of the links that failed (CANN 9.0 HCCL user guide,
"建链超时(EI0006)", hcclug_000050; MindCluster FaultDiag's plog fixtures show the older layout):

    wait socket establish timeout, role[1] rank[1] timeout[120 s]
    _________________________LINK_ERROR_INFO___________________________
    |  dest_ip(user_rank)  |   dest_port   |  src_ip(user_rank)   |   src_port   |   MyRole   |   Status   | ...
    |  192.0.2.199(0)      |  16666        |   192.0.3.198(1)     |  3234403008  |  client    | time out   | ...

and CANN 8.5+'s EI0006 reason says it in words: "srcRank (server A, device ID x) fails to connect to dstRank
(server B, device ID y)". Which end is the suspect follows from where the failed links go:

* one remote end: that rank, at the address of the link line (not the reporter's own address);
* every failed link to one remote host (known from the line's ``server`` or from ``--rank-table``): that host;
* links to peers on several hosts, or on the reporter's own host too: the common end, that is the reporter or
  its NIC (`hccn_tool -i <device> -link -g` / `-net_health -g` on it);
* links that fail both ways between two places (each end's log reports the link to the other): the network between
  them, named as the pair of nodes (hosts from the line or ``--rank-table``) or of addresses.

A link timeout is still a timeout: the verdict is at most medium, and says what to collect from the other end.
"""

from __future__ import annotations

import re

from porting.diagnostics.outcome import Verdict

IP = rb"[0-9a-fA-F]{1,4}(?:[.:][0-9a-fA-F]{0,4}){1,7}"
ROW_RE = re.compile(rb"\|\s*(?P<dip>" + IP + rb")\((?P<dr>\d{1,9})(?!\d)\)\s*\|(?:\s*\d+\s*\|)?\s*(?P<sip>" + IP +
                    rb")\((?P<sr>\d{1,9})(?!\d)\)\s*\|(?:\s*\d+\s*\|)?\s*(?P<role>\w+)\s*\|\s*(?P<status>[A-Za-z][A-Za-z ]{0,30}?)\s*\|")
WORDS_RE = re.compile(rb"srcRank \(server (?P<sh>[\w.:-]+), device ID (?P<sd>\d{1,9})(?!\d)\) fails to connect to dstRank "
                      rb"\(server (?P<dh>[\w.:-]+), device ID (?P<dd>\d{1,9})(?!\d)\)")
OK_STATUS = ("ok", "connected", "success", "succeed")


def link_facts(line: bytes) -> dict | None:
    """The failed link one line describes: dest/src address, rank, host, device and status; None when none."""
    if b"|" in line and b"(" in line:
        m = ROW_RE.search(line)
        if m and m.group("status").strip().lower() not in OK_STATUS:
            return {"dest_ip": m.group("dip").decode(), "dest_rank": int(m.group("dr")), "src_ip": m.group("sip").decode(),
                    "src_rank": int(m.group("sr")), "status": m.group("status").strip().decode()}
    if b"dstRank (server" in line:
        m = WORDS_RE.search(line)
        if m:
            return {"dest_host": m.group("dh").decode(), "dest_device": int(m.group("dd")),
                    "src_host": m.group("sh").decode(), "src_device": int(m.group("sd")), "status": "fails to connect"}
    return None


def _host(link: dict, host_of_ip: dict[str, str]) -> str | None:
    return link.get("dest_host") or host_of_ip.get(link.get("dest_ip", ""))


def _place(link: dict, end: str, host_of_ip: dict[str, str]) -> str | None:
    """Where one end of a link is: its host when the line or the rank table says so, else its address."""
    return link.get(f"{end}_host") or host_of_ip.get(link.get(f"{end}_ip", "")) or link.get(f"{end}_ip")


def both_ways(found: list, host_of_ip: dict[str, str]) -> Verdict | None:
    """Links that fail both ways between two places (A's log: no link to B; B's log: no link to A): the HCCL guide's
    reading is the network between the two ends ("if the link setup timeout is reported on both ends, check the
    network connectivity between the two ends", fault_diagnosis/param_link_stage.md), so the verdict names the pair
    of nodes (or of addresses when no host is known), not one peer."""
    pairs = {(_place(ln, "src", host_of_ip), _place(ln, "dest", host_of_ip)) for _, _, ln in found}
    mutual = sorted({tuple(sorted(p)) for p in pairs if None not in p and p[0] != p[1] and (p[1], p[0]) in pairs})
    if not mutual or any(tuple(sorted(p)) not in mutual for p in pairs if None not in p):
        return None   # some failed link goes one way only: the other rules read it (one remote end, one host, ...)
    a, b = mutual[0]
    hosts = all(any(ln.get(f"{end}_host") or host_of_ip.get(ln.get(f"{end}_ip", "")) for end in ("src", "dest"))
                for _, _, ln in found)
    text = f"nodes {a} and {b}" if hosts else f"link {a} <-> {b}"
    ranks = sorted({r for _, _, ln in found for r in (ln.get("src_rank"), ln.get("dest_rank")) if r is not None})
    _, e, _ = found[0]
    s = {"entity": "node_pair" if hosts else "link", "id": f"{a}<->{b}", "text": text, "via": "links both ways"}
    reason = (f"unreachable both ways: each end of {text} fails to build its link to the other "
              f"({len(found)} failed link(s), ranks {ranks[:8]}): the network between the two ends"
              + (f"; {len(mutual) - 1} other pair(s) also fail both ways: {mutual[1:4]}" if len(mutual) > 1 else ""))
    collect = (f"`hccn_tool -i <device> -link -g`, `-net_health -g`, `-tls -g` on both ends of {text} (link down, "
               f"TLS switches that differ), and ping between their device IPs",
               "whether both ends reported within HCCL_CONNECT_TIMEOUT of each other (their plog times)")
    return Verdict(s["id"], None, reason, "comm_timeout", (e.as_dict(),), "medium",
                   "the failed links go both ways between two places; a link timeout is still a timeout", collect, s,
                   "socket_timeout", "link")


def from_links(views: dict, host_of_ip: dict[str, str] | None = None) -> Verdict | None:
    """The suspect the failed links point at (see the module docstring), or None without failed links."""
    host_of_ip = host_of_ip or {}
    found = [(v, e, e.facts["link"]) for v in views.values() for e in v.events if e.facts.get("link")]
    if not found:
        return None
    if (pair := both_ways(found, host_of_ip)) is not None:
        return pair
    dests = {(ln.get("dest_ip"), ln.get("dest_rank"), ln.get("dest_host"), ln.get("dest_device")) for _, _, ln in found}
    _v, e, first = found[0]
    reporter = first.get("src_rank", _v.rank if isinstance(_v.rank, int) else None)
    own_host = first.get("src_host") or host_of_ip.get(first.get("src_ip", ""))
    hosts = {_host(ln, host_of_ip) for _, _, ln in found}
    rows = "; ".join(f"{ln.get('dest_ip') or ln.get('dest_host')}"
                     + (f" (rank {ln['dest_rank']})" if ln.get("dest_rank") is not None else "")
                     + (f" (device {ln['dest_device']})" if ln.get("dest_device") is not None else "")
                     + f": {ln['status']}" for _, _, ln in found[:6])
    by = f"rank {reporter}" if reporter is not None else "this process"
    collect = ("the log and plog of the other end of each failed link (is it up, did it reach the same link set-up?)",
               "`hccn_tool -i <device> -link -g` / `-net_health -g` / `-tls -g` on both ends",
               "HCCL_CONNECT_TIMEOUT, if the ranks start minutes apart")
    if len(dests) == 1:
        ip, rank, host, dev = next(iter(dests))
        where = ip or host
        if rank is not None:
            s = {"entity": "rank", "id": rank, "text": f"rank {rank}", "via": "link line", "nic_ip": ip}
        else:
            s = {"entity": "host", "id": host, "text": f"host {host}", "via": "link line", "device": dev}
        reason = (f"unreachable: the failed link goes to {s['text']} at {where} (the remote end of the link line, "
                  f"reported by {by}): {rows}")
        return Verdict(s["id"], None, reason, "comm_timeout", (e.as_dict(),), "medium",
                       f"every failed link of {by} goes to one remote end; a link timeout is still a timeout: the "
                       f"other end may itself wait for someone", collect, s, "socket_timeout", "link")
    if None not in hosts and len(hosts) == 1 and own_host not in hosts:
        host = next(iter(hosts))
        s = {"entity": "host", "id": host, "text": f"host {host}", "via": "link lines"}
        reason = (f"unreachable: every failed link of {by} goes to host {host} ({len(dests)} remote ends: {rows})")
        return Verdict(host, None, reason, "comm_timeout", (e.as_dict(),), "medium",
                       f"all {len(dests)} failed links go to one remote host", collect, s, "socket_timeout", "link")
    text = f"rank {reporter} or its NIC" if reporter is not None else "the reporter or its NIC"
    s = {"entity": "reporter_nic", "id": reporter, "text": text, "via": "link lines"}
    spread = ("peers on several hosts" if None not in hosts else
              "several remote ends whose hosts the log does not say (pass --rank-table to place them)")
    reason = (f"unreachable: the failed links of {by} go to {len(dests)} {spread}; the common end is the reporter: "
              f"{text} ({rows})")
    return Verdict(reporter if reporter is not None else e.source, None, reason, "comm_timeout", (e.as_dict(),),
                   "medium" if None not in hosts else "low",
                   f"{len(dests)} distinct remote ends fail from one reporter", collect, s, "socket_timeout", "link")
