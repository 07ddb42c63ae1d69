"""`port diagnose LOGDIR`: find the first rank that stopped progressing in a failed or hung job.

Reads msrun ``worker_<rank>.log`` / ``scheduler.log``, `port train` ``rank_<r>.log``, CANN plogs
(``plog-<pid>_<ts>.log``) and any other text log. Each file is scanned once, in bounded chunks:
error lines are found with literal searches (fast C loops, so 10,000-line files cost little), and the
last progress (step, collective) of each chunk with reverse searches. Files are independent, so
large directories are scanned by a process pool.

Deciding cause from consequence follows the HCCL fault-diagnosis guide: a rank whose first error is
a collective timeout waited for someone else (consequence); a rank that raised, ran out of memory or
hit a device error is a cause; when no rank has a cause, the ranks that fell silent without a
timeout of their own (or, when all timed out, the one whose timeout came last) stalled first. The
scheduler's list of timed-out nodes names consequences, not necessarily the stalled rank.
"""

from __future__ import annotations

import calendar
import dataclasses
import json
import os
import re
import statistics
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from porting.diagnostics import DiagnosticsError, load_yaml

CHUNK = 4 << 20          # bytes read at a time per file: bounds memory per worker
MAX_LINE = 4096          # characters kept of one line
MAX_EVENTS_PER_FILE = 24  # error events kept per file (the first ones; the rest are counted)
STEP_SAMPLES = 32        # last step timestamps kept per file for clock-skew estimation
SKEW_MIN_S = 2.0         # offsets below this are clock noise, not skew
BINARY_FRACTION = 0.05   # control bytes (not tab/newline/CR/ESC) above this share of the head = binary
_TEXT_BYTES = bytes([9, 10, 13, 27]) + bytes(range(32, 127)) + bytes(range(128, 256))

# ---------------------------------------------------------------------------------------------
# Line grammar, as data.

TS_RE = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[T -](\d\d):(\d\d):(\d\d)(?:[.:,](\d{1,3}))?")
# A progress line: "step N" / "step=N" / "step: N" / "step:[ N/M]" with a loss on the same line
# (MindSpore LossMonitor, MindFormers, `port train`, plain prints). "stalling at step 3" is not progress.
STEP_RE = re.compile(rb"\bstep\b\s*[:=]?\s*\[?\s*(\d+)(?:\s*/\s*\d+)?\]?[^\n]*?\bloss\b", re.I)
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
# Error and collective literals in one pass. A plain alternation keeps the engine's first-character
# filter (named groups disable it: 10x slower, measured); the matched text says which kind it is.
SCAN_RE = re.compile(b"|".join(re.escape(x) for x in ERROR_LITERALS + COLLECTIVE_LITERALS))
_COLLECTIVE_SET = frozenset(COLLECTIVE_LITERALS)
ASCEND_CODE_RE = re.compile(rb"(?<![A-Za-z0-9])(E[0-9A-Z]\d{4})(?![0-9A-Za-z])")
TORCH_NPU_RE = re.compile(rb"\bERR(\d\d)(\d{3})\b")
LEVEL_RE = re.compile(rb"^\[?(ERROR|CRITICAL|EXCEPTION|WARNING|INFO|DEBUG|TRACE|EVENT)\]?")
PORT_LEVEL_RE = re.compile(rb"\brank=\d+\s+(?:level=)?(ERROR|CRITICAL|WARNING|INFO)\b")
EXC_LINE_RE = re.compile(rb"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?::\s?(.*))?$")
PID_RE = re.compile(rb"^\[[A-Z]+\]\s*[A-Z_]+\((\d+)[,:]", re.M)
REMOTE_RANK_RE = re.compile(rb"remote rank\s*[:\[]+\s*(\d+)", re.I)
LOCATION_RE = re.compile(rb"Cluster Exception Location\[IP/ID\]:\[[^/\]]*/(\d+)\][^\n]*?ExceptionType:\[([^\]]+)\]")
SCHED_TIMEOUT_RE = re.compile(rb"The node: (\d+) is timed out")
SCHED_FIRST_RE = re.compile(rb"worker (\d+) is the first one timed out")
RANK_IN_CONTENT = (
    re.compile(rb"rankNum\[\d+\],\s*rank\[(\d+)\]"),           # HCCL SetupAgent / hcom init
    re.compile(rb"hcom init[^\n]*?rank\[(\d+)\]"),
    re.compile(rb"This node \d+ rank id: (\d+)"),              # MindSpore cluster PostProcess
    re.compile(rb"(?:^|\s)rank=(\d+)\s"),                      # `port train`
)
FILE_KINDS = (  # (kind, filename regex with the rank as group 1 where there is one)
    ("msrun_worker", re.compile(r"^worker_(\d+)\.log$")),
    ("msrun_scheduler", re.compile(r"^scheduler\.log$")),
    ("port_rank", re.compile(r"^rank_(\d+)\.log$")),
    ("plog", re.compile(r"^plog-(\d+)_\d+\.log$")),
    ("device_log", re.compile(r"^device-(\d+)_\d+\.log$")),
)
PATH_RANK_RE = re.compile(r"(?:^|[_/\-])rank[_\-]?(\d+)(?:[_/\-]|$)")

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


# ---------------------------------------------------------------------------------------------
# Data model.

@dataclasses.dataclass
class Event:
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

    def as_dict(self, offset: float = 0.0) -> dict:
        d = dataclasses.asdict(self)
        d["time"] = fmt_ts(self.ts - offset) if self.ts is not None else None
        d["blames"] = list(self.blames)
        return d


@dataclasses.dataclass
class FileScan:
    path: str
    kind: str
    rank: int | None
    lines: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    last_step: int | None = None
    last_step_ts: float | None = None
    last_step_line: int | None = None
    last_collective: str | None = None
    last_collective_ts: float | None = None
    step_samples: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)
    error_lines: int = 0
    codes: Counter = dataclasses.field(default_factory=Counter)
    sched_timed_out: list[int] = dataclasses.field(default_factory=list)
    sched_first: int | None = None
    pid: int | None = None       # process id (plog name or the MODULE(pid,...) prefix)
    problem: str | None = None   # why the file was skipped (binary, unreadable)
    truncated: bool = False      # last line without newline
    replaced_bytes: bool = False # undecodable bytes


@dataclasses.dataclass
class RankView:
    rank: int | str
    files: list[str]
    lines: int
    first_ts: float | None
    last_ts: float | None
    last_step: int | None
    last_step_ts: float | None
    last_collective: str | None
    last_collective_ts: float | None
    first_error: Event | None
    first_cause: Event | None
    first_consequence: Event | None
    error_lines: int
    offset: float = 0.0
    status: str = ""


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
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(round((ts % 1) * 1000)) % 1000:03d}"


def _line_bounds(buf: bytes, pos: int) -> tuple[int, int]:
    start = buf.rfind(b"\n", 0, pos) + 1
    end = buf.find(b"\n", pos)
    return start, (len(buf) if end < 0 else end)


def _ts_before(buf: bytes, start: int) -> tuple[float | None, bool]:
    """Timestamp of the line at ``start``, else of the nearest earlier line in a 16 KB window."""
    end = buf.find(b"\n", start)
    end = len(buf) if end < 0 else end
    m = TS_RE.search(buf, start, min(end, start + 200))
    if m:
        return parse_ts(m), True
    lo = max(0, start - 16384)
    last = None
    for m in TS_RE.finditer(buf, lo, start):
        last = m
    return (parse_ts(last), False) if last else (None, False)


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


def _rank_from_content(head: bytes) -> int | None:
    for rx in RANK_IN_CONTENT:
        m = rx.search(head)
        if m:
            val = next(g for g in m.groups() if g is not None)
            return int(val)
    return None


def _classify_line(line: bytes) -> tuple[str, str, str, str | None, tuple[int, ...]]:
    """(kind, role, label, code, blamed ranks) for an error line."""
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
        return entry["kind"], entry["role"], entry["meaning"], code, blames
    if code and code.startswith("ERR"):
        sub = table["torch_npu"]["submodules"].get(code[3:5], "UNKNOWN")
        what = table["torch_npu"]["codes"].get(code[5:], "unknown error")
        kind = table["torch_npu"]["kinds"].get(code[5:], "error")
        return kind, ("consequence" if kind == "comm_timeout" else "cause"), f"torch_npu {sub}: {what}", code, blames
    for rx, kind, role, label in CLASS_RULES:
        if rx.search(line):
            return kind, role, label, code, blames
    if m:  # an Ascend-looking code we have no entry for: report its component
        c = m.group(1).decode()
        comp = table["components"].get(c[1], "unknown component")
        return "error", "cause", f"Ascend error code from {comp}", c, blames
    return (*GENERIC_ERROR, code, blames)


MS_PREFIX_RE = re.compile(rb"^\[(\w+)\]\s*(\w+)\([^)]*\):\S+\s+\[([^\]:]+?)(?::(\d+))?\]\s*(?:\[?\d+\]?\s*)?")


PORT_PREFIX_RE = re.compile(rb"^\d{4}-\d\d-\d\d[T ][\d:.,]+\s+rank=\d+\s+(?:level=)?(?:ERROR|CRITICAL|WARNING|INFO)?\s*")


def _clean(line: bytes) -> bytes:
    """A log line without its level/pid/timestamp prefix ('MODULE file.cc:N message' for
    MindSpore/CANN lines, the message for `port train` lines)."""
    pm = PORT_PREFIX_RE.match(line)
    if pm:
        return line[pm.end():].strip()
    m = MS_PREFIX_RE.match(line)
    if not m:
        return line.strip()
    where = os.path.basename(m.group(3).decode("utf-8", "replace")).encode()
    return m.group(2) + b" " + where + (b":" + m.group(4) if m.group(4) else b"") + b" " + line[m.end():].strip()


def _is_error_line(line: bytes) -> bool:
    lv = LEVEL_RE.match(line)
    if lv:
        return lv.group(1) in (b"ERROR", b"CRITICAL", b"EXCEPTION") or b"Kill this process with SIGTERM" in line
    pl = PORT_LEVEL_RE.search(line)
    if pl:
        return pl.group(1) in (b"ERROR", b"CRITICAL")
    if line.startswith(b"Traceback (most recent call last)"):
        return True
    if EXC_LINE_RE.match(line.strip()):
        return True
    if ASCEND_CODE_RE.match(line.lstrip()) or TORCH_NPU_RE.search(line):
        return True
    return bool(re.search(rb"out of memory|Segmentation fault|core dumped|^Killed|Heartbeat Lost|Stuck Occurred|"
                          rb"\bERROR\b|timed out|Kill this process with SIGTERM", line, re.I))


def _exception_summary(buf: bytes, start: int) -> tuple[bytes, int] | None:
    """For a Traceback at ``start``, the final ``XxxError: message`` line and its offset."""
    pos = start
    limit = min(len(buf), start + 65536)
    while pos < limit:
        end = buf.find(b"\n", pos)
        end = limit if end < 0 or end > limit else end
        line = buf[pos:end]
        if line and not line.startswith((b" ", b"\t", b"Traceback")):
            if EXC_LINE_RE.match(line.strip()):
                return line, pos
        pos = end + 1
    return None


class _Scanner:
    """State carried across the chunks of one file."""

    def __init__(self, scan: FileScan):
        self.s = scan
        self.line_base = 0        # lines before the current chunk
        self.carry_ts: float | None = None  # last timestamp seen in earlier chunks
        self.consumed_upto = 0    # offset in the chunk below which lines were already turned into events

    def chunk(self, buf: bytes) -> None:
        s = self.s
        # first timestamp of the file
        if s.first_ts is None:
            m = TS_RE.search(buf, 0, min(len(buf), 1 << 16))
            if m:
                s.first_ts = parse_ts(m)
        # error events (forward, literal searches)
        if s.kind == "msrun_scheduler":  # small file: read its verdict lines directly
            s.sched_timed_out += [int(x) for x in SCHED_TIMEOUT_RE.findall(buf)]
            sf = SCHED_FIRST_RE.search(buf)
            if sf and s.sched_first is None:
                s.sched_first = int(sf.group(1))
        hits: set[int] = set()
        last_coll = -1
        for m in SCAN_RE.finditer(buf):
            p = m.start()
            if m.group() in _COLLECTIVE_SET:
                last_coll = p
            elif len(hits) <= 4096:  # a pathological file (every line an "error"): keep the earliest
                hits.add(buf.rfind(b"\n", 0, p + (1 if buf[p:p + 1] == b"\n" else 0)) + 1)
        self.consumed_upto = 0
        for st in sorted(hits):
            if st < self.consumed_upto:
                continue
            _, end = _line_bounds(buf, st)
            line = buf[st:end][:MAX_LINE]
            if not _is_error_line(line):
                continue
            s.error_lines += 1
            for c in ASCEND_CODE_RE.findall(line):
                if c.decode() in error_table()["codes"]:
                    s.codes[c.decode()] += 1
            for c in TORCH_NPU_RE.finditer(line):
                s.codes["ERR" + c.group(1).decode() + c.group(2).decode()] += 1
            if len(s.events) >= MAX_EVENTS_PER_FILE:
                continue
            text = line
            kind, role, label, code, blames = _classify_line(line)
            if line.startswith(b"Traceback"):
                summ = _exception_summary(buf, st)
                if summ:
                    text = summ[0][:MAX_LINE]
                    k2, r2, l2, c2, b2 = _classify_line(text)
                    if k2 not in ("error", "exception"):
                        kind, role, label, code, blames = k2, r2, l2, c2 or code, b2 or blames
                    else:
                        # the exception is a consequence when the traceback comes right after comm errors
                        prev = [e for e in s.events[-4:] if e.kind == "comm_timeout"]
                        if prev:
                            kind, role, label = "comm_timeout", "consequence", "exception after a collective failure"
                    self.consumed_upto = summ[1] + len(summ[0])
            ts, exact = _ts_before(buf, st)
            if ts is None:
                ts, exact = self.carry_ts, False
            lineno = self.line_base + buf.count(b"\n", 0, st) + 1
            s.events.append(Event(s.path, lineno, ts, exact, kind, role, label,
                                  _clean(text).decode("utf-8", "replace"), code, blames))
        # last progress in this chunk (reverse searches)
        self._last_step(buf)
        if last_coll >= 0:
            self._last_collective(buf, last_coll)
        # last timestamp in this chunk
        tail = buf[-8192:] if len(buf) > 8192 else buf
        last = None
        for m in TS_RE.finditer(tail):
            last = m
        if last:
            t = parse_ts(last)
            if t is not None:
                s.last_ts = t
                self.carry_ts = t
        self.line_base += buf.count(b"\n")

    def _last_step(self, buf: bytes) -> None:
        s = self.s
        samples: list[tuple[int, float]] = []
        found_last = False
        p = len(buf)
        cap = buf.rfind(b"Step")  # capitalised form, searched once (rare in practice)
        while len(samples) < STEP_SAMPLES:
            if cap >= p:
                cap = buf.rfind(b"Step", 0, p)
            p = max(buf.rfind(b"step", 0, p), cap)
            if p < 0:
                break
            st, end = _line_bounds(buf, p)
            m = STEP_RE.search(buf, st, end)
            if m:
                step = int(m.group(1))
                ts, exact = _ts_before(buf, st)
                if ts is None:
                    ts = self.carry_ts
                if not found_last:
                    found_last = True
                    s.last_step, s.last_step_ts = step, ts
                    s.last_step_line = self.line_base + buf.count(b"\n", 0, st) + 1
                if ts is not None and exact:
                    samples.append((step, ts))
                else:
                    break  # untimestamped progress lines cannot align clocks
            p = st - 1
            if p <= 0:
                break
        if samples:
            s.step_samples = (s.step_samples + samples[::-1])[-STEP_SAMPLES:]

    def _last_collective(self, buf: bytes, pos: int) -> None:
        st, end = _line_bounds(buf, pos)
        m = COLLECTIVE_RE.search(buf, st, end)
        if not m:
            return
        name = m.group(1).decode()
        tag = m.group(2).decode() if m.group(2) else None
        ts, _ = _ts_before(buf, st)
        self.s.last_collective = name + (f" [{tag}]" if tag else "")
        self.s.last_collective_ts = ts if ts is not None else self.carry_ts


def scan_file(root: str, rel: str) -> FileScan:
    """Scan one log file. Never raises for bad content; problems are recorded on the result."""
    kind, rank = classify_file(rel)
    scan = FileScan(path=rel, kind=kind, rank=rank)
    path = os.path.join(root, rel)
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
            if not head:
                scan.problem = "empty file"
                return scan
            if len(head.translate(None, _TEXT_BYTES)) > BINARY_FRACTION * len(head):
                scan.problem = "binary content (control bytes), skipped"
                return scan
            if scan.rank is None and kind != "msrun_scheduler":
                scan.rank = _rank_from_content(head)
            pm = re.match(r"^(?:plog|device)-(\d+)_", os.path.basename(rel))
            pc = PID_RE.search(head)
            scan.pid = int(pm.group(1)) if pm else (int(pc.group(1)) if pc else None)
            f.seek(0)
            sc = _Scanner(scan)
            pending = b""
            while True:
                data = f.read(CHUNK)
                if not data:
                    break
                buf = pending + data
                cut = buf.rfind(b"\n")
                if cut < 0 and len(buf) < CHUNK * 2:
                    pending = buf
                    continue
                if cut < 0:  # a single giant line: cut it
                    cut = len(buf) - 1
                if b"\0" in buf:
                    buf = buf.replace(b"\0", b"")
                    scan.replaced_bytes = True
                sc.chunk(buf[:cut + 1])
                pending = buf[cut + 1:]
            if pending:
                scan.truncated = True
                sc.chunk(pending)
            scan.lines = sc.line_base + (1 if scan.truncated else 0)
    except OSError as e:
        scan.problem = f"unreadable: {e.strerror or e}"
    return scan


# ---------------------------------------------------------------------------------------------
# Directory walk.

LOG_SUFFIXES = (".log", ".txt", ".out", ".err")


def list_logs(logdir: Path) -> tuple[list[str], list[str]]:
    """Relative paths of log files under ``logdir`` and problems met while walking."""
    if not logdir.exists():
        raise DiagnosticsError(f"{logdir}: no such directory; pass the job's log directory "
                               f"(msrun --log_dir, a run's logs/, or a CANN log dir)")
    if not logdir.is_dir():
        raise DiagnosticsError(f"{logdir}: is a file; pass the directory that holds the logs")
    if not os.access(logdir, os.R_OK | os.X_OK):
        raise DiagnosticsError(f"{logdir}: directory is not readable (permissions); run as the job's user "
                               f"or copy the logs")
    found: list[str] = []
    problems: list[str] = []

    def onerror(e: OSError) -> None:
        problems.append(f"{e.filename}: unreadable directory ({e.strerror})")

    for dirpath, _dirs, files in os.walk(logdir, onerror=onerror):
        for name in files:
            if name.endswith(LOG_SUFFIXES) or re.match(r"^(plog|device)-\d+_\d+", name):
                full = os.path.join(dirpath, name)
                found.append(os.path.relpath(full, logdir))
    found.sort()
    return found, problems


def scan_dir(logdir: Path, jobs: int | None = None) -> tuple[list[FileScan], list[str]]:
    files, problems = list_logs(logdir)
    if not files:
        raise DiagnosticsError(
            f"{logdir}: no log files found (looked for worker_<r>.log, scheduler.log, rank_<r>.log, "
            f"plog-<pid>_<ts>.log and other *.log/*.txt); pass msrun's --log_dir or the run's logs/")
    root = str(logdir)
    jobs = jobs or min(os.cpu_count() or 1, 8)
    if jobs <= 1 or len(files) < 64:
        scans = [scan_file(root, rel) for rel in files]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            scans = list(pool.map(_scan_star, ((root, rel) for rel in files), chunksize=32))
    return scans, problems


def _scan_star(args: tuple[str, str]) -> FileScan:
    return scan_file(*args)


# ---------------------------------------------------------------------------------------------
# Merging files into ranks, aligning clocks, deciding.

def _ranks_from_pids(scans: list[FileScan]) -> None:
    """A process's debug plog rarely names its rank; its run plog (same pid) often does."""
    by_pid: dict[tuple[str, int], int] = {}
    for sc in scans:
        if sc.rank is not None and sc.pid is not None:
            by_pid.setdefault((os.path.dirname(sc.path), sc.pid), sc.rank)
    for sc in scans:
        if sc.rank is None and sc.pid is not None and sc.kind != "msrun_scheduler":
            sc.rank = by_pid.get((os.path.dirname(sc.path), sc.pid))


def _rank_key(scan: FileScan) -> int | str:
    if scan.rank is not None:
        return scan.rank
    return f"file:{scan.path}"


def merge_ranks(scans: Iterable[FileScan]) -> dict[int | str, RankView]:
    groups: dict[int | str, list[FileScan]] = {}
    for sc in scans:
        if sc.problem or sc.kind == "msrun_scheduler":
            continue
        groups.setdefault(_rank_key(sc), []).append(sc)
    views: dict[int | str, RankView] = {}
    for key, items in groups.items():
        events = sorted((e for sc in items for e in sc.events),
                        key=lambda e: (e.ts is None, e.ts or 0.0, e.source, e.line))
        steps = [sc for sc in items if sc.last_step is not None]
        best_step = max(steps, key=lambda sc: (sc.last_step, sc.last_step_ts or 0.0)) if steps else None
        colls = [sc for sc in items if sc.last_collective]
        best_coll = max(colls, key=lambda sc: sc.last_collective_ts or 0.0) if colls else None
        firsts = [sc.first_ts for sc in items if sc.first_ts is not None]
        lasts = [sc.last_ts for sc in items if sc.last_ts is not None]
        views[key] = RankView(
            rank=key, files=sorted(sc.path for sc in items), lines=sum(sc.lines for sc in items),
            first_ts=min(firsts) if firsts else None, last_ts=max(lasts) if lasts else None,
            last_step=best_step.last_step if best_step else None,
            last_step_ts=best_step.last_step_ts if best_step else None,
            last_collective=best_coll.last_collective if best_coll else None,
            last_collective_ts=best_coll.last_collective_ts if best_coll else None,
            first_error=events[0] if events else None,
            first_cause=next((e for e in events if e.role == "cause" and e.kind != "error"), None)
            or next((e for e in events if e.role == "cause"), None),
            first_consequence=next((e for e in events if e.role == "consequence"), None),
            error_lines=sum(sc.error_lines for sc in items))
    return views


def clock_offsets(scans: Iterable[FileScan]) -> dict[int | str, float]:
    """Per-rank clock offset (seconds ahead of the reference rank), from steps that every rank
    finishes together in synchronous data parallel. Offsets under SKEW_MIN_S are reported as 0."""
    per_rank: dict[int | str, dict[int, float]] = {}
    for sc in scans:
        if sc.problem or not sc.step_samples:
            continue
        per_rank.setdefault(_rank_key(sc), {}).update(dict(sc.step_samples))
    if len(per_rank) < 2:
        return {}
    ref_key = min(per_rank, key=lambda k: (isinstance(k, str), str(k) if isinstance(k, str) else k))
    ref = per_rank[ref_key]
    offsets: dict[int | str, float] = {}
    for key, steps in per_rank.items():
        common = [steps[s] - ref[s] for s in steps.keys() & ref.keys()]
        if len(common) < 2:
            continue
        off = statistics.median(common)
        if abs(off) >= SKEW_MIN_S:
            offsets[key] = off
    return offsets


def _t(ts: float | None, off: float) -> float | None:
    return None if ts is None else ts - off


def _sort_key(key: int | str) -> tuple[int, int | str]:
    return (0, key) if isinstance(key, int) else (1, key)


def decide(views: dict[int | str, RankView], sched_timed_out: list[int], sched_first: int | None) -> dict:
    """Name the first rank that stopped progressing, and why. Returns the verdict fields."""
    ranks = sorted(views.values(), key=lambda v: _sort_key(v.rank))
    if not ranks:
        return {"first_failing_rank": None, "last_step": None, "reason": "no rank logs could be read",
                "reason_kind": "no_output", "evidence": []}
    # causes: a cause-type event that is not preceded by a collective timeout on the same rank
    causes = []
    for v in ranks:
        c = v.first_cause
        if c is None:
            continue
        q = v.first_consequence
        ct, qt = _t(c.ts, v.offset), _t(q.ts, v.offset) if q else None
        if q is not None and c.kind == "error":
            continue  # a generic error line on a rank that also timed out is part of the timeout report
        if q is not None and qt is not None and ct is not None and qt < ct - 1.0:
            continue  # this rank first timed out waiting; its later error is fallout
        causes.append(v)
    blames = Counter(b for v in ranks for e in ([v.first_consequence] if v.first_consequence else [])
                     for b in e.blames)
    if causes:
        real = [v for v in causes if v.first_cause.kind != "error"] or causes
        first = min(real, key=lambda v: (_t(v.first_cause.ts, v.offset) is None,
                                          _t(v.first_cause.ts, v.offset) or 0.0, _sort_key(v.rank)))
        e = first.first_cause
        kind = {"oom": "oom", "exception": "exception", "crash": "crash", "device": "device_error",
                "config": "config", "operator": "operator_error"}.get(e.kind, "error")
        reason = f"{kind}: {e.text} ({e.source}:{e.line})"
        if e.code:
            reason += f" [{e.code}: {e.label}]"
        return {"first_failing_rank": first.rank, "last_step": first.last_step, "reason": reason,
                "reason_kind": kind, "evidence": [e.as_dict(first.offset)]}
    timed_out = [v for v in ranks if v.first_consequence is not None]
    silent = [v for v in ranks if v.first_error is None]
    if timed_out:
        if silent:
            # ranks without a timeout of their own stalled; the lowest progress among them first
            pool = silent
            why = "stalled"
        elif blames:
            pool = [v for v in ranks if v.rank in blames] or timed_out
            why = "named by the other ranks' collective timeouts"
        else:
            # every rank timed out: the late one entered the collective last, so its timeout came last
            late = max(timed_out, key=lambda v: _t(v.first_consequence.ts, v.offset) or 0.0)
            pool = [late]
            why = "all ranks timed out; its timeout came last, so it reached the collective last"
        first = min(pool, key=lambda v: (v.last_step if v.last_step is not None else -1,
                                         -blames.get(v.rank, 0),
                                         _t(v.last_step_ts, v.offset) or _t(v.last_ts, v.offset) or 0.0,
                                         _sort_key(v.rank)))
        others = [v for v in timed_out if v is not first]
        ev = [first.first_consequence.as_dict(first.offset)] if first.first_consequence else []
        ev += [v.first_consequence.as_dict(v.offset) for v in others[:3]]
        if why == "stalled" and not first.files:
            reason = (f"no output: no log for this rank (never started, or its node or logs were lost); "
                      f"{len(others)} other rank(s) timed out in a collective waiting for it")
            return {"first_failing_rank": first.rank, "last_step": None, "reason": reason,
                    "reason_kind": "no_output", "evidence": ev}
        if why == "stalled":
            at = fmt_ts(_t(first.last_ts, first.offset))
            step_txt = f"after step {first.last_step}" if first.last_step is not None else "before its first step"
            reason = (f"stalled: no progress {step_txt} and no error of its own (last output {at}); "
                      f"{len(others)} other rank(s) then timed out or were stopped waiting for it")
        else:
            reason = f"{why}: first timeout {first.first_consequence.text[:200]}"
        if sched_timed_out and first.rank in sched_timed_out:
            reason += "; msrun's scheduler also lost its heartbeat"
        elif sched_timed_out and first.rank not in sched_timed_out:
            reason += (f"; msrun's scheduler named rank(s) {sorted(set(sched_timed_out))} as timed out"
                       + (f" (worker {sched_first} 'first')" if sched_first is not None else "")
                       + ": those are consequences")
        return {"first_failing_rank": first.rank, "last_step": first.last_step, "reason": reason,
                "reason_kind": "stall" if why == "stalled" else "comm_timeout", "evidence": ev}
    if sched_timed_out:
        # nobody logged an error, but the scheduler lost some nodes' heartbeats: a frozen or killed
        # process (its heartbeat thread stops too), or a lost host
        pool = [views[r] for r in sorted(set(sched_timed_out)) if r in views] or []
        pick = sched_first if sched_first in views else (pool[0].rank if pool else sorted(set(sched_timed_out))[0])
        v = views.get(pick)
        step = v.last_step if v else None
        return {"first_failing_rank": pick, "last_step": step,
                "reason": (f"lost: msrun's scheduler declared rank {pick} timed out (no heartbeat: the process froze, "
                           f"was killed, or its host was lost) and no rank logged an error of its own"
                           + (f"; last progress step {step}" if step is not None else "")),
                "reason_kind": "lost", "evidence": []}
    # no errors anywhere: the rank with the lowest progress stopped first (if progress differs)
    with_steps = [v for v in ranks if v.last_step is not None]
    if with_steps and len({v.last_step for v in with_steps}) > 1:
        first = min(with_steps, key=lambda v: (v.last_step, _sort_key(v.rank)))
        top = max(v.last_step for v in with_steps)
        return {"first_failing_rank": first.rank, "last_step": first.last_step,
                "reason": f"no output: stopped after step {first.last_step} while others reached step {top}; "
                          f"no error logged (killed, hung outside collectives, or logs lost)",
                "reason_kind": "no_output", "evidence": []}
    return {"first_failing_rank": None, "last_step": None,
            "reason": "no failure found: no error lines and every rank reached the same progress",
            "reason_kind": "none", "evidence": []}


def _status(v: RankView, verdict_rank: int | str | None) -> str:
    if v.rank == verdict_rank:
        return "first failure"
    if v.first_consequence is not None and (v.first_cause is None or
                                            (v.first_consequence.ts or 0) <= (v.first_cause.ts or 0)):
        return "timed out (consequence)"
    if v.first_cause is not None:
        return f"error ({v.first_cause.kind})"
    return "no error"


def _add_missing_ranks(views: dict[int | str, RankView], world_size: int | None, warnings: list[str]) -> None:
    seen = sorted(k for k in views if isinstance(k, int))
    if world_size is not None:
        extra = [r for r in seen if r >= world_size]
        if extra:
            warnings.append(f"logs name rank(s) {extra[:8]} outside --world-size {world_size}")
        missing = [r for r in range(world_size) if r not in views]
        for r in missing:
            views[r] = RankView(r, [], 0, None, None, None, None, None, None, None, None, None, 0)
        if missing:
            warnings.append(f"no log for rank(s) {missing[:16]} of world size {world_size}")
    elif len(seen) >= 2:
        gaps = sorted(set(range(seen[-1] + 1)) - set(seen))
        if gaps:
            warnings.append(f"no log for rank(s) {gaps[:16]} (ranks 0..{seen[-1]} expected; pass --world-size)")


def diagnose(logdir: str | os.PathLike, jobs: int | None = None, world_size: int | None = None) -> dict:
    """Diagnose a job's logs; the returned dict is what ``--json`` prints. With ``world_size``,
    ranks without any log count as silent (no output)."""
    logdir = Path(logdir)
    scans, walk_problems = scan_dir(logdir, jobs)
    readable = [sc for sc in scans if not sc.problem]
    warnings = list(walk_problems)
    warnings += [f"{sc.path}: {sc.problem}" for sc in scans if sc.problem and sc.problem != "empty file"]
    warnings += [f"{sc.path}: last line has no newline (file truncated or still being written)"
                 for sc in readable if sc.truncated][:20]
    warnings += [f"{sc.path}: NUL bytes removed" for sc in readable if sc.replaced_bytes][:20]
    if not readable:
        raise DiagnosticsError(f"{logdir}: none of the {len(scans)} log file(s) could be read "
                               f"({'; '.join(warnings[:3]) or 'all empty'}); check permissions and that "
                               f"these are text logs")
    _ranks_from_pids(readable)
    views = merge_ranks(readable)
    _add_missing_ranks(views, world_size, warnings)
    offsets = clock_offsets(readable)
    for key, off in offsets.items():
        if key in views:
            views[key].offset = off
            warnings.append(f"rank {key}: clock differs by {off:+.1f} s from the reference rank "
                            f"(estimated from steps finished together); times corrected")
    sched = [sc for sc in readable if sc.kind == "msrun_scheduler"]
    sched_timed_out = [r for sc in sched for r in sc.sched_timed_out]
    sched_first = next((sc.sched_first for sc in sched if sc.sched_first is not None), None)
    verdict = decide(views, sched_timed_out, sched_first)
    codes = Counter()
    code_ranks: dict[str, set] = {}
    for sc in readable:
        for c, n in sc.codes.items():
            codes[c] += n
            code_ranks.setdefault(c, set()).add(_rank_key(sc))
    table = error_table()
    explained = []
    for c, n in codes.most_common():
        entry = table["codes"].get(c)
        if entry is None and c.startswith("ERR"):
            entry = {"meaning": f"torch_npu {table['torch_npu']['submodules'].get(c[3:5], 'UNKNOWN')}: "
                                f"{table['torch_npu']['codes'].get(c[5:], 'unknown')}",
                     "next_step": "read the message on the same line; ERR<submodule><code> is torch_npu's error id"}
        explained.append({"code": c, "count": n, "meaning": (entry or {}).get("meaning", "not in the table"),
                          "next_step": (entry or {}).get("next_step", ""),
                          "ranks": sorted(code_ranks[c], key=_sort_key)[:16]})
    rows = []
    for v in sorted(views.values(), key=lambda v: _sort_key(v.rank)):
        fe = v.first_cause if _status(v, verdict["first_failing_rank"]) != "timed out (consequence)" else None
        fe = fe or v.first_error
        rows.append({
            "rank": v.rank, "files": v.files[:8], "lines": v.lines, "status": _status(v, verdict["first_failing_rank"]),
            "last_step": v.last_step, "last_step_time": fmt_ts(_t(v.last_step_ts, v.offset)),
            "last_collective": v.last_collective, "last_collective_time": fmt_ts(_t(v.last_collective_ts, v.offset)),
            "last_output_time": fmt_ts(_t(v.last_ts, v.offset)),
            "first_error": fe.as_dict(v.offset) if fe else None,
            "error_lines": v.error_lines, "clock_offset_s": round(v.offset, 3)})
    timeline = sorted(((_t(e.ts, views[k].offset), k, e) for k in views
                       for e in [views[k].first_error, views[k].first_consequence, views[k].first_cause] if e),
                      key=lambda x: (x[0] is None, x[0] or 0.0))
    seen = set()
    tl = []
    for t, k, e in timeline:
        ident = (k, e.source, e.line)
        if ident in seen:
            continue
        seen.add(ident)
        tl.append({"time": fmt_ts(t), "rank": k, "kind": e.kind, "role": e.role, "text": e.text[:240],
                   "where": f"{e.source}:{e.line}"})
        if len(tl) >= 40:
            break
    kinds = Counter(sc.kind for sc in readable)
    return {
        "logdir": str(logdir), "files": len(scans), "files_read": len(readable), "formats": dict(kinds),
        "ranks_seen": len(views),
        **verdict,
        "scheduler": {"timed_out_ranks": sorted(set(sched_timed_out)), "first_timed_out": sched_first}
        if sched else None,
        "ranks": rows, "error_codes": explained, "timeline": tl, "warnings": warnings,
    }


# ---------------------------------------------------------------------------------------------
# Text rendering.

def render_text(d: dict, max_ranks: int = 32) -> str:
    out = [f"port diagnose {d['logdir']}: {d['files_read']}/{d['files']} files, {d['ranks_seen']} rank(s) "
           f"({', '.join(f'{k} {v}' for k, v in sorted(d['formats'].items()))})", ""]
    if d["first_failing_rank"] is not None:
        out.append(f"FIRST FAILING RANK: {d['first_failing_rank']}   last step: {d['last_step']}")
    else:
        out.append("FIRST FAILING RANK: none found")
    out.append(f"reason: {d['reason']}")
    if d.get("scheduler"):
        s = d["scheduler"]
        out.append(f"scheduler: timed-out ranks {s['timed_out_ranks']}, first timed out {s['first_timed_out']}")
    out.append("")
    hdr = f"{'rank':>6}  {'status':<24} {'last step':>9}  {'step time':<23} {'last collective':<22} first error"
    out.append(hdr)
    shown = d["ranks"]
    if len(shown) > max_ranks:
        keep = [r for r in shown if r["rank"] == d["first_failing_rank"]]
        shown = keep + [r for r in shown if r not in keep][: max_ranks - len(keep)]
    for r in shown:
        fe = r["first_error"]
        fe_txt = f"{fe['time'] or '?'} {fe['kind']}: {fe['text'][:80]}" if fe else "-"
        out.append(f"{str(r['rank']):>6}  {r['status']:<24} {str(r['last_step']):>9}  "
                   f"{str(r['last_step_time']):<23} {str(r['last_collective'] or '-')[:22]:<22} {fe_txt}")
    if len(d["ranks"]) > len(shown):
        out.append(f"  ... {len(d['ranks']) - len(shown)} more rank(s); use --json for all")
    if d["error_codes"]:
        out += ["", "error codes:"]
        for c in d["error_codes"]:
            out.append(f"  {c['code']} x{c['count']} (ranks {c['ranks']}): {c['meaning']}")
            if c["next_step"]:
                out.append(f"      next: {c['next_step']}")
    if d["timeline"]:
        out += ["", "timeline (first errors, clock-corrected):"]
        for t in d["timeline"][:12]:
            out.append(f"  {t['time'] or '?':<23} rank {t['rank']}: {t['kind']} ({t['role']}) {t['text'][:100]}")
    if d["warnings"]:
        out += ["", "warnings:"] + [f"  {w}" for w in d["warnings"][:20]]
    return "\n".join(out)


def write_json(d: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(d, indent=2, default=str))
    os.replace(tmp, path)
