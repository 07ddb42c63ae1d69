"""The one harness every hostile-input case runs through, and the promises it checks.

A case is a small generator ``gen(d: Path) -> list[str]``: it writes its hostile input under the case
directory ``d`` and returns the `port` arguments. :func:`case` registers it with the substrings its one
error line must contain. :func:`run_case` then checks, for every case alike:

1. the exit code is non-zero (the case's own code when it names one);
2. stderr has exactly one ``error:`` line and no traceback (in-process: no exception escaped the CLI);
3. nothing outside the case's destination (``dest``) was written, changed or removed: every file under
   ``d`` (sources, canaries, the working directory) has the same sha256 before and after;
4. time and memory are bounded: a SIGALRM deadline in-process and growth of the process's peak RSS;
   RLIMIT_AS / RLIMIT_CPU on the subprocess cases.

Most cases run the real click command in this process (``CliRunner``); start-up of ``python -m porting``
costs ~0.2 s (no MindSpore) to ~5 s (MindSpore imported), so only cases that need a process of their
own (a signal, a resource limit, a FIFO) pay it. ``verdict`` cases are checks that *run* and report a
failed claim (``port verify``): exit 1 with the failing row in stdout instead of an ``error:`` line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
TINY_RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"
SAMPLE_TEXT = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"
MAX_RSS_GROWTH_MB = 1024      # in-process: the peak RSS may not grow by more than this in one case
SUBPROCESS_AS_MB = 8192       # subprocess: address space (MindSpore maps a lot of it at import)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str                                  # "<command folder>/<generator name>"
    gen: Callable[[Path], list[str]]
    expect: tuple[str, ...]                  # substrings of the error line (or of stdout, for verdicts)
    dest: str | None = "out"                 # relative to the case dir: the only place writes may land
    exit_code: int | None = None             # None: any non-zero
    subprocess: bool = False
    timeout: float = 20.0
    verdict: bool = False
    env: tuple[tuple[str, str], ...] = ()
    fsize: int | None = None                 # subprocess: RLIMIT_FSIZE (a disk that fills)
    check: Callable[[str, Path], None] | None = None   # more about the error line, given the case dir
    refusal: bool = True                     # False: valid but huge or odd input; any exit code, still
                                             # no traceback, bounded, nothing written outside dest


CASES: list[Case] = []


def case(*expect: str, dest: str | None = "out", exit_code: int | None = None, subprocess: bool = False,
         timeout: float = 20.0, verdict: bool = False, env: dict[str, str] | None = None,
         fsize: int | None = None, check: Callable[[str, Path], None] | None = None, refusal: bool = True):
    """Register ``gen`` as a case of the command folder it is defined in."""
    def deco(gen: Callable[[Path], list[str]]):
        folder = gen.__module__.split(".")[-2]
        CASES.append(Case(f"{folder}/{gen.__name__}", gen, expect, dest, exit_code, subprocess, timeout,
                          verdict, tuple((env or {}).items()), fsize, check, refusal))
        return gen
    return deco


# ----------------------------------------------------------------------------------------- promises
def snapshot(d: Path, dest: Path | None) -> dict[str, str]:
    """relative path -> sha256 (files), "dir", "link:<target>" or "other" for everything under ``d``
    except ``dest`` and what is inside it."""
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(d, followlinks=False):
        r = Path(root)
        if dest is not None:
            dirs[:] = [x for x in dirs if (r / x) != dest]
        for name in dirs + files:
            p = r / name
            if dest is not None and p == dest:
                continue
            rel = str(p.relative_to(d))
            if p.is_symlink():
                out[rel] = f"link:{os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = _digest(p)
            else:
                out[rel] = "other"
    return out


def _digest(p: Path) -> str:
    """sha256 of the file's size and of each data region with its offset, read 1 MiB at a time: the holes of
    a sparse file (the corpus's 2 GiB inputs) are skipped (SEEK_DATA/SEEK_HOLE), where reading them whole cost
    about 27 CPU-s per case. Any write changes it (a hole filled, even with zeros, becomes a data region); a
    filesystem without holes reports the whole file as data."""
    h = hashlib.sha256()
    with open(p, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        h.update(b"size %d" % size)
        off = 0
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:   # ENXIO: no data after ``off``
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            h.update(b"@%d" % start)
            f.seek(start)
            while start < end:
                chunk = f.read(min(end - start, 1 << 20))
                if not chunk:
                    break
                h.update(chunk)
                start += len(chunk)
            off = end
    return h.hexdigest()


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted([f"removed {k}" for k in before.keys() - after.keys()]
                  + [f"created {k}" for k in after.keys() - before.keys()]
                  + [f"changed {k}" for k in before.keys() & after.keys() if before[k] != after[k]])


def check_output(c: Case, code: int, stdout: str, stderr: str, escaped: BaseException | None) -> str:
    """The error line (or the verdict line), after checking promises 1 and 2."""
    assert escaped is None, f"{c.id}: an exception escaped the CLI (a traceback): {escaped!r}"
    assert "Traceback (most recent call last)" not in stderr + stdout, f"{c.id}: traceback:\n{stderr[-3000:]}"
    if not c.refusal:
        assert code in (0, 1) or sum(ln.startswith("error:") for ln in stderr.splitlines()) == 1, (
            f"{c.id}: exit {code} without one error line:\n{stderr[-3000:]}")
        return stdout
    assert code != 0, f"{c.id}: exit 0 on hostile input\nstdout: {stdout[-1500:]}\nstderr: {stderr[-1500:]}"
    if c.exit_code is not None:
        assert code == c.exit_code, f"{c.id}: exit {code}, expected {c.exit_code}\n{stderr[-1500:]}"
    if c.verdict:
        assert code == 1, f"{c.id}: a failed check exits 1, got {code}\n{stderr[-1500:]}"
        text = stdout
    else:
        errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1, f"{c.id}: expected one 'error:' line, got {len(errors)}:\n{stderr[-3000:]}"
        text = errors[0]
    for needle in c.expect:
        assert needle in text, f"{c.id}: {needle!r} not in {text[-1500:]!r}"
    return text


class _Deadline(Exception):
    pass


def _alarm(signum, frame):
    raise _Deadline()


def run_in_process(c: Case, d: Path, argv: list[str]) -> tuple[int, str, str, BaseException | None]:
    from click.testing import CliRunner

    from porting.cli import main

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, c.timeout)
    cwd = os.getcwd()
    t0 = time.monotonic()
    try:
        os.chdir(d)  # relative writes land under the case dir, where the snapshot sees them
        res = CliRunner().invoke(main, argv, env=dict(c.env), catch_exceptions=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
    if isinstance(res.exception, _Deadline):
        raise AssertionError(f"{c.id}: still running after {c.timeout:.0f} s (a hang or unbounded work)")
    escaped = None if res.exception is None or isinstance(res.exception, SystemExit) else res.exception
    assert time.monotonic() - t0 < c.timeout
    return res.exit_code, res.stdout, res.stderr, escaped


def _limits(fsize: int | None) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_AS_MB << 20,) * 2)
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG, as on a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return apply


def run_subprocess(c: Case, d: Path, argv: list[str]) -> tuple[int, str, str, BaseException | None]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3", **dict(c.env))
    env.pop("PORT_DEBUG", None)
    try:
        p = subprocess.run([sys.executable, "-m", "porting", *argv], cwd=d, capture_output=True, text=True,
                           timeout=c.timeout, env=env, preexec_fn=_limits(c.fsize))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{c.id}: still running after {c.timeout:.0f} s (a hang or unbounded work)") from None
    return p.returncode, p.stdout, p.stderr, None


def run_case(c: Case, d: Path) -> str:
    """Build the case under ``d``, run it, check every promise; returns the error (or verdict) line."""
    d.mkdir(parents=True, exist_ok=True)
    argv = c.gen(d)
    dest = (d / c.dest) if c.dest else None
    before = snapshot(d, dest)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, out, err, escaped = (run_subprocess if c.subprocess else run_in_process)(c, d, argv)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown < MAX_RSS_GROWTH_MB, f"{c.id}: peak memory grew by {grown:.0f} MB"
    line = check_output(c, code, out, err, escaped)
    if c.check is not None:
        c.check(line, d)
    diff = changes(before, snapshot(d, dest))
    assert not diff, f"{c.id}: wrote or removed outside {c.dest or 'nothing'}: {diff[:10]}"
    return line
