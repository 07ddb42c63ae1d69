"""Scanning log files for `port diagnose`: each file once, in bounded chunks.

Error lines are found with literal searches (fast C loops, so 10,000-line files cost little), and
the last progress (step, collective) of each chunk with reverse searches. Each line is looked at
once and at most ``MAX_LINE`` bytes of it are classified, so time is linear in the file size even
for one long line full of error words. Files are independent, so large directories are scanned by
a process pool (porting/diagnostics/walk.py). Non-regular files (FIFOs, devices) are skipped with a note;
UTF-16 logs are decoded.
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import re
import stat
from collections import Counter
from typing import Iterator

from porting.diagnostics.causes import annotate
from porting.diagnostics.tail import TAIL_BYTES, read_tail
from porting.rundir import ranklog
from porting.diagnostics.field import (COMM_INIT_LITERAL, REPORTER_RES, WORLD_GROUPS, comm_inits, launch_layout, line_facts,
                                       prefixed_ranks, root_cause, split_by_rank_prefix)
from porting.diagnostics.grammar import (ASCEND_CODE_RE, COLLECTIVE_RE, EXC_LINE_RE, MAX_LINE, PID_RE,
                                         ERROR_SCAN_RE, SCHED_FIRST_RE, SCHED_TIMEOUT_RE, STEP_RE, TORCH_NPU_RE,
                                         TS_RE, Event, classify_file, classify_line, clean, error_table,
                                         is_error_line, parse_ts, rank_from_content, COLLECTIVE_LITERALS)

CHUNK = 4 << 20          # bytes read at a time per file: bounds memory per worker
MAX_ERROR_LINES = 4097  # error lines looked at per chunk (a file where every line is an error)
MAX_EVENTS_PER_FILE = 24  # error events kept per file (the first ones; the rest are counted)
STEP_SAMPLES = 32        # last step timestamps kept per file for clock-skew estimation
MAX_SPLIT_BYTES = 256 << 20  # a [rankN]:-prefixed file up to this size is split per rank in memory
MAX_COMM_INITS = 256      # communicator set-up lines kept per file (one per group a process joins)
WORLD_RE = re.compile(rb" INFO rank \d{1,9} of (\d{1,9}) \(pid \d{1,10}\)")   # ranklog.pid_line, read in a file's head
BINARY_FRACTION = 0.05   # control bytes (not tab/newline/CR/ESC) above this share of the head = binary
_TEXT_BYTES = bytes([9, 10, 13, 27]) + bytes(range(32, 127)) + bytes(range(128, 256))


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
    replaced_bytes: bool = False # NUL bytes removed
    note: str | None = None      # how the file was read, when not plainly (UTF-16 decoded)
    parts: list["FileScan"] = dataclasses.field(default_factory=list)  # per-rank parts of a [rankN]: file
    layout: dict = dataclasses.field(default_factory=dict)   # node_rank / nproc_per_node the text shows
    comm_inits: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)  # HCCL (group, rank, size)
    rank_from_name: bool = False   # rank read from the file name, not from a line's text
    unclassified: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # failure lines of no class (tail.py)
    save_part: tuple[int, str, float | None] | None = None   # `port train`'s last save part: (step, part, time)
    world: int | None = None     # the job's size a `port train` rank log states ("rank R of W (pid P)")


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


def error_line_starts(buf: bytes, limit: int = MAX_ERROR_LINES) -> list[int]:
    """Offsets of the first ``limit`` lines holding an error literal, in order. Each line is visited
    once (the search resumes at its end), so a line with a million error words costs one pass."""
    starts: list[int] = []
    pos = lo = 0      # lo: the start of the line the search is in
    while len(starts) < limit:
        m = ERROR_SCAN_RE.search(buf, pos)
        if m is None:
            break
        p = m.start()
        if buf[p] == 10:      # the "\nE" literal: the line after this newline starts with E
            st = p + 1
        else:
            nl = buf.rfind(b"\n", lo, p)
            st = nl + 1 if nl >= 0 else lo
        end = buf.find(b"\n", st)
        starts.append(st)
        if end < 0:
            break
        pos, lo = end, end + 1
    return starts


class _Scanner:
    """State carried across the chunks of one file."""

    def __init__(self, scan: FileScan):
        self.s = scan
        self.line_base = 0        # lines before the current chunk
        self.carry_ts: float | None = None  # last timestamp seen in earlier chunks
        self.consumed_upto = 0    # offset in the chunk below which lines were already turned into events
        self._count_at = (0, 0)   # (offset, newlines before it) in the current chunk
        self._chunk_lines = 0     # newlines in the current chunk
        self.tail = b""           # the file's last TAIL_BYTES so far, from a line start (tail.py reads it at the end)
        self.tail_line0 = 1       # the number of the tail's first line

    def chunk(self, buf: bytes) -> None:
        s = self.s
        if s.first_ts is None:
            m = TS_RE.search(buf, 0, min(len(buf), 1 << 16))
            if m:
                s.first_ts = parse_ts(m)
        if s.kind == "msrun_scheduler":  # small file: read its verdict lines directly
            s.sched_timed_out += [int(x) for x in SCHED_TIMEOUT_RE.findall(buf)]
            sf = SCHED_FIRST_RE.search(buf)
            if sf and s.sched_first is None:
                s.sched_first = int(sf.group(1))
        self.consumed_upto = 0
        self._count_at = (0, 0)
        self._chunk_lines = buf.count(b"\n")
        for st in error_line_starts(buf):
            if st >= self.consumed_upto:
                self._error_line(buf, st)
        self._last_step(buf)
        if s.kind == "port_rank" and (p := buf.rfind(b": save phase ")) >= 0:
            self._save_part(buf, p)
        last_coll = -1
        for lit in COLLECTIVE_LITERALS:   # each later search only looks after the best hit so far
            last_coll = max(last_coll, buf.rfind(lit, last_coll + 1))
        if last_coll >= 0:
            self._last_collective(buf, last_coll)
        tail = buf[-8192:] if len(buf) > 8192 else buf
        last = None
        for m in TS_RE.finditer(tail):
            last = m
        if last:
            t = parse_ts(last)
            if t is not None:
                s.last_ts = t
                self.carry_ts = t
        self.line_base += self._chunk_lines
        self._keep_tail(buf)

    def _keep_tail(self, buf: bytes) -> None:
        keep = buf[-TAIL_BYTES:] if len(buf) >= TAIL_BYTES else (self.tail + buf)[-TAIL_BYTES:]
        if len(keep) < len(self.tail) + len(buf):   # cut to a line start
            keep = keep[keep.find(b"\n") + 1:]
        self.tail = keep
        # the line after the last newline is line_base + 1; keep's first line is that many newlines before it
        self.tail_line0 = self.line_base + 1 - keep.count(b"\n")

    def _lineno(self, buf: bytes, st: int) -> int:
        """1-based line number of offset ``st``; counted on from the previous call (starts only grow)."""
        at, n = self._count_at
        if st - at > len(buf) - st:   # nearer the end (the usual last error): count the tail instead
            n = self._chunk_lines - buf.count(b"\n", st)
        else:
            n += buf.count(b"\n", at, st)
        self._count_at = (st, n)
        return self.line_base + n + 1

    def _error_line(self, buf: bytes, st: int) -> None:
        """Count the line at ``st`` when it is an error line, and keep it as an event (the first ones)."""
        s = self.s
        _, end = _line_bounds(buf, st)
        line = buf[st:min(end, st + MAX_LINE)]
        if COMM_INIT_LITERAL in line and len(s.comm_inits) < MAX_COMM_INITS:
            s.comm_inits += comm_inits(line)[:MAX_COMM_INITS - len(s.comm_inits)]
        if not is_error_line(line):
            if end - st > MAX_LINE and ERROR_SCAN_RE.search(buf, st + MAX_LINE, end) and len(s.unclassified) < 4:
                # its error text lies past the bytes a line is classified on: said, never "no failure found" over it
                s.unclassified.append((self._lineno(buf, st), f"a line of {end - st} bytes whose error text lies "
                                       f"past the first {MAX_LINE} bytes read: {clean(line[:160]).decode('utf-8', 'replace')}"))
            return
        s.error_lines += 1
        for c in ASCEND_CODE_RE.findall(line):
            if c.decode() in error_table()["codes"]:
                s.codes[c.decode()] += 1
        for c in TORCH_NPU_RE.finditer(line):
            s.codes["ERR" + c.group(1).decode() + c.group(2).decode()] += 1
        if len(s.events) >= MAX_EVENTS_PER_FILE:
            return
        text = line
        ast, aend = st, end       # the line the cause model reads: the exception's summary for a traceback
        kind, role, label, code, blames, fix = classify_line(line)
        if line.startswith(b"Traceback"):
            summ = _exception_summary(buf, st)
            if summ:
                text = summ[0][:MAX_LINE]
                k2, r2, l2, c2, b2, f2 = classify_line(text)
                if k2 not in ("error", "exception"):
                    kind, role, label, code, blames, fix = k2, r2, l2, c2 or code, b2 or blames, f2 or fix
                elif [e for e in s.events[-4:] if e.kind == "comm_timeout"]:
                    # the exception is a consequence when the traceback comes right after comm errors
                    kind, role, label = "comm_timeout", "consequence", "exception after a collective failure"
                self.consumed_upto = summ[1] + len(summ[0])
                ast, aend = summ[1], min(len(buf), summ[1] + len(summ[0]))
        ts, exact = _ts_before(buf, st)
        if ts is None:
            ts, exact = self.carry_ts, False
        facts = line_facts(line)
        if "local_rank" in facts:
            facts.update(s.layout)   # what maps it to a global rank, when the log shows the layout
        if line.startswith(b"Root Cause (first observed failure)") and (root := root_cause(buf[end:])):
            facts.update({f"root_cause_{k}": v for k, v in root.items()})
        ev = Event(s.path, self._lineno(buf, st), ts, exact, kind, role, label,
                   clean(text).decode("utf-8", "replace"), code, blames, fix, facts)
        annotate(ev, buf, ast, aend, ev.line + buf.count(b"\n", st, ast))
        if ev.kind == "exception" and ev.cause is None and [e for e in s.events[-4:] if e.kind == "comm_timeout"]:
            # a traceback of no known class right after a timeout of the same process is that timeout's fallout
            ev.kind, ev.role, ev.label = "comm_timeout", "consequence", "exception after a collective failure"
        s.events.append(ev)

    def _last_step(self, buf: bytes) -> None:
        s = self.s
        samples: list[tuple[int, float]] = []
        found_last = False
        p = len(buf)
        while len(samples) < STEP_SAMPLES:
            low = buf.rfind(b"step", 0, p)
            # the capitalised form only between that hit and p: a whole-chunk search for a rare word
            # cost a full reverse pass per chunk
            p = max(low, buf.rfind(b"Step", max(low, 0), p))
            if p < 0:
                break
            st, end = _line_bounds(buf, p)
            m = STEP_RE.search(buf, st, min(end, st + MAX_LINE))
            if m:
                step = int(m.group(1))
                ts, exact = _ts_before(buf, st)
                if ts is None:
                    ts = self.carry_ts
                if not found_last:
                    found_last = True
                    s.last_step, s.last_step_ts = step, ts
                    # counted from the end: the last step is near it, so this reads a few lines only
                    s.last_step_line = self.line_base + self._chunk_lines - buf.count(b"\n", st) + 1
                if ts is not None and exact:
                    samples.append((step, ts))
                else:
                    break  # untimestamped progress lines cannot align clocks
            p = st - 1
            if p <= 0:
                break
        if samples:
            s.step_samples = (s.step_samples + samples[::-1])[-STEP_SAMPLES:]

    def _save_part(self, buf: bytes, pos: int) -> None:
        """The last part of a checkpoint save this rank announced (porting/rundir/ranklog.py ``save_part_line``)."""
        st, end = _line_bounds(buf, pos)
        m = ranklog.DIAG_SAVE_PART.search(buf, max(0, st - 1), min(end + 1, st + MAX_LINE))
        if m and m.group(2).decode() in ranklog.SAVE_PARTS:
            self.s.save_part = (int(m.group(1)), m.group(2).decode(), _ts_before(buf, st)[0])

    def _last_collective(self, buf: bytes, pos: int) -> None:
        st, end = _line_bounds(buf, pos)
        m = COLLECTIVE_RE.search(buf, st, min(end, st + MAX_LINE))
        if not m:
            return
        name = m.group(1).decode()
        tag = m.group(2).decode() if m.group(2) else None
        ts, _ = _ts_before(buf, st)
        self.s.last_collective = name + (f" [{tag}]" if tag else "")
        self.s.last_collective_ts = ts if ts is not None else self.carry_ts


def text_encoding(head: bytes) -> str | None:
    """The codec of a UTF-16/UTF-32 log (by BOM, or by NUL bytes in every other position, as
    Windows tools write them without one); None for ASCII-compatible text (UTF-8, Latin-1)."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    sample = head[:4096 - 4096 % 2]
    if len(sample) < 16:
        return None
    odd_nul, even_nul = sample[1::2].count(0), sample[0::2].count(0)
    half = len(sample) // 2
    if odd_nul >= 0.9 * half and even_nul <= 0.1 * half:
        return "utf-16-le"
    if even_nul >= 0.9 * half and odd_nul <= 0.1 * half:
        return "utf-16-be"
    return None


def _utf8_chunks(f, encoding: str | None) -> Iterator[bytes]:
    """The file in CHUNK-sized reads, transcoded to UTF-8 when it is UTF-16/32 (undecodable units
    become U+FFFD, so a damaged file still scans)."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace") if encoding else None
    while True:
        data = f.read(CHUNK)
        if decoder is not None:
            text = decoder.decode(data, final=not data)
            if text:
                yield text.encode("utf-8")
        elif data:
            yield data
        if not data:
            return


def _open_regular(path: str):
    """Open a regular file for reading without blocking on a FIFO; (file, None) or (None, why not)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = ("FIFO" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
                else "device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "special file")
        return None, f"not a regular file ({what}), skipped"
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), None


def _identify(scan: FileScan, rel: str, head: bytes) -> None:
    if scan.rank is None and scan.kind != "msrun_scheduler":
        scan.rank = rank_from_content(head)
    if scan.rank is None and scan.kind != "msrun_scheduler":
        # torch_npu / watchdog lines name their rank; a file where only one rank speaks is that rank's
        named = {int(m.group(1)) for rx in REPORTER_RES for m in rx.finditer(head)}
        if len(named) == 1:
            scan.rank = named.pop()
    if scan.kind == "port_rank" and (w := WORLD_RE.search(head)) is not None:
        scan.world = int(w.group(1))
    pm = re.match(r"^(?:plog|device)-([0-9]{1,9})_", os.path.basename(rel))
    pc = PID_RE.search(head) if b"[" in head else None   # the multi-line regex costs a pass
    scan.pid = int(pm.group(1)) if pm else (int(pc.group(1)) if pc else None)


def _scan_chunks(scan: FileScan, chunks: Iterator[bytes]) -> None:
    """Feed whole lines to the scanner; a line longer than two chunks is cut (it is still one line
    for the grammar, which looks at its first MAX_LINE bytes)."""
    sc = _Scanner(scan)
    pending = b""
    for data in chunks:
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
            cut = buf.rfind(b"\n") if buf.rfind(b"\n") >= 0 else len(buf) - 1
        sc.chunk(buf[:cut + 1])
        pending = buf[cut + 1:]
    if pending:
        scan.truncated = True
        sc.chunk(pending)
    scan.lines = sc.line_base + (1 if scan.truncated else 0)
    if sc.tail:
        read_tail(scan, sc.tail, sc.tail_line0)


def _split_parts(scan: FileScan, data: bytes) -> list[FileScan]:
    """A file holding several ranks' lines (``[rankN]:`` prefixes) becomes one scan per rank."""
    parts = []
    for rank, text in sorted(split_by_rank_prefix(data).items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        part = FileScan(path=f"{scan.path}[rank{rank}]" if rank is not None else scan.path, kind=scan.kind,
                        rank=rank if rank is not None else scan.rank, pid=scan.pid, note=scan.note,
                        layout=scan.layout, rank_from_name=rank is not None or scan.rank_from_name)
        _scan_chunks(part, iter([text]))
        parts.append(part)
    return parts


def scan_file(root: str, rel: str) -> FileScan:
    """Scan one log file. Never raises for bad content; problems are recorded on the result."""
    kind, rank = classify_file(rel)
    scan = FileScan(path=rel, kind=kind, rank=rank, rank_from_name=rank is not None)
    f, why = _open_regular(os.path.join(root, rel))
    if f is None:
        scan.problem = why
        return scan
    try:
        with f:
            raw = f.read(1 << 16)
            if not raw:
                scan.problem = "empty file"
                return scan
            encoding = text_encoding(raw)
            head = raw.decode(encoding, "replace").encode("utf-8") if encoding else raw
            if len(head.translate(None, _TEXT_BYTES)) > BINARY_FRACTION * len(head):
                scan.problem = "binary content (control bytes), skipped"
                return scan
            if encoding:
                scan.note = f"{encoding.upper()} text (not UTF-8), decoded"
            _identify(scan, rel, head)
            scan.layout = launch_layout(head)
            f.seek(0)
            if len(prefixed_ranks(head)) >= 2 and os.fstat(f.fileno()).st_size <= MAX_SPLIT_BYTES:
                scan.parts = _split_parts(scan, b"".join(_utf8_chunks(f, encoding)))
                scan.lines = sum(p.lines for p in scan.parts)
            else:
                _scan_chunks(scan, _utf8_chunks(f, encoding))
    except OSError as e:
        scan.problem = f"unreadable: {e.strerror or e}"
    if scan.rank is None and scan.kind != "msrun_scheduler":
        # a plog that names no rank still says which rank of the world communicator its process is
        scan.rank = next((r for g, r, _ in scan.comm_inits if g in WORLD_GROUPS), None)
    return scan
