"""The source files of a pack, read ahead in parallel and handed over in store order.

A pool of reader threads reads runs of consecutive files (one task a run: fewer hand-overs
between threads than a task a file), each file checksummed on the thread that read it; the
writer takes them in the order they are written, so the chunks are the same bytes whatever the
readers' timing.

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
from typing import Any

from tierfeed.errors import UnreadableFileError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.source import SourceFile

__all__ = ["ReaderCount", "read_ahead"]

_READ_AHEAD_BYTES = 256 * 2**20
_RUN_FILES = 32
_RUN_BYTES = 2**20
_WINDOW_RUNS = 4

Read = Callable[[SourceFile], bytes]
# (members' reads, the median seconds a read waited off the CPU, the median CPU seconds)
RunResult = tuple[list[tuple[int, Any]], float, float]


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


def read_ahead(
    pool: ThreadPoolExecutor, todo: list[int], files: list[SourceFile], workers: int, read: Read
) -> Iterator[tuple[int, Any]]:
    """Yield (member, (bytes, checksum) or its `UnreadableFileError`) for each of ``todo``
    in order, reading with ``read`` on ``pool`` (of at least ``workers`` threads): at most
    ``_READ_AHEAD_BYTES`` ahead, and as many runs in flight (being read, or read and waiting
    for the writer) as `ReaderCount` says, at most ``workers``.

    Drain the iterator before the pool shuts down (queued reads finish either way)."""
    queue: deque[tuple[int, Future[RunResult]]] = deque()
    readers = ReaderCount(os.cpu_count() or 1, workers)
    inflight = 0
    pending = _read_runs(todo, files)
    while True:
        while inflight < _READ_AHEAD_BYTES and len(queue) < readers.active:
            run = next(pending, None)
            if run is None:
                break
            queue.append((run[1], pool.submit(_read_run, run[0], files, read)))
            inflight += run[1]
        if not queue:
            return
        nbytes, fut = queue.popleft()
        inflight -= nbytes
        out, wait, cpu = fut.result()
        readers.observe(wait, cpu)
        yield from out


def _read_runs(todo: list[int], files: list[SourceFile]) -> Iterator[tuple[list[int], int]]:
    """``todo`` cut into runs of consecutive members, each read by one task of the pool: at
    most ``_RUN_FILES`` files and (beyond its first file) ``_RUN_BYTES`` bytes; with the bytes."""
    run: list[int] = []
    nbytes = 0
    for m in todo:
        size = files[m].size
        if run and (len(run) >= _RUN_FILES or nbytes + size > _RUN_BYTES):
            yield run, nbytes
            run, nbytes = [], 0
        run.append(m)
        nbytes += size
    if run:
        yield run, nbytes


def _read_run(run: list[int], files: list[SourceFile], read: Read) -> RunResult:
    """On a reader thread: (member, (bytes, checksum)) for each member of ``run``, or
    (member, its `UnreadableFileError`), with the median time its reads waited off the CPU
    and their median CPU time. The checksum is taken here, where the bytes are still in the
    CPU's cache and beside the other readers."""
    out: list[tuple[int, Any]] = []
    waits: list[float] = []
    cpus: list[float] = []
    for m in run:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            data = read(files[m])
        except UnreadableFileError as exc:
            out.append((m, exc))
            continue
        cpu = time.thread_time() - cpu
        waits.append(time.perf_counter() - wall - cpu)
        cpus.append(cpu)
        out.append((m, (data, checksum_bytes(data))))
    return out, _median(waits), _median(cpus)


def _median(values: list[float]) -> float:
    """The median of ``values`` (0 when empty): a read preempted now and then does not move it."""
    return sorted(values)[len(values) // 2] if values else 0.0
