"""The log grammar of `port diagnose`, as data: which lines are errors, what kind each one is
(cause or consequence), the rank and time a line carries, and the error-code table.

Lines come from msrun ``worker_<rank>.log`` / ``scheduler.log``, `port train` ``rank_<r>.log``,
CANN plogs (``plog-<pid>_<ts>.log``), device logs and any other text log. Everything here works on
one line (bytes, at most ``MAX_LINE`` of it) or one file name; scanning whole files is ``scan.py``.
"""

from __future__ import annotations

import calendar
import dataclasses
import os
import re
import time
from functools import lru_cache

from porting.diagnostics import load_yaml
from porting.diagnostics.causes import PREFIX_RE, block_class
from porting.diagnostics.field import FIELD_LITERALS, field_rule
from porting.rundir import ranklog

MAX_LINE = 4096          # characters kept (and classified) of one line
PROCESS_EXIT_TIER = 7    # documented faults up to process exits count even in INFO/WARNING lines

# ---------------------------------------------------------------------------------------------
# Line grammar, as data.

TS_RE = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[T -](\d\d):(\d\d):(\d\d)(?:[.:,](\d{1,3}))?")
# A progress line: "step N" / "step=N" / "step: N" / "step:[ N/M]" with a loss on the same line
# (MindSpore LossMonitor, MindFormers, `port train`, plain prints). "stalling at step 3" is not progress.
STEP_RE = re.compile(rb"\bstep\b\s*[:=]?\s*\[?\s*(\d{1,9})(?!\d)(?:\s*/\s*\d+)?\]?[^\n]*?\bloss\b", re.I)
COLLECTIVE_RE = re.compile(
    rb"(?:Entry-)?(?:Hcom)?(AllReduce|AllGather|ReduceScatter|Broadcast|AllToAllv?|Barrier|"
    rb"all_reduce|all_gather|reduce_scatter|broadcast|barrier)\b[^\n]*?(?:tag\[([^\]]+)\])?", re.I)
# Literal prefilters, scanned in one regex pass; a hit is then checked with the full line grammar.
# Every literal starts with an upper-case letter or a newline, so the engine's first-character
# filter rejects most bytes of ordinary lines. Lower-case forms ("timed out", "out of memory",
# "error") come in ERROR-level lines (covered by "ERR") or in "...Error:" exception lines.
# "HcomAllReduce", "Entry-HcomAllGather" contain the collective names.
COLLECTIVE_LITERALS = (b"AllReduce", b"AllGather", b"ReduceScatter", b"Broadcast", b"AllToAll")
ERROR_LITERALS = (b"ERR", b"CRITICAL", b"EXCEPTION", b"Traceback", b"Error", b"Exception", b"OOM", b"\nE",
                  b"Killed", b"Segmentation fault", b"Aborted", b"Out of memory", b"Kill this process")


def literal_alternation(literals) -> re.Pattern:
    """One regex for many literals, grouped by first byte: ``E(?:RR|rror|I0|...)|C(?:...)|...``. The engine
    tries a flat alternation's branches one by one at every byte its first-character filter lets through
    (every newline, for "\nE"); grouped, it tries one branch per first byte. Only match starts are used,
    and they are the same as the flat alternation's (5.1 -> 3.6 ms per 1.15 MB rank log)."""
    groups: dict[bytes, list[bytes]] = {}
    for x in literals:
        groups.setdefault(x[:1], []).append(x[1:])
    parts = []
    for first, rests in groups.items():
        rests = sorted(set(rests), key=len, reverse=True)
        if b"" in rests or len(rests) == 1:
            parts.append(re.escape(first + (b"" if b"" in rests else rests[0])))
        else:
            parts.append(re.escape(first) + b"(?:" + b"|".join(re.escape(r) for r in rests) + b")")
    return re.compile(b"|".join(parts))


# Error literals in one pass (the last collective of a chunk is found by reverse searches). Plain
# alternations keep the engine's first-character filter (named groups disable it: 10x slower, measured).
ERROR_SCAN_RE = literal_alternation(ERROR_LITERALS + FIELD_LITERALS)
ASCEND_CODE_RE = re.compile(rb"(?<![A-Za-z0-9])(E[0-9A-Z]\d{4})(?![0-9A-Za-z])")
TORCH_NPU_RE = re.compile(rb"\bERR(\d\d)(\d{3})\b")
LEVEL_RE = re.compile(rb"^\[?(ERROR|CRITICAL|EXCEPTION|WARNING|INFO|DEBUG|TRACE|EVENT)\]?")
PORT_LEVEL_RE = ranklog.DIAG_LEVEL   # `port train`'s rank logs (porting/rundir/ranklog.py owns their lines)
# "RuntimeError: ...", and a wrapper that names the exception it carries: Ray's
# "ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=.., ip=..)"
EXC_LINE_RE = re.compile(rb"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)(?:\([\w.]{1,80}\))?)(?::\s?(.*))?$")
PID_RE = re.compile(rb"^\[[A-Z]+\]\s*[A-Z_]+\((\d{1,9})(?!\d)[,:]", re.M)
REMOTE_RANK_RE = re.compile(rb"remote rank\s*[:\[]+\s*(?!4294967295\b)(\d{1,9})(?!\d)", re.I)   # (u32)-1: unknown
LOCATION_RE = re.compile(rb"Cluster Exception Location\[IP/ID\]:\[[^/\]]*/(\d{1,9})(?!\d)\][^\n]*?ExceptionType:\[([^\]]+)\]")
SCHED_TIMEOUT_RE = re.compile(rb"The node: (\d{1,9})(?!\d) is timed out")
SCHED_FIRST_RE = re.compile(rb"worker (\d{1,9})(?!\d) is the first one timed out")
RANK_IN_CONTENT = (
    re.compile(rb"rankNum\[\d+\],\s*rank\[(\d{1,9})(?!\d)\]"),           # HCCL SetupAgent / hcom init
    re.compile(rb"hcom init[^\n]*?rank\[(\d{1,9})(?!\d)\]"),
    re.compile(rb"This node \d+ rank id: (\d{1,9})(?!\d)"),              # MindSpore cluster PostProcess
    ranklog.DIAG_RANK,                                         # `port train`
)
FILE_KINDS = (  # (kind, filename regex with the rank as group 1 where there is one)
    ("msrun_worker", re.compile(r"^worker_([0-9]{1,9})\.log$")),
    ("msrun_scheduler", re.compile(r"^scheduler\.log$")),
    ("port_rank", ranklog.LOG_NAME),
    ("plog", re.compile(r"^plog-([0-9]{1,9})_[0-9]+\.log$")),
    ("device_log", re.compile(r"^device-([0-9]{1,9})_[0-9]+\.log$")),
)
PATH_RANK_RE = re.compile(r"(?:^|[_/\-])rank[_\-]?([0-9]{1,9})(?:[_/\-]|$)")

# Event classification: first matching rule wins. kind, role, label.
CLASS_RULES: tuple[tuple[re.Pattern, str, str, str], ...] = (
    (re.compile(rb"out of memory|\bOOM\b|rtMalloc|207001|Malloc device memory failed|MemoryError|"
                rb"Failed to allocate memory|alloc(?:ate)? .*memory failed", re.I), "oom", "cause", "out of memory"),
    (re.compile(rb"Cluster Exception Location"), "comm_fault_report", "consequence", "HCCL located a faulty rank"),
    (re.compile(rb"Callback on exception is called|Kill this process with SIGTERM"), "cluster_abort", "consequence",
     "terminated by the cluster after another node failed"),
    (re.compile(rb"Ring \w+ wait receiving|AllReduceCPUKernelMod launch failed|"
                rb"Launch kernel failed, name:\S*(?:AllReduce|AllGather|Broadcast|ReduceScatter)|"
                rb"notify wait|Notify register times out|connected p2p timeout|socket times out|"
                rb"get socket timeout|LINK_ERROR_INFO|comm error, device|no connect|created commHD fail|hcclComm \w+ \w+ error|HcclComm\]|heartbeat|collective[^\n]*time|"
                rb"wait[^\n]*timeout|timed out|timeout", re.I), "comm_timeout", "consequence", "collective timeout"),
    (re.compile(rb"Segmentation fault|core dumped|\bKilled\b|SIGKILL|SIGSEGV|SIGABRT"), "crash", "cause",
     "process crashed or was killed"),
    (re.compile(rb"Traceback \(most recent call last\)"), "exception", "cause", "Python exception"),
    (re.compile(rb"(?:^|[\s:\]])(?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception):"), "exception", "cause",
     "Python exception"),
)
GENERIC_ERROR = ("error", "cause", "error line")



@lru_cache(maxsize=1)
def error_table() -> dict:
    return load_yaml("error_codes.yaml")



@dataclasses.dataclass
class Event:
    """One classified error line."""
    source: str            # the file it came from (relative to LOGDIR)
    line: int              # 1-based line number
    ts: float | None       # seconds since the epoch on the source's clock (naive, as logged)
    ts_exact: bool         # False when the line had no timestamp and one was inferred from before it
    kind: str
    role: str              # cause | consequence
    label: str
    text: str
    code: str | None = None
    blames: tuple[int, ...] = ()  # ranks this event names as the faulty peer
    fix: str = ""                 # how to fix it, when the grammar knows
    facts: dict = dataclasses.field(default_factory=dict)  # ranks/peers/SeqNum the line names (field.py)
    cause: str | None = None      # its class in the cause model (causes.py), None when it matches none
    tier: int = 99                # that class's tier: lower is more causal
    sure: bool = True             # False when the class was named without the reason (a weak pattern)
    entities: list = dataclasses.field(default_factory=list)  # ranks/devices/hosts its block names, with lines
    fault: str = ""               # the fault inside its class (cause_model.yaml faults: aicore, aicpu, ...), "" if none

    def as_dict(self, offset: float = 0.0) -> dict:
        # a shallow copy: dataclasses.asdict deep-copies every value, which was most of the parent's
        # time for 4,096 ranks (profiled); facts is the only mutable field and holds plain values
        d = {name: getattr(self, name) for name in _EVENT_FIELDS}
        d["facts"] = dict(self.facts)
        d["entities"] = [dict(x) for x in self.entities]
        d["time"] = fmt_ts(self.ts - offset) if self.ts is not None else None
        d["blames"] = list(self.blames)
        return d


_EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(Event))


# ---------------------------------------------------------------------------------------------
# Timestamps.

@lru_cache(maxsize=4096)
def _day_epoch(y: int, mo: int, d: int) -> int:
    return calendar.timegm((y, mo, d, 0, 0, 0))


def parse_ts(m: re.Match) -> float | None:
    y, mo, d, h, mi, s, ms = m.groups()
    try:
        y, mo, d = int(y), int(mo), int(d)
        if not (1 <= mo <= 12 and 1 <= d <= 31):
            return None
        base = _day_epoch(y, mo, d)
    except (ValueError, OverflowError):
        return None
    frac = int(ms) / (10 ** len(ms)) if ms else 0.0
    return base + int(h) * 3600 + int(mi) * 60 + int(s) + frac


def fmt_ts(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(round((ts % 1) * 1000)) % 1000:03d}"


# ---------------------------------------------------------------------------------------------
# Scanning one file.

def classify_file(rel: str) -> tuple[str, int | None]:
    name = os.path.basename(rel)
    for kind, rx in FILE_KINDS:
        m = rx.match(name)
        if m:
            rank = int(m.group(1)) if kind in ("msrun_worker", "port_rank") else None
            return kind, rank
    m = PATH_RANK_RE.search(rel.replace(os.sep, "/"))
    return "log", (int(m.group(1)) if m else None)


def rank_from_content(head: bytes) -> int | None:
    for rx in RANK_IN_CONTENT:
        m = rx.search(head)
        if m:
            val = next(g for g in m.groups() if g is not None)
            return int(val)
    return None


def classify_line(line: bytes) -> tuple[str, str, str, str | None, tuple[int, ...], str]:
    """(kind, role, label, code, blamed ranks, fix) for an error line."""
    table = error_table()
    code = None
    m = ASCEND_CODE_RE.search(line)
    if m and m.group(1).decode() in table["codes"]:
        code = m.group(1).decode()
    t = TORCH_NPU_RE.search(line)
    if code is None and t:
        code = "ERR" + t.group(1).decode() + t.group(2).decode()
    blames: tuple[int, ...] = ()
    loc = LOCATION_RE.search(line)
    if loc:
        blames = (int(loc.group(1)),)
    else:
        rr = REMOTE_RANK_RE.findall(line)
        if rr:
            blames = tuple(int(x) for x in rr)
    if code and code in table["codes"]:
        entry = table["codes"][code]
        return entry["kind"], entry["role"], entry["meaning"], code, blames, entry.get("next_step", "")
    if code and code.startswith("ERR"):
        sub = table["torch_npu"]["submodules"].get(code[3:5], "UNKNOWN")
        what = table["torch_npu"]["codes"].get(code[5:], "unknown error")
        kind = table["torch_npu"]["kinds"].get(code[5:], "error")
        field = field_rule(line)
        if field is not None and kind == "error":   # the message says more than the code
            return field.kind, field.role, field.label, code, blames, field.fix
        return kind, ("consequence" if kind == "comm_timeout" else "cause"), f"torch_npu {sub}: {what}", code, blames, ""
    field = field_rule(line)
    if field is not None:
        return field.kind, field.role, field.label, code, blames, field.fix
    for rx, kind, role, label in CLASS_RULES:
        if rx.search(line):
            return kind, role, label, code, blames, ""
    if m:  # an Ascend-looking code we have no entry for: report its component
        c = m.group(1).decode()
        comp = table["components"].get(c[1], "unknown component")
        return "error", "cause", f"Ascend error code from {comp}", c, blames, ""
    return (*GENERIC_ERROR, code, blames, "")


MS_PREFIX_RE = re.compile(rb"^\[(\w+)\]\s*(\w+)\([^)]*\):\S+\s+\[([^\]:]+?)(?::(\d{1,9})(?!\d))?\]\s*(?:\[?\d+\]?\s*)?")


PORT_PREFIX_RE = ranklog.DIAG_PREFIX


# C0 controls but tab, DEL, and the Unicode line and paragraph separators: a quoted log line holding "\r" or an
# escape sequence would print over port's own lines in a terminal (issue 51: text in a file forging port's output)
_CONTROL = bytes(range(0, 9)) + bytes(range(10, 32)) + b"\x7f"
_VISIBLE = bytes.maketrans(_CONTROL, b"?" * len(_CONTROL))
_SEPARATORS = (b"\xe2\x80\xa8", b"\xe2\x80\xa9", b"\xc2\x85")


def visible(text: bytes) -> bytes:
    """``text`` with every control character and line separator shown as '?' (it stays one line wherever printed)."""
    text = text.translate(_VISIBLE)
    for sep in _SEPARATORS:
        if sep in text:
            text = text.replace(sep, b"?")
    return text


def clean(line: bytes) -> bytes:
    """A log line without its level/pid/timestamp prefix ('MODULE file.cc:N message' for
    MindSpore/CANN lines, the message for `port train` lines), its control characters made visible."""
    return visible(_strip_prefix(line))


def _strip_prefix(line: bytes) -> bytes:
    pm = PORT_PREFIX_RE.match(line)
    if pm:
        return line[pm.end():].strip()
    m = MS_PREFIX_RE.match(line)
    if not m:
        return line.strip()
    where = os.path.basename(m.group(3).decode("utf-8", "replace")).encode()
    return m.group(2) + b" " + where + (b":" + m.group(4) if m.group(4) else b"") + b" " + line[m.end():].strip()


def is_error_line(line: bytes) -> bool:
    lv = LEVEL_RE.match(line)
    if lv:
        if lv.group(1) in (b"ERROR", b"CRITICAL", b"EXCEPTION") or b"Kill this process with SIGTERM" in line:
            return True
        found = block_class(line)   # a documented fault printed at INFO/WARNING level (HCCL's status[LOST])
        return found is not None and found[1] and found[0].tier <= PROCESS_EXIT_TIER
    pl = PORT_LEVEL_RE.search(line)
    if pl:
        return pl.group(1) in (b"ERROR", b"CRITICAL")
    # a launcher's or logger's prefix ("[rank3]: ", "(Worker pid=9) ", "> " of a quoted paste) before a traceback
    core = line[PREFIX_RE.match(line).end():] if line[:1] in b"([>" or b": " in line[:80] else line
    if line.startswith(b"Traceback (most recent call last)") or core.startswith(b"Traceback (most recent call last)"):
        return True
    if EXC_LINE_RE.match(line.strip()) or (core is not line and EXC_LINE_RE.match(core.strip())):
        return True
    if ASCEND_CODE_RE.match(line.lstrip()) or TORCH_NPU_RE.search(line):
        return True
    if field_rule(line) is not None:
        return True
    if block_class(line) is not None:
        return True   # a documented fault text without an error marker (cause_model.yaml)
    code = ASCEND_CODE_RE.search(line)
    if code and code.group(1).decode() in error_table()["codes"] and re.search(rb"E[0-9A-Z]\d{4}:", line):
        return True
    return bool(re.search(rb"out of memory|Segmentation fault|core dumped|^Killed|Heartbeat Lost|Stuck Occurred|"
                          rb"\bERROR\b|timed out|Kill this process with SIGTERM", line, re.I))


