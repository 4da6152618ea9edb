"""The source files of a pack, read ahead in parallel and handed over in store order.

A pool of reader threads reads runs of consecutive files (one task a run: fewer hand-overs
between threads than a task a file, and still as many files read at once as there are
readers), each file checksummed on the thread that read it; the writer takes them in the
order they are written, so the chunks are the same bytes whatever the readers' timing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tierfeed.errors import UnreadableFileError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.source import SourceFile

__all__ = ["read_ahead"]

_READ_AHEAD_BYTES = 256 * 2**20
_RUN_FILES = 32
_RUN_BYTES = 2**20

Read = Callable[[SourceFile], bytes]


def read_ahead(
    pool: ThreadPoolExecutor, todo: list[int], files: list[SourceFile], workers: int, read: Read
) -> Iterator[tuple[int, Any]]:
    """Yield (member, (bytes, checksum) or its `UnreadableFileError`) for each of ``todo``
    in order, reading ahead with ``read`` on ``pool``: at most ``_READ_AHEAD_BYTES`` and
    ``2 * workers`` runs ahead.

    Drain the iterator before the pool shuts down (queued reads finish either way)."""
    queue: deque[tuple[int, Future[list[tuple[int, Any]]]]] = deque()
    inflight = 0
    pending = _read_runs(todo, files)
    while True:
        for run, nbytes in pending:
            queue.append((nbytes, pool.submit(_read_run, run, files, read)))
            inflight += nbytes
            if inflight >= _READ_AHEAD_BYTES or len(queue) >= 2 * workers:
                break
        if not queue:
            return
        nbytes, fut = queue.popleft()
        inflight -= nbytes
        yield from fut.result()


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


def _read_run(run: list[int], files: list[SourceFile], read: Read) -> list[tuple[int, Any]]:
    """On a reader thread: (member, (bytes, checksum)) for each member of ``run``, or
    (member, its `UnreadableFileError`). The checksum is taken here, where the bytes are still
    in the CPU's cache and beside the other readers."""
    out: list[tuple[int, Any]] = []
    for m in run:
        try:
            data = read(files[m])
        except UnreadableFileError as exc:
            out.append((m, exc))
            continue
        out.append((m, (data, checksum_bytes(data))))
    return out
