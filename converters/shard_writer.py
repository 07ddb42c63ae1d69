"""Writes the output files of a safetensors -> safetensors conversion, on every core: each file's
bytes copied (or cast) and the digests the manifest records computed in the same pass.

The data section of an output file is the source's bytes (or their cast), in the source's data order.
Work is cut into blocks of at most BLOCK_BYTES of one source file; each block has up to three jobs:

  FH  the source file's sha256 over the block's bytes (a chain per file: block k after block k-1);
  WR  the block's tensor bytes written at their output offsets: ``os.copy_file_range`` for a run of
      uncast tensors (one call per contiguous run, inside the kernel, as ``cp`` does), a cast + pwrite
      for tensors whose dtype changes, pwrite from the source map where copy_file_range cannot be used
      (another filesystem, EXDEV/EINVAL/ENOSYS);
  TH  each output tensor's sha256 after WR, a chain per tensor across blocks: an uncast tensor is
      hashed from the source map (the very bytes the kernel copied; reading them back from the output
      instead was measured at 5% more CPU, 1.57 s against 1.49 s on the 1.1B shape, where the target
      is 1.5 s), a cast tensor from the output file (the cast bytes written).

Worker threads (hashlib and copy_file_range release the GIL) always take the lowest available job in
(block, FH < WR < TH) order. That keeps the jobs inside a window of a few blocks (bounded page cache
and memory: every job maps at most HASH_STEP bytes at a time and drops them), lets the sequential file
digest run on one core while the other copies and hashes tensors, and lets the digests of different
files and tensors run side by side. Peak RSS stays at a few times HASH_STEP whatever the model size.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import mmap
import os
import threading
from pathlib import Path
from typing import Callable

from converters import dtypes
from model_zoo.errors import CheckpointError

BLOCK_BYTES = 64 << 20  # one block's source bytes (and one copy_file_range call at most)
HASH_STEP = 8 << 20  # bytes mapped, hashed and dropped at a time
COPY_ALIGN = 64 << 10  # output offset at which copy_file_range calls start (see _aligned_calls)
WINDOW = 8  # blocks a worker may run ahead of the oldest unfinished one (bounds dirty, unhashed output)
_PAGE = mmap.ALLOCATIONGRANULARITY
# errnos with which copy_file_range says "not between these two files": write from user space instead.
NO_COPY_RANGE = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF,
                           errno.ETXTBSY})


@dataclasses.dataclass(frozen=True)
class TensorSpan:
    """One output tensor: where its bytes come from and go to (absolute file offsets)."""

    name: str  # output name (key of its digest)
    src_begin: int
    src_end: int
    dst_begin: int
    src_dtype: str
    dst_dtype: str

    @property
    def cast(self) -> bool:
        return self.src_dtype != self.dst_dtype


@dataclasses.dataclass(frozen=True)
class FileJob:
    """One source file -> one output file whose header (``header`` bytes) is written first."""

    src: Path
    dst: Path  # where to write (inside the staging directory)
    shown: Path  # the path error messages name (the final output path)
    header: bytes
    size: int  # source file bytes
    tensors: tuple[TensorSpan, ...]  # in source data order
    hash_source: bool = False  # also compute the source file's sha256 (one more SHA-256 pass)


@dataclasses.dataclass(frozen=True)
class _Piece:
    tensor: int  # index into FileJob.tensors
    src: int
    dst: int
    src_len: int
    dst_len: int
    cast: tuple[str, str] | None


@dataclasses.dataclass(frozen=True)
class _Block:
    file: int
    begin: int  # source bytes [begin, end) for the file digest and the progress bar
    end: int
    pieces: tuple[_Piece, ...]
    continues: bool  # the first piece continues the previous block's last tensor


def _pieces(t: TensorSpan, index: int, step: int) -> list[_Piece]:
    """The tensor cut into pieces of at most ``step`` source bytes (whole elements on both sides)."""
    si, di = dtypes.BY_CODE[t.src_dtype].itemsize, dtypes.BY_CODE[t.dst_dtype].itemsize
    step -= step % si
    out = []
    for off in range(0, t.src_end - t.src_begin, step):
        n = min(step, t.src_end - t.src_begin - off)
        out.append(_Piece(index, t.src_begin + off, t.dst_begin + off // si * di, n, n // si * di,
                          (t.src_dtype, t.dst_dtype) if t.cast else None))
    return out


def _items(f: FileJob, block: int):
    """(begin, end, piece or None) covering the whole source file in order; None = header or gap."""
    pos = 0
    for ti, t in enumerate(f.tensors):
        if t.src_begin > pos:
            yield from ((s, min(t.src_begin, s + block), None) for s in range(pos, t.src_begin, block))
        yield from ((p.src, p.src + p.src_len, p) for p in _pieces(t, ti, block))
        pos = max(pos, t.src_end)
    yield from ((s, min(f.size, s + block), None) for s in range(pos, f.size, block))


def plan_blocks(files: list[FileJob], block: int | None = None) -> list[_Block]:
    """Every source byte of every file in exactly one block of at most ``block`` (BLOCK_BYTES) bytes, in
    file then offset order."""
    block = block or BLOCK_BYTES
    blocks: list[_Block] = []
    for fi, f in enumerate(files):
        cuts: list[tuple[int, list[_Piece]]] = [(0, [])]  # (where a block begins, its pieces)
        for b, e, p in _items(f, block):
            if e - cuts[-1][0] > block:
                cuts.append((b, []))
            if p is not None:
                cuts[-1][1].append(p)
        prev_last = None
        for (begin, pieces), (end, _) in zip(cuts, cuts[1:] + [(f.size, [])]):
            blocks.append(_Block(fi, begin, end, tuple(pieces), bool(pieces) and pieces[0].tensor == prev_last))
            prev_last = pieces[-1].tensor if pieces else None
    return blocks


class _Files:
    """Open descriptors and the source maps of one run; every write reports the output file it failed on."""

    def __init__(self, files: list[FileJob]):
        self.files = files
        self.src_fd: list[int] = []
        self.dst_fd: list[int] = []
        self.maps: list[mmap.mmap | None] = []
        self.use_copy_range = True
        self.copied = 0  # bytes written by copy_file_range
        self.written = 0  # bytes written from user space (fallback, casts)
        try:
            for f in files:
                self.src_fd.append(os.open(f.src, os.O_RDONLY))
                size = os.fstat(self.src_fd[-1]).st_size
                if size != f.size:
                    raise CheckpointError(f"{f.src}: now {size} bytes, {f.size} when its header was read; the "
                                          "source changed during the conversion, run it again")
                self.maps.append(mmap.mmap(self.src_fd[-1], 0, access=mmap.ACCESS_READ) if size else None)
                self.dst_fd.append(os.open(f.dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
                _pwrite_all(self.dst_fd[-1], memoryview(f.header), 0, f)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for m in self.maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:  # a view is still referenced by an in-flight traceback
                    pass
        for fd in self.src_fd + self.dst_fd:
            os.close(fd)
        self.src_fd, self.dst_fd, self.maps = [], [], []


def _shown(e: OSError, f: FileJob) -> OSError:
    return OSError(e.errno, e.strerror, str(f.shown))


def _pwrite_all(fd: int, data: memoryview, offset: int, f: FileJob) -> None:
    done = 0
    try:
        while done < data.nbytes:
            with data[done:] as rest:
                n = os.pwrite(fd, rest, offset + done)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            done += n
    except OSError as e:
        raise _shown(e, f) from None


def _aligned_calls(src: int, dst: int, count: int):
    """copy_file_range calls for one run: a short first call up to a COPY_ALIGN boundary of the output,
    then the rest. Measured here: a kernel copy whose output offset is not 64 KiB-aligned (or whose source
    and output sit at different offsets within a page) costs half as much again, page by page."""
    head = min(count, -dst % COPY_ALIGN)
    if head:
        yield src, dst, head
    if count > head:
        yield src + head, dst + head, count - head


def _hash_range(mm: mmap.mmap, base: int, begin: int, end: int, h) -> None:
    """Hash [begin, end) of ``mm`` (whose byte 0 is file offset ``base``) in HASH_STEP views, dropping
    each from the resident set once hashed (the page cache keeps it)."""
    pos = begin
    while pos < end:
        stop = min(end, pos + HASH_STEP)
        with memoryview(mm)[pos - base:stop - base] as v:
            h.update(v)
        _drop(mm, base, pos, stop)
        pos = stop


def _drop(mm: mmap.mmap, base: int, begin: int, end: int) -> None:
    """Unmap the whole pages of file bytes [begin, end) from this process (the page cache keeps them)."""
    lo, hi = begin - base, end - base
    lo -= lo % mmap.PAGESIZE
    hi -= hi % mmap.PAGESIZE
    if hi > lo:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class _Run:
    def __init__(self, files: list[FileJob], blocks: list[_Block], progress: Callable[[int], None]):
        self.files, self.blocks, self.progress = files, blocks, progress
        self.io = _Files(files)
        self.file_hash = [hashlib.sha256() if f.hash_source else None for f in files]
        self.tensor_hash = [[hashlib.sha256() for _ in f.tensors] for f in files]
        # jobs in priority order: (block, kind); kind 0 = FH, 1 = WR, 2 = TH
        self.jobs = [(k, kind) for k, b in enumerate(blocks) for kind in (0, 1, 2)
                     if kind != 0 or files[b.file].hash_source]
        self.state = {j: 0 for j in self.jobs}  # 0 waiting, 1 running, 2 done
        self.left = {k: sum(1 for j in self.jobs if j[0] == k) for k in range(len(blocks))}
        self.first = 0  # index of the first job not yet started
        self.oldest = 0  # the oldest block with unfinished jobs
        self.writing: set[int] = set()  # files with a WR job running
        self.cond = threading.Condition()
        self.error: BaseException | None = None

    # ------------------------------------------------------------------------------ scheduling
    def _ready(self, job: tuple[int, int]) -> bool:
        k, kind = job
        b = self.blocks[k]
        same_file_before = k > 0 and self.blocks[k - 1].file == b.file
        if kind == 0:
            return not same_file_before or self.state[(k - 1, 0)] == 2
        if kind == 1:  # one writer per output file: two copies into one file contend for its inode lock
            return b.file not in self.writing
        if self.state[(k, 1)] != 2:
            return False
        return not (b.continues and same_file_before) or self.state[(k - 1, 2)] == 2

    def _take(self) -> tuple[int, int] | None:
        """The lowest job that may start now; None when everything is started or an error stopped the run.
        Called with the lock held; waits while jobs are running but none can start."""
        while True:
            if self.error is not None:
                return None
            while self.first < len(self.jobs) and self.state[self.jobs[self.first]] != 0:
                self.first += 1
            if self.first == len(self.jobs):
                return None
            for i in range(self.first, len(self.jobs)):
                job = self.jobs[i]
                if job[0] > self.oldest + WINDOW:
                    break
                if self.state[job] == 0 and self._ready(job):
                    self.state[job] = 1
                    if job[1] == 1:
                        self.writing.add(self.blocks[job[0]].file)
                    return job
            self.cond.wait()

    def _finish(self, job: tuple[int, int]) -> None:
        self.state[job] = 2
        if job[1] == 1:
            self.writing.discard(self.blocks[job[0]].file)
        k = job[0]
        self.left[k] -= 1
        if self.left[k] == 0:
            self.progress(self.blocks[k].end - self.blocks[k].begin)
            while self.oldest < len(self.blocks) and self.left[self.oldest] == 0:
                self.oldest += 1
        self.cond.notify_all()

    def worker(self) -> None:
        while True:
            with self.cond:
                job = self._take()
            if job is None:
                return
            try:
                (self._fh, self._wr, self._th)[job[1]](self.blocks[job[0]])
            except BaseException as e:
                with self.cond:
                    if self.error is None:
                        self.error = e
                    self.cond.notify_all()
                return
            with self.cond:
                self._finish(job)

    # ------------------------------------------------------------------------------ the jobs
    def _fh(self, b: _Block) -> None:
        mm = self.io.maps[b.file]
        if mm is not None and b.end > b.begin:
            _hash_range(mm, 0, b.begin, b.end, self.file_hash[b.file])

    def _wr(self, b: _Block) -> None:
        f = self.files[b.file]
        src_fd, dst_fd, mm = self.io.src_fd[b.file], self.io.dst_fd[b.file], self.io.maps[b.file]
        run: list[_Piece] = []
        for p in b.pieces:
            if p.cast is None and run and run[-1].src + run[-1].src_len == p.src and \
                    run[-1].dst + run[-1].dst_len == p.dst:
                run.append(p)
                continue
            self._flush(run, f, src_fd, dst_fd, mm)
            run = []
            if p.cast is None:
                run = [p]
            else:
                self._cast(p, f, dst_fd, mm)
        self._flush(run, f, src_fd, dst_fd, mm)

    def _cast(self, p: _Piece, f: FileJob, dst_fd: int, mm) -> None:
        """A piece whose dtype changes, HASH_STEP source bytes at a time (bounded memory per worker)."""
        src_size, dst_size = dtypes.BY_CODE[p.cast[0]].itemsize, dtypes.BY_CODE[p.cast[1]].itemsize
        step = HASH_STEP - HASH_STEP % src_size
        for off in range(0, p.src_len, step):
            n = min(step, p.src_len - off)
            with memoryview(mm)[p.src + off:p.src + off + n] as v:
                out = dtypes.cast_bytes(p.cast[0], p.cast[1], v)
                _pwrite_all(dst_fd, memoryview(out).cast("B"), p.dst + off // src_size * dst_size, f)
                del out
            _drop(mm, 0, p.src + off, p.src + off + n)
        self.io.written += p.dst_len

    def _flush(self, run: list[_Piece], f: FileJob, src_fd: int, dst_fd: int, mm) -> None:
        """One contiguous run of uncast bytes: kernel-side copy, or pwrite from the source map."""
        if not run:
            return
        src, dst, count = run[0].src, run[0].dst, sum(p.src_len for p in run)
        done = 0
        if self.io.use_copy_range:
            try:
                for s, d, n in _aligned_calls(src, dst, count):
                    while n:
                        k = os.copy_file_range(src_fd, dst_fd, n, s, d)
                        if k == 0:
                            raise CheckpointError(f"{f.src}: ended at byte {s} while {src + count} were expected; "
                                                  "the source changed during the conversion, run it again")
                        s, d, n, done = s + k, d + k, n - k, done + k
            except OSError as e:
                if e.errno not in NO_COPY_RANGE:
                    raise _shown(e, f) from None
                self.io.use_copy_range = False  # e.g. EXDEV: the output is on another filesystem
            self.io.copied += done
        if done < count:
            with memoryview(mm)[src + done:src + count] as v:
                _pwrite_all(dst_fd, v, dst + done, f)
            _drop(mm, 0, src + done, src + count)
            self.io.written += count - done

    def _th(self, b: _Block) -> None:
        """Tensor digests of a block, after its WR."""
        mm = self.io.maps[b.file]
        hashes = self.tensor_hash[b.file]
        for p in b.pieces:
            if p.dst_len and p.cast is None:
                _hash_range(mm, 0, p.src, p.src + p.src_len, hashes[p.tensor])
        casts = [p for p in b.pieces if p.dst_len and p.cast is not None]
        if casts:
            self._th_dst(b, casts)

    def _th_dst(self, b: _Block, pieces: list[_Piece]) -> None:
        """Digests of cast pieces, read back from the output (page cache) right after they were written."""
        fd = self.io.dst_fd[b.file]
        lo = pieces[0].dst - pieces[0].dst % _PAGE
        hi = max(p.dst + p.dst_len for p in pieces)
        try:
            mm = mmap.mmap(fd, hi - lo, access=mmap.ACCESS_READ, offset=lo)
        except OSError as e:
            raise _shown(e, self.files[b.file]) from None
        try:
            hashes = self.tensor_hash[b.file]
            for p in pieces:
                _hash_range(mm, lo, p.dst, p.dst + p.dst_len, hashes[p.tensor])
        finally:
            mm.close()


def copy_and_hash(files: list[FileJob], progress: Callable[[int], None] = lambda n: None,
                  workers: int | None = None) -> tuple[list[str | None], list[list[str]], dict[str, int]]:
    """Write every output file; return the source files' sha256 (None where not ``hash_source``), each
    output tensor's sha256 (per file, in FileJob.tensors order) and how many bytes went which way."""
    blocks = plan_blocks(files)
    run = _Run(files, blocks, progress)
    n = workers or max(2, min(8, os.cpu_count() or 2))
    try:
        threads = [threading.Thread(target=run.worker, name=f"port-shard-writer-{i}", daemon=True) for i in range(n)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException as e:  # e.g. KeyboardInterrupt: stop the workers before closing their files
            with run.cond:
                run.error = run.error or e
                run.cond.notify_all()
            for t in threads:
                if t.is_alive():
                    t.join()
        if run.error is not None:
            raise run.error
        for fi, f in enumerate(files):
            size = os.fstat(run.io.dst_fd[fi]).st_size
            want = len(f.header) + sum(dtypes.BY_CODE[t.dst_dtype].itemsize * (t.src_end - t.src_begin)
                                       // dtypes.BY_CODE[t.src_dtype].itemsize for t in f.tensors)
            if size != want:
                raise CheckpointError(f"{f.src}: wrote {size} bytes to {f.shown.name}, expected {want}; the "
                                      "source changed while it was read")
    finally:
        run.io.close()
    file_digests = [h.hexdigest() if h is not None else None for h in run.file_hash]
    tensor_digests = [[h.hexdigest() for h in hs] for hs in run.tensor_hash]
    return file_digests, tensor_digests, {"copy_file_range": run.io.copied, "write": run.io.written}
