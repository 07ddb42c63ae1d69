"""The cause model of `port diagnose` (porting/data/cause_model.yaml) applied to one block of log text,
and the entities a block names.

A *block* is an error line with the lines that continue it: CANN prints a failure as a headline
(``EZ9999: Inner Error!``, ``[ERROR] ... ERR00100 PTA call acl api failed``) followed by indented
``TraceBack`` lines, an ``[Error]:`` explanation and the device's own report, which is where the
cause is named (``reason=[aicore timeout]``, ``Device[1] lost heartbeat``, ``deviceId=3``). Markerless
texts (no ``[ERROR]``) are recognised by the model's documented patterns themselves.

:func:`block_class` gives the most causal class a block matches (and whether the match says why, or only
names the class: a *weak* match); :func:`entities` lists the ranks, peer ranks, devices (NPU / chip /
die), PIDs, NIC addresses and hosts a block names, each with its line.
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

from porting.diagnostics import load_yaml
from porting.diagnostics.anchors import anchors, cased

MAX_BLOCK_LINES = 16     # continuation lines joined to an error line
MAX_BLOCK_BYTES = 8192   # bytes of a block classified (the line itself is cut at grammar.MAX_LINE)
MAX_ENTITIES = 24        # entities kept per event


@dataclasses.dataclass(frozen=True)
class CauseClass:
    """One fault of the cause model with its class's attributes (``name`` is the class, ``fault`` the fault
    inside it; ``tier`` the fault's own rank in what causes what)."""
    name: str
    tier: float
    role: str
    kind: str
    label: str
    fix: str
    identifiers: tuple[str, ...]
    sources: tuple[str, ...]
    strong: re.Pattern | None
    weak: re.Pattern | None
    fault: str = ""
    family: str = ""
    strong_anchors: tuple[bytes, ...] | None = None   # literals a strong match contains (None: always search)
    weak_anchors: tuple[bytes, ...] | None = None


def _rx(patterns: list[str]) -> re.Pattern | None:
    return re.compile("|".join(f"(?:{p})" for p in patterns).encode(), re.I | re.M) if patterns else None


@lru_cache(maxsize=1)
def model() -> tuple[tuple[CauseClass, ...], dict[str, CauseClass], dict[str, str]]:
    """Every fault of every class in tier order (a fault without a tier of its own takes its class's), code ->
    the fault it is (CANN codes and runtime return values), and what the runtime return values mean."""
    data = load_yaml("cause_model.yaml")
    faults, codes = [], {}
    for c in data["classes"]:
        for f in c["faults"]:
            entry = CauseClass(c["name"], float(f.get("tier", c["tier"])), c["role"], c["kind"], c["label"],
                               f.get("next", c["fix"]), tuple(c["identifiers"]),
                               tuple(c["sources"]) + tuple(f.get("sources", ())), _rx(f.get("patterns", [])),
                               _rx(f.get("weak", [])), f["name"], c.get("family", ""),
                               anchors(f.get("patterns", [])), anchors(f.get("weak", [])))
            faults.append(entry)
            for code in f.get("codes", []):
                codes.setdefault(str(code), entry)
    faults.sort(key=lambda x: x.tier)   # stable: within one tier, the file's order
    return tuple(faults), codes, {str(k): v for k, v in data.get("code_meanings", {}).items()}


@lru_cache(maxsize=None)
def class_tier(name: str) -> float:
    """A class's own tier (the rank of an event known only by its class, e.g. from the error-code table)."""
    return next(float(c["tier"]) for c in load_yaml("cause_model.yaml")["classes"] if c["name"] == name)


@lru_cache(maxsize=None)
def class_role(name: str) -> str | None:
    """cause | consequence for a class of the model; None for a name it does not have."""
    return next((c["role"] for c in load_yaml("cause_model.yaml")["classes"] if c["name"] == name), None)


CODE_RE = re.compile(rb"(?<![A-Za-z0-9])(E[0-9A-Z]\d{4}|ERR\d{5})(?![0-9A-Za-z])|(?<![\d.x])(\d{6})(?![\d.])")


# Words that make a documented text a possibility rather than a finding ("training failed; this may be caused by OOM",
# "possible causes: (1) the OOM killer"): a strong match after one of them on its line counts as weak.
HEDGE_RE = re.compile(rb"\b(?:may|might|could|possibl[ey]|potential|e\.g\.|such as|for example|for instance|perhaps|"
                      rb"whether|maybe)\b", re.I)
HEDGE_SPAN = 160   # bytes before a match read for a hedge (its own line only)


def _hedged(text: bytes, at: int) -> bool:
    lo = max(text.rfind(b"\n", max(0, at - HEDGE_SPAN), at) + 1, at - HEDGE_SPAN, 0)
    return HEDGE_RE.search(text, lo, at) is not None


def _may(lits: tuple[bytes, ...] | None, low: bytes) -> bool:
    return lits is None or any(x in low for x in lits)


def block_class(block: bytes) -> tuple[CauseClass, bool] | None:
    """The most causal fault the block's text or codes match; ``sure`` is False for a weak match (a weak pattern,
    or a strong one that a hedge on its line makes a possibility)."""
    faults, codes, _ = model()
    text = block[:MAX_BLOCK_BYTES]
    coded = {id(codes[c.decode()]) for m in CODE_RE.finditer(text) for c in (m.group(1), m.group(2))
             if c and c.decode() in codes}
    weak_hit = None
    low = text.lower()
    for c in faults:
        if id(c) in coded:
            return c, True
        m = c.strong.search(text) if c.strong is not None and _may(c.strong_anchors, low) else None
        if m is not None and not _hedged(text, m.start()):
            return c, True
        if weak_hit is None and (m is not None or (c.weak is not None and _may(c.weak_anchors, low)
                                                   and c.weak.search(text))):
            weak_hit = c
    return (weak_hit, False) if weak_hit is not None else None


# (entity type, regex with the value as group 1, how sure a peer is: "named" by a report, else "reported")
ENTITY_RES: tuple[tuple[str, re.Pattern], ...] = (
    ("peer_rank", re.compile(rb"dst_rank\[(\d{1,9})(?!\d)\]")),
    ("peer_rank", re.compile(rb"from \[(\d{1,9})(?!\d)\] via c10d key-value store")),
    # HCCL's "wait socket establish timeout, role[R] rank[N]": N is this process's own user rank (the src of its
    # LINK_ERROR_INFO rows, hcclug_000050); the remote ends are in the rows (links.py)
    ("rank", re.compile(rb"role\[\d+\] rank\[(\d{1,9})(?!\d)\]")),
    # CANN 9's heartbeat line (hcclug_000055): "local rank [IP/L]: crimer rank [IP/C] status[S] by informer rank
    # [IP/I]": C is the culprit whatever the status, L the rank that printed it, I the one that saw it first
    ("lost_rank", re.compile(rb"crimer rank ?\[[^/\]\s]*/(\d{1,9})(?!\d)\]")),
    ("rank", re.compile(rb"local rank ?\[[^/\]\s]*/(\d{1,9})(?!\d)\]")),
    ("informer", re.compile(rb"informer rank ?\[[^/\]\s]*/(\d{1,9})(?!\d)\]")),
    ("lost_rank", re.compile(rb"rank \[[^/\]\s]*/(\d{1,9})(?!\d)\] status\[LOST\]")),
    ("lost_rank", re.compile(rb"Cluster Exception Location\[IP/ID\]:\[[^/\]]*/(\d{1,9})(?!\d)\]")),
    ("peer_rank", re.compile(rb"remote rank\s*[:\[]+\s*(?!4294967295\b)(\d{1,9})(?!\d)", re.I)),
    # HCCL's "Transport init error! createLink para:rank[7]-localUserrank[7]-localIpAddr[HOST/DEV],
    # remoteRank[15]-remoteUserrank[15]-remoteIpAddr[HOST/DEV]" (the guide: [hostIp/deviceId] of each end)
    ("peer_rank", re.compile(rb"remoteUserrank\[(\d{1,9})(?!\d)\]")),
    ("peer_host", re.compile(rb"remoteIpAddr\[([\w.:-]{1,64})/\d+\]")),
    ("rank", re.compile(rb"RankID:(\d{1,9})(?!\d)\)")),
    ("rank", re.compile(rb"\[(?:PG [^\]]*?)?Rank (\d{1,9})(?!\d)\]")),
    ("rank", re.compile(rb"\[rank(\d{1,9})(?!\d)\]:")),
    ("rank", re.compile(rb"^\[(\d{1,9})(?!\d)\] is setting up", re.M)),
    ("rank", re.compile(rb"(?<![\w\[])\[(\d{1,9})(?!\d)\] is setting up")),
    ("rank", re.compile(rb"(?:fail(?:ed)?|error)[^\n]{0,40}?\brank[:=]\s?(\d{1,9})(?!\d)\b", re.I)),
    # Megatron's checks name the global rank first: "Rank 11: found NaN ...", "Rank 13, node N, device 5, ..."
    ("rank", re.compile(rb"\bRank (\d{1,9})(?!\d)(?::|, node) ")),
    ("device", re.compile(rb"\bNPU (\d{1,9})(?!\d);")),
    ("device", re.compile(rb"\bDevice:(\d{1,9})(?!\d)")),
    ("device", re.compile(rb"\bdevice_id[:=](\d{1,9})(?!\d)")),
    ("device", re.compile(rb"\bdeviceId[:=](\d{1,9})(?!\d)")),
    ("device", re.compile(rb"\brealDeviceId:(\d{1,9})(?!\d)")),
    ("device", re.compile(rb"\bDevice\[(\d{1,9})(?!\d)\]")),
    ("device", re.compile(rb"\bdevice\((\d{1,9})(?!\d)\)")),
    ("device", re.compile(rb"\bdevId=(\d{1,9})(?!\d)")),
    ("device", re.compile(rb"\binvalid device=(\d{1,9})(?!\d)")),            # "Set visible device failed, invalid device=1"
    ("device", re.compile(rb"\(dev_id=(\d{1,9})(?!\d)[;)]")),                # the driver's kernel log: "(dev_id=6; ret=-19)"
    ("device", re.compile(rb"\bdevice_id: (\d{1,9})(?!\d)")),
    ("device", re.compile(rb"\b(?:open|set) device (\d{1,9})(?!\d) failed")),
    ("device", re.compile(rb"\bdevice\[(\d{1,9})(?!\d)\]")),
    ("device", re.compile(rb"\bDevice (\d{1,9})(?!\d) \.\.\.")),
    # device names a framework prints beside its error: llama.cpp's CANN back end ("current device: 0, in function
    # ..."), Megatron's checks ("..., Device: 3", "Rank 13, node N, device 5, iteration 1"), torch's "npu:3"
    ("device", re.compile(rb"\bcurrent device: (\d{1,9})(?!\d)")),
    ("device", re.compile(rb"\bDevice: (\d{1,9})(?!\d)\b")),
    ("device", re.compile(rb", device (\d{1,9})(?!\d), iteration")),
    ("device", re.compile(rb"\bnpu:(\d{1,9})(?!\d)\b")),
    ("chip", re.compile(rb"\bchipId:(\d{1,9})(?!\d)")),
    ("die", re.compile(rb"\bdieId:(\d{1,9})(?!\d)")),
    ("pid", re.compile(rb"\bPID:\s?(\d{1,9})(?!\d)")),
    ("pid", re.compile(rb"^\[(\d{1,9})(?!\d)\] \[\d{4}-\d\d-\d\d ", re.M)),     # torch_npu's "[pid] [time] torch.distributed:
    ("pid", re.compile(rb"\bpid=(\d{1,9})(?!\d)")),
    ("nic_ip", re.compile(rb"(?:remote_ip_addr|localIpAddr|listen on ip)\[([\d.]+)\]")),
    # a host tag ("worker-1: ..."), not a program's name before the dynamic loader's "error while loading shared
    # libraries" ("npu-smi: error while ...")
    ("host", re.compile(rb"^((?![\w.]*(?:Error|Exception|Warning)(?:\b|_))[A-Za-z][\w]*[-.][\w.-]*\w): "
                        rb"(?!error while loading shared libraries)", re.M)),
    # the remote end of an ERROR CQE (hccl guide: "remoteIP{server[S],deviceId[..],deviceIp[D]}") and of an EI0006
    # link (CANN 8.5+: "fails to connect to dstRank (server S, device ID D)"): a host, from the line that says so
    ("peer_host", re.compile(rb"remoteIP\{server\[([\d.]+)\]")),
    ("peer_host", re.compile(rb"dstRank \(server ([\w.:-]+),")),
    # EI0013's "Peer information: server B, device ID y, device IP b" (the local end is "Local information: ...")
    ("peer_host", re.compile(rb"Peer information: server ([\w.:-]+),")),
    # Ray names the node of a worker it lost or killed: "at node (ID: .., IP: A)", "Memory on the node (IP: A",
    # "Worker IP address: A"
    ("host", re.compile(rb"\bnode \((?:ID: \w+, )?IP: ([0-9.]+)")),
    ("host", re.compile(rb"Worker IP address: ([0-9.]+)")),
    # Ray's wrapper of a remote exception names the actor's process and node: "ray::TaskRunner.run() (pid=59411,
    # ip=HOST, actor_id=...)"; torch elastic's failure summary names the host of a failed rank ("  host : NAME")
    ("host", re.compile(rb"\bray::[\w.]{1,120}\(\) \(pid=\d+, ip=([\w.-]{1,120})")),
    ("host", re.compile(rb"^\s{0,8}host\s{0,8}: ([\w.-]{1,253})\s*$", re.M)),
    # msrun's scheduler names the workers that stopped reporting: "Time out nodes are ['3']"
    ("lost_rank", re.compile(rb"Time out nodes are \['(\d{1,9})(?!\d)'")),
    # the device's exception dump "DEVICE[0] PID[415]:" (upper case: the runtime's, not a log prefix)
    ("device", re.compile(rb"\bDEVICE\[(\d{1,9})(?!\d)\] PID\[")),
    # the operator a failure names (compile, missing binary, dtype/shape, launch)
    ("op", re.compile(rb"\(optype: \[(\w+)\]\)")),
    ("op", re.compile(rb"Failed to compile node \[name:? ?(\w+)")),
    ("op", re.compile(rb"No supported Ops kernel and engine are found for \[(\w+)\]")),
    ("op", re.compile(rb"\bOp (\w+) does not")),
    ("op", re.compile(rb"\bcall (aclnn\w+) failed")),
    ("op", re.compile(rb"(?<![\w.])(aclnn\w+?)(?:GetWorkspaceSize)? failed")),
    ("op", re.compile(rb"launch failed for (\w+)")),
    ("op", re.compile(rb"OPS function error: (\w+), error code")),
    ("op", re.compile(rb"Optype \[(\w+)\] of Ops kernel")),
    ("op", re.compile(rb"available kernel info for: (\w+)")),
)


@lru_cache(maxsize=1)
def _entity_table() -> tuple[tuple[str, re.Pattern, tuple[bytes, ...] | None, bool], ...]:
    """ENTITY_RES with the literals each match holds (anchors(); case-folded where the regex ignores case)."""
    out = []
    for kind, rx in ENTITY_RES:
        icase = bool(rx.flags & re.I)
        lits = anchors([rx.pattern.decode()])
        if lits is not None and not icase:   # anchors() folds case: keep the literal as the regex spells it
            lits = cased(rx.pattern.decode(), lits)
        out.append((kind, rx, lits, icase))
    return tuple(out)


def entities(block: bytes, first_line: int) -> list[dict]:
    """Every entity the block names: {"type", "id", "line"} (line: 1-based, in the source file). A
    ``lost_rank`` is a peer named by HCCL's own heartbeat report, a ``peer_rank`` one named by the
    reporting side (destination, remote or store rank)."""
    out: list[dict] = []
    seen = set()
    table = _entity_table()
    for lineno, text in enumerate(block[:MAX_BLOCK_BYTES].split(b"\n"), first_line):
        taken: list[tuple[int, int]] = []
        low = text.lower()
        for kind, rx, lits, icase in table:
            if lits is not None and not any(x in (low if icase else text) for x in lits):
                continue   # a literal every match holds is missing: the search cannot match
            for m in rx.finditer(text):
                if any(s <= m.start(1) < e for s, e in taken):
                    continue   # one number, one entity (the "rank" of "dst_rank[0]" is not a second one)
                taken.append((m.start(1), m.end(1)))
                raw = m.group(1).decode("utf-8", "replace")
                val: int | str = int(raw) if raw.isdigit() else raw
                key = (kind, val)
                if key in seen or (kind == "rank" and val == -1):
                    continue
                seen.add(key)
                out.append({"type": kind, "id": val, "line": lineno})
                if len(out) >= MAX_ENTITIES:
                    return out
    return out


# ---------------------------------------------------------------------------------------------
# Blocks: an error line and the lines that continue it.

# What launchers and loggers put before a line: "(Worker_TP1 pid=961) ERROR 09-07 01:11:09 [file.py:596] ",
# "[rank1]: ", a host tag "worker-1: ". A continuation is indented, or a CANN TraceBack / [Error] / code line.
PREFIX_RE = re.compile(rb"(?:> )?(?:\([^)\n]{0,80}\) )*(?:(?:ERROR|INFO|WARNING|DEBUG) \d\d-\d\d [\d:]+ \[[^\]\n]{1,80}\] ?)?"
                       rb"(?:\[rank\d+\]: ?)?(?:(?![\w.]*(?:Error|Exception|Warning)\b)[A-Za-z]\w*[-.][\w.-]*\w: )?")
# npu-smi prints its driver failure as two lines ("DrvMngGetConsoleLogLevel failed." then "dcmi module ...")
# A device error wrapped after "serial number is N." goes on with "there is a ... error"; the device's exception dump
# goes on with "EXCEPTION STREAM:" and indented info lines.
CONT_RE = re.compile(rb"[ \t]+\S|TraceBack|\[Error\]|E[0-9A-Z]\d{4}[:\[ (]|\[PID: \d+\] \d{4}-|dcmi mod|there is an? |"
                     rb"EXCEPTION STREAM:")
CONTEXT_LINES = 2        # lines before an error line read for entities only (a CANN headline's PID/device)
OLD_KIND_CLASS = {"oom": "memory", "device": "device_fault", "config": "config", "operator": "operator_error",
                  "crash": "process_exit", "worker_exit": "process_exit", "comm_fault_report": "process_exit",
                  "comm_timeout": "collective_timeout", "cluster_abort": "watchdog_abort"}
# HCCL's heartbeat reports are always about another rank (the crimer: the one whose heartbeat stopped, that is
# stuck, or whose link drops packets); the status of CANN 9's run-log line or the ExceptionType of the
# "Cluster Exception Location" ERROR line (hcclug_000054/000055)
HEARTBEAT_REPORT_RE = re.compile(rb"Heartbeat Lost Occurred|Stuck Occurred|Error cqe Occurred|status\[LOST\]|"
                                 rb"crimer rank ?\[")
HEARTBEAT_STATUS_RE = re.compile(rb"crimer rank ?\[[^\]]*\] ?status\[([A-Z][A-Z ]{1,24})\]|"
                                 rb"ExceptionType:\[([^\]]{1,40})\]|status\[(LOST)\]")
GENERIC_TIER = 8         # a Python exception or a bare error line: a cause, of no known class


def block_end(buf: bytes, st: int, end: int) -> int:
    """Offset where the block of the error line ``buf[st:end]`` ends (bounded in lines and bytes)."""
    pos, n = end, 0
    while n < MAX_BLOCK_LINES and pos < len(buf) and pos - st < MAX_BLOCK_BYTES:
        nxt = pos + 1
        e = buf.find(b"\n", nxt)
        e = len(buf) if e < 0 else e
        line = buf[nxt:min(e, nxt + 512)]
        if not CONT_RE.match(line, PREFIX_RE.match(line).end()):
            break
        pos, n = e, n + 1
    return pos


def _context_after(buf: bytes, bend: int) -> tuple[int, int]:
    """The two non-blank lines after a block (``buf[lo:hi]``): llama.cpp's CANN back end prints "current device: N, in
    function F" below its error, after a blank line."""
    lo = pos = bend + 1 if bend < len(buf) else bend
    n = 0
    while n < CONTEXT_LINES and pos < len(buf) and pos - lo < 1024:
        e = buf.find(b"\n", pos)
        e = len(buf) if e < 0 else e
        n += bool(buf[pos:e].strip())
        pos = e + 1
    return lo, min(pos, len(buf))


def _context_start(buf: bytes, st: int) -> int:
    lo = st
    for _ in range(CONTEXT_LINES):
        if lo <= 0:
            break
        lo = buf.rfind(b"\n", max(0, lo - 4096), lo - 1) + 1
    return lo


def _matched_lines(block: bytes, found: CauseClass, headline: str) -> str:
    """The block's lines (at most two, besides the headline) that name its class, for the reason."""
    out: list[str] = []
    for line in block.split(b"\n")[1:MAX_BLOCK_LINES + 1]:
        hit = found.strong.search(line) if found.strong is not None else None
        if hit is None and found.weak is not None:
            hit = found.weak.search(line)
        if hit is None and block_class(line) != (found, True):
            continue
        text = line.strip()[:240].decode("utf-8", "replace")
        if text and text not in headline and text not in out:
            out.append(text)
        if len(out) >= 2:
            break
    return " | ".join(out)


def annotate(ev, buf: bytes, st: int, end: int, line0: int) -> None:
    """Give an event its cause class, tier and entities from its block (``buf[st:end]`` is its line, number
    ``line0``); a documented class overrides the
    line grammar's kind (the block says more than the headline), except that torchrun's worker exits
    keep their kind."""
    bend = block_end(buf, st, end)
    block = buf[st:bend]
    found = block_class(block)
    lo = _context_start(buf, st)
    ev.entities = entities(block, line0) + [
        dict(x, context=True) for x in entities(buf[lo:st], line0 - buf.count(b"\n", lo, st))
        if x["type"] not in ("host", "peer_host")]
    if not any(x["type"] in ("device", "chip") for x in ev.entities):   # the device only the lines after it name
        a_lo, a_hi = _context_after(buf, bend)
        ev.entities += [dict(x, context=True) for x in entities(buf[a_lo:a_hi], line0 + buf.count(b"\n", st, a_lo))
                        if x["type"] == "device"]
    if found is None:
        ev.fault = ""
        ev.cause = OLD_KIND_CLASS.get(ev.kind)
        ev.tier = class_tier(ev.cause) if ev.cause else GENERIC_TIER
        ev.sure = ev.cause is not None
        return
    cls, ev.sure = found
    ev.cause, ev.tier, ev.fault = cls.name, cls.tier, cls.fault
    lost = next((x["id"] for x in ev.entities if x["type"] == "lost_rank" and not x.get("context")), None)
    if lost is not None or HEARTBEAT_REPORT_RE.search(block):
        # a report of a peer's loss (HCCL heartbeat): the crimer / located rank is the suspect, this line its witness
        ev.kind, ev.role = "comm_fault_report", "consequence"
        if lost is not None:
            ev.facts.setdefault("located_rank", lost)
            st_m = HEARTBEAT_STATUS_RE.search(block)
            status = next((g.decode("utf-8", "replace") for g in st_m.groups() if g), "LOST") if st_m else "LOST"
            ev.facts.setdefault("exception_type", status if status.endswith("Occurred") else f"heartbeat status {status}")
            ev.facts["crimer"] = b"crimer rank" in block
        ev.fix = ev.fix or cls.fix
        return
    if not (ev.kind in ("crash", "worker_exit") and cls.name == "process_exit"):
        if ev.kind != cls.kind:
            ev.label = cls.label
        ev.kind, ev.role = cls.kind, cls.role
    ev.fix = ev.fix or cls.fix
    lines = _matched_lines(block, cls, ev.text)
    meanings = model()[2]
    said = [f"{c} = {meanings[c]}" for c in codes_in([block[:MAX_BLOCK_BYTES].decode("utf-8", "replace")])
            if c in meanings]
    if lines or said:
        ev.facts["cause_text"] = " | ".join(([lines] if lines else []) + said[:2])


WINDOW_S = 60.0   # events this long after the first cause are later fallout, not candidates for the cause


def pick_cause(events: list, offset: float = 0.0):
    """The cause of a set of events (each with ts, tier, role, kind, source, line): among the cause
    events of the first incident window, the most causal class, then the earliest (to the second:
    many logs print whole seconds, and a later line of the same second did not come first)."""
    causes = [e for e in events if e.role == "cause"]
    if not causes:
        return None
    times = [e.ts - offset for e in causes if e.ts is not None]
    t0 = min(times) if times else None
    pool = [e for e in causes if e.ts is None or t0 is None or e.ts - offset - t0 <= WINDOW_S]
    real = [e for e in pool if e.kind != "error"] or pool
    # within a second, an event whose block names its fault (aicpu, compile, ...) before one known by a code only
    return min(real, key=lambda e: (e.tier, e.ts is None, int(e.ts - offset) if e.ts is not None else 0,
                                    not e.fault, e.source, e.line))


def codes_in(texts: list[str], limit: int = 8) -> list[str]:
    """The CANN codes and runtime return values (those the model knows) named in some texts."""
    known = model()[1]
    out: list[str] = []
    for text in texts:
        for m in CODE_RE.finditer(text.encode("utf-8", "replace")):
            c = (m.group(1) or m.group(2)).decode()
            if (c in known or m.group(1)) and c not in out:
                out.append(c)
    return out[:limit]
