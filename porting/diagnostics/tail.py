"""The end of each log, read once more: the numbers a run printed, and the error lines the literal prefilter cannot
see.

The chunk scan (scan.py) finds error lines by literals that start with an upper-case letter or a rare byte, which
keeps it at the engine's per-byte floor; that misses two things a failed run says in lower case:

* **numbers**: a loss or gradient norm printed as ``nan``/``inf`` (Python, torch and MindSpore print non-finite
  floats in lower case: ``'grad_norm': nan``, ``step_loss=nan``, ``lm loss: nan``), and a loss that jumps far above
  the steps before it (a divergence spike). Each becomes an event of the cause model's ``numerical`` class, with
  the step and rank where it began;
* **lower-case error texts**: ``npu-smi: error while loading shared libraries: ...``, a loss scaler's ``reducing to
  1``. A line the cause model classifies becomes an event; one it does not, and that is not an INFO, DEBUG or
  WARNING line, is kept as an *unclassified* failure line, so that "no failure found" is never said over it.

Only the last :data:`TAIL_BYTES` of a file are read (the whole of a pasted excerpt; where a run ends, in a long
log), and only where it can change the verdict: a tail that holds ``nan``/``inf``, or a file with no error line of its
own; any other file costs two literal searches of its tail (the 1,024-rank scale benchmark: 5.5-5.6 CPU-s before and
after, BENCHMARKS.md).
"""

from __future__ import annotations

import re
import statistics

from porting.diagnostics.causes import annotate, block_class, model
from porting.diagnostics.field import line_facts
from porting.diagnostics.grammar import (ERROR_SCAN_RE, LEVEL_RE, MAX_LINE, TS_RE, Event, classify_line, clean,
                                         literal_alternation, parse_ts)

TAIL_BYTES = 64 << 10
MAX_TAIL_EVENTS = 8      # events a tail adds (the first of each kind matters)
MAX_UNCLASSIFIED = 4     # unclassified failure lines kept per file
MAX_METRICS = 4096       # metric values read per tail
MAX_LOOKED = 512         # lines with a lower-case failure word classified per tail
SPIKE_FACTOR = 10.0      # a loss this many times the median of the steps before it is a divergence spike
SPIKE_WINDOW = 8         # ... of at most this many steps before it
NONFINITE = (b"nan", b"inf")

# A metric and its value: "loss 1.60170" (port), "'loss': nan" (HF Trainer), "step_loss=nan" (accelerate), "lm loss:
# nan | grad norm: nan" (Megatron), "loss: 8712.5938" (MindSpore suites), "grad_norm=0.81", "global_norm: [nan]".
# Every part is bounded and the name is a literal, so the search is linear on any line (issue 51).
METRIC_RE = re.compile(
    rb"(?<![\w])(?P<name>(?:lm |total |step_|noise_step_|train_|train/)?loss|grad[_ ]norm|global_norm|gnorm)"
    rb"['\"]?\s{0,3}[:=]?\s{0,3}\[?\s{0,3}['\"]?"
    rb"(?P<val>[-+]?(?:nan|inf(?:inity)?)|[-+]?\d{1,12}(?:\.\d{1,12})?(?:[eE][-+]?\d{1,3})?)(?![\w.])", re.I)
# the step a line is at: "step 12/100", "Step 300/3995", "iteration 120/", "| 17/6000 [" (tqdm), "step=12"
STEP_OF_RE = re.compile(rb"\b(?:step|iteration|iter)\b\s{0,3}[:=]?\s{0,3}\[?\s{0,3}(\d{1,9})\b|\|\s{0,3}(\d{1,9})/\d{1,9} \[",
                        re.I)
# lower-case failure words and the scaler's texts, searched only on tails that need it (see the module docstring)
LOWER_RE = literal_alternation((b"error", b"fail", b"abort", b"fatal", b"cannot", b"can't", b"killed", b"segmentation",
                                b"core dumped", b"denied", b"no such file", b"not found", b"exception", b"reducing to",
                                b"loss scale", b"overflow", b"Abort", b"Fatal", b"Cannot", b"Killed"))
# lines that report, not fail: a level marker of INFO / DEBUG / TRACE / WARNING, or glog's I/W prefixes ("W0726 ...")
QUIET_RE = re.compile(rb"^\W{0,3}(?:\d{4}-\d\d-\d\d[T ][\d:.,]{8,12}\s{1,3}(?:rank=\d{1,6}\s)?)?\[?"
                      rb"(?:INFO|DEBUG|TRACE|WARNING|WARN|NOTICE)\b|^[IW]\d{4} ")


def _numerical(fault: str):
    faults = model()[0]
    return next(c for c in faults if c.name == "numerical" and c.fault == fault)


def _step_of(line: bytes) -> int | None:
    m = STEP_OF_RE.search(line)
    return int(m.group(1) or m.group(2)) if m else None


def _ts(buf: bytes, st: int, end: int) -> tuple[float | None, bool]:
    """The line's own timestamp, else the nearest one before it (as scan.py reads a line's time)."""
    m = TS_RE.search(buf, st, min(end, st + 200))
    if m:
        return parse_ts(m), True
    last = None
    for last in TS_RE.finditer(buf, max(0, st - 16384), st):
        pass
    return (parse_ts(last), False) if last else (None, False)


class Tail:
    """One file's tail, read once: what it adds to the file's scan (``scan`` is a scan.FileScan)."""

    def __init__(self, scan, buf: bytes, line0: int) -> None:
        self.scan, self.buf, self.line0 = scan, buf, line0
        self.taken = {e.line for e in scan.events}
        self.texts = {e.text for e in scan.events}   # a traceback's summary is its Traceback line's event
        self.added = 0

    def read(self) -> None:
        buf = self.buf
        # a file whose own errors already explain it and whose tail holds no non-finite value costs two literal
        # searches: a divergence spike or a lower-case error line matter where nothing else is said
        if self.scan.events and not any(x in buf for x in NONFINITE):
            return
        self._metrics()
        self._lower_case_lines()

    def _event(self, st: int, end: int, lineno: int, kind: str = "", fault: str = "", sure: bool = True,
               facts: dict | None = None) -> Event | None:
        """An event for the line ``buf[st:end]`` (the scan's own way: class, block, entities), or None when its line
        is already one or the tail's share is spent."""
        if lineno in self.taken or self.added >= MAX_TAIL_EVENTS or len(self.scan.events) >= 64:
            return None
        line = self.buf[st:min(end, st + MAX_LINE)]
        text = clean(line).decode("utf-8", "replace")
        if text in self.texts:
            return None
        k, role, label, code, blames, fix = classify_line(line)
        ts, exact = _ts(self.buf, st, end)
        ev = Event(self.scan.path, lineno, ts, exact, k, role, label, text, code, blames, fix,
                   {**line_facts(line), **(facts or {})})
        annotate(ev, self.buf, st, end, lineno)
        if fault and ev.cause != "numerical":   # a metric line: the numbers say what it is, not its words
            cls = _numerical(fault)
            ev.cause, ev.tier, ev.fault, ev.sure = cls.name, cls.tier, cls.fault, sure
            ev.kind, ev.role, ev.label, ev.fix = cls.kind, cls.role, cls.label, cls.fix
        self.taken.add(lineno)
        self.added += 1
        self.scan.events.append(ev)
        return ev

    def _metrics(self) -> None:
        """The first non-finite loss and gradient norm, and the first divergence spike of the losses before them."""
        first: dict[str, tuple] = {}
        counts = {"loss": 0, "grad": 0}
        losses: list[tuple[float, int]] = []   # (value, offset)
        for n, m in enumerate(METRIC_RE.finditer(self.buf)):
            if n >= MAX_METRICS:
                break
            which = "grad" if b"norm" in m.group("name").lower() else "loss"
            raw = m.group("val").lower()
            if raw.lstrip(b"+-").startswith((b"nan", b"inf")):
                counts[which] += 1
                first.setdefault(which, (m.start(), m.group("name").decode(), raw.decode()))
            elif which == "loss" and "loss" not in first:
                losses.append((float(raw), m.start()))
        for which, fault in (("loss", "nonfinite_loss"), ("grad", "nonfinite_grad")):
            if which in first:
                pos, name, raw = first[which]
                st, end = self._line_at(pos)
                # one non-finite gradient norm alone is weak: a dynamic loss scale skips such a step and goes on
                sure = which == "loss" or counts[which] >= 2 or "loss" in first
                self._event(st, end, self._lineno(st), fault=fault, sure=sure,
                            facts={"metric": name, "value": raw, "step": _step_of(self.buf[st:end]),
                                   "nonfinite_lines": counts[which]})
        self._spike(losses)

    def _line_at(self, pos: int) -> tuple[int, int]:
        st = self.buf.rfind(b"\n", 0, pos) + 1
        end = self.buf.find(b"\n", pos)
        return st, len(self.buf) if end < 0 else end

    def _lineno(self, st: int) -> int:
        return self.line0 + self.buf.count(b"\n", 0, st)

    def _spike(self, losses: list[tuple[float, int]]) -> None:
        for i in range(2, len(losses)):
            v, pos = losses[i]
            if v < SPIKE_FACTOR * min(x for x, _ in losses[max(0, i - SPIKE_WINDOW):i]):
                continue   # below 10x the smallest before it, so below 10x their median: no median to take
            med = statistics.median(x for x, _ in losses[max(0, i - SPIKE_WINDOW):i])
            if med > 0 and v >= SPIKE_FACTOR * med:
                st, end = self._line_at(pos)
                self._event(st, end, self._lineno(st), fault="divergence", sure=False,
                            facts={"metric": "loss", "value": f"{v:g}", "median_before": round(med, 6),
                                   "step": _step_of(self.buf[st:end])})
                return

    def _lower_case_lines(self) -> None:
        """Lines with a lower-case failure word: an event when the cause model names their class, else an
        unclassified failure line (not for INFO/DEBUG/WARNING lines, which report rather than fail)."""
        last, lineno, counted, looked = -1, self.line0, 0, 0
        for m in LOWER_RE.finditer(self.buf):
            st = self.buf.rfind(b"\n", 0, m.start()) + 1
            if st == last:
                continue   # this line was looked at
            lineno += self.buf.count(b"\n", counted, st)
            counted = last = st
            looked += 1
            if looked > MAX_LOOKED or self.added >= MAX_TAIL_EVENTS:
                return
            end = self.buf.find(b"\n", m.start())
            end = len(self.buf) if end < 0 else end
            line = self.buf[st:min(end, st + MAX_LINE)]
            if lineno in self.taken or ERROR_SCAN_RE.search(line):
                continue   # the chunk scan judged every line that holds one of its literals
            if block_class(line) is not None:
                self._event(st, end, lineno)
            elif (not QUIET_RE.match(line) and not LEVEL_RE.match(line)
                  and len(self.scan.unclassified) < MAX_UNCLASSIFIED and _failure_like(line)):
                self.scan.unclassified.append((lineno, clean(line).decode("utf-8", "replace")[:240]))


FAILURE_WORDS_RE = re.compile(rb"\b(?:error|errno|fail(?:ed|ure|s)?|abort(?:ed)?|fatal|cannot|can't|killed|"
                              rb"segmentation fault|core dumped|denied|exception)\b", re.I)


def _failure_like(line: bytes) -> bool:
    """A line that says something failed, as a word of its own ("0 errors", "error_file: <N/A>" do not)."""
    m = FAILURE_WORDS_RE.search(line[:MAX_LINE])
    if m is None:
        return False
    after = line[m.end():m.end() + 2]
    return not after.startswith((b"_", b"s:")) and not re.search(rb"\b0 errors?\b|\bno errors?\b", line, re.I)


def read_tail(scan, buf: bytes, line0: int) -> None:
    """Add the tail's events and unclassified failure lines to ``scan`` (``buf`` starts at a line start; ``line0`` is
    the number of its first line)."""
    Tail(scan, buf, line0).read()
