"""The source files of a pack, read ahead in parallel into reused buffers, in store order.

A pool of reader threads reads runs of consecutive members of one chunk (one task a run: fewer
hand-overs between threads than a task a file). A run is read into one buffer laid out as the
chunk holds it: each member's tar header, its data read straight into the buffer
(``readinto``), its zero padding; each member is checksummed there on the thread that read it,
without a copy. The writer writes a run with one write, in store order, so the chunks are the
same bytes whatever the readers' timing. The buffers are reused from run to run: reading into
fresh memory for every file costs a page fault for every page, which was most of a read's time
for a tree in the page cache.

How many runs are read at once follows what the reads cost (`ReaderCount`): it starts at the
number of cores, which is what a tree in the page cache wants (a read is then a copy, and more
readers only compete with the writer for the cores), and adds a reader whenever the runs just
read spent most of their time off the CPU, waiting on storage (a shared file system's latency),
up to the number allowed.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tierfeed.errors import UnreadableFileError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.packplan import PackPlan
from tierfeed.format.source import SourceFile, check_read_size, opened_source
from tierfeed.format.tarchunk import BLOCK

__all__ = ["ReadRun", "ReaderCount", "read_ahead", "read_source_into"]

_READ_AHEAD_BYTES = 256 * 2**20
_RUN_FILES = 32
_RUN_BYTES = 2**20  # a run's bytes in its buffer, beyond its first member's
_WINDOW_RUNS = 4
_ZEROS = memoryview(bytes(BLOCK))

# fills ``view[:f.size]`` with the file's bytes (``view`` holds one byte more), or raises
# UnreadableFileError naming it
ReadInto = Callable[[SourceFile, memoryview], None]


@dataclass
class ReadRun:
    """One run read: its bytes as the chunk holds them, and per member (member, offset of its
    data in ``data``, checksum) or (member, its `UnreadableFileError`), which ``data`` leaves
    out. ``data`` is a view of a reused buffer: valid until the next run is asked for."""

    data: memoryview
    members: list[tuple[int, int, int] | tuple[int, UnreadableFileError]]
    wait: float  # the median seconds its reads waited off the CPU
    cpu: float  # their median CPU seconds


class ReaderCount:
    """How many runs to read at once: from ``start``, one more (up to ``most``) each time the
    reads of the last few runs (at least ``_WINDOW_RUNS``, at least ``active``) waited off the
    CPU longer than they ran on it. Medians all through: a read now and then preempted on a
    busy machine, or kept waiting for the interpreter's lock, does not count, while every read
    of a file system with latency does.

    Pure: fed each finished run's median wait and CPU seconds, no clock of its own.
    """

    def __init__(self, start: int, most: int) -> None:
        self.most = max(1, most)
        self.active = max(1, min(start, self.most))
        self._waits: list[float] = []
        self._cpus: list[float] = []

    def observe(self, wait: float, cpu: float) -> None:
        """Count one finished run: the median seconds its reads waited off the CPU, and the
        median seconds they ran on it."""
        self._waits.append(wait)
        self._cpus.append(cpu)
        if len(self._waits) < max(_WINDOW_RUNS, self.active):
            return
        if self.active < self.most and _median(self._waits) > _median(self._cpus):
            self.active += 1
        self._waits.clear()
        self._cpus.clear()


def read_source_into(f: SourceFile, view: memoryview) -> None:
    """Read the listed file ``f`` into ``view[:f.size]``, asking for at most its listed size
    + 1 (``view`` must hold that byte too: it tells a file that grew from one that did not);
    checked as `read_source_file` checks (`opened_source`, `check_read_size`)."""
    got, want = 0, f.size + 1
    with opened_source(f) as fd:
        while got < want:
            n = os.readv(fd, [view[got:want]])
            if not n:
                break
            got += n
    check_read_size(f, got)


class _Buffers:
    """Reused buffers of ``_RUN_BYTES`` (and room for a header, padding and the + 1 byte of
    `read_source_into`); a run larger than that gets one of its own, not kept."""

    SIZE = _RUN_BYTES + 4 * BLOCK

    def __init__(self) -> None:
        self._free: list[bytearray] = []

    def take(self, nbytes: int) -> bytearray:
        if nbytes + BLOCK > self.SIZE:
            return bytearray(nbytes + BLOCK)
        return self._free.pop() if self._free else bytearray(self.SIZE)

    def give(self, buf: bytearray) -> None:
        if len(buf) == self.SIZE:
            self._free.append(buf)


def read_ahead(
    pool: ThreadPoolExecutor,
    chunks: list[list[int]],
    plan: PackPlan,
    workers: int,
    read: ReadInto,
) -> Iterator[ReadRun]:
    """Yield the `ReadRun`s of ``chunks`` (each its members, in store order) in order: runs
    never span two chunks. Reads with ``read`` on ``pool`` (of at least ``workers`` threads):
    at most ``_READ_AHEAD_BYTES`` ahead, and as many runs in flight (being read, or read and
    waiting for the writer) as `ReaderCount` says, at most ``workers``. A run's buffer is
    reused once the next run is asked for.

    Drain the iterator before the pool shuts down (queued reads finish either way)."""
    queue: deque[tuple[int, bytearray, Future[ReadRun]]] = deque()
    readers = ReaderCount(os.cpu_count() or 1, workers)
    buffers = _Buffers()
    inflight = 0
    pending = (run for members in chunks for run in _read_runs(members, plan))

    def fill() -> None:
        nonlocal inflight
        while inflight < _READ_AHEAD_BYTES and len(queue) < readers.active:
            run = next(pending, None)
            if run is None:
                return
            buf = buffers.take(run[1])
            queue.append((run[1], buf, pool.submit(_read_run, run[0], buf, plan, read)))
            inflight += run[1]

    fill()
    while queue:
        nbytes, buf, fut = queue.popleft()
        inflight -= nbytes
        done = fut.result()
        readers.observe(done.wait, done.cpu)
        fill()  # the readers go on while this run is written
        yield done
        buffers.give(buf)


def _read_runs(members: list[int], plan: PackPlan) -> Iterator[tuple[list[int], int]]:
    """``members`` cut into runs of consecutive members, each read by one task of the pool: at
    most ``_RUN_FILES`` files and (beyond its first file) ``_RUN_BYTES`` bytes as the chunk
    holds them; with those bytes."""
    run: list[int] = []
    nbytes = 0
    for m in members:
        size = plan.files[m].size
        footprint = int(plan.header_len[m]) + size + (-size % BLOCK)
        if run and (len(run) >= _RUN_FILES or nbytes + footprint > _RUN_BYTES):
            yield run, nbytes
            run, nbytes = [], 0
        run.append(m)
        nbytes += footprint
    if run:
        yield run, nbytes


def _read_run(run: list[int], buf: bytearray, plan: PackPlan, read: ReadInto) -> ReadRun:
    """On a reader thread: ``run`` read into ``buf`` as the chunk holds it, each member
    checksummed in place (its bytes still in the CPU's cache), with the median time the reads
    waited off the CPU and their median CPU time."""
    view = memoryview(buf)
    out: list[tuple[int, int, int] | tuple[int, UnreadableFileError]] = []
    waits: list[float] = []
    cpus: list[float] = []
    pos = 0
    for m in run:
        head = plan.header(m)
        start, size = pos + len(head), plan.files[m].size
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            read(plan.files[m], view[start : start + size + 1])
        except UnreadableFileError as exc:
            out.append((m, exc))  # left out: the next member's bytes go where it was
            continue
        cpu = time.thread_time() - cpu
        waits.append(time.perf_counter() - wall - cpu)
        cpus.append(cpu)
        view[pos:start] = head
        end = start + size
        pad = -size % BLOCK
        view[end : end + pad] = _ZEROS[:pad]  # the buffer is reused: zero what tar pads
        out.append((m, start, checksum_bytes(view[start:end])))
        pos = end + pad
    return ReadRun(view[:pos], out, _median(waits), _median(cpus))


def _median(values: list[float]) -> float:
    """The median of ``values`` (0 when empty): a read preempted now and then does not move it."""
    return sorted(values)[len(values) // 2] if values else 0.0
