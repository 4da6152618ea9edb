"""Committed chunks synced to disk on a thread while the next chunks are written.

A store's index is published only after every chunk is on disk (`tarchunk.sync_files`), so
that a crash never leaves an index naming chunks the disk does not hold. Syncing each chunk as
soon as it is renamed, rather than all of them before the index, lets the disk write one chunk
while the next one fills the page cache: the final `sync_files` then finds little left to do.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from tierfeed.format.tarchunk import fsync_path

__all__ = ["ChunkSyncer"]


def _fsync(path: Path, then: Callable[[], object] | None) -> None:
    fsync_path(path)
    if then is not None:
        then()


class ChunkSyncer:
    """fsyncs the chunks given to `add`, in order, on one named thread.

    `wait` returns once every chunk given is synced (raising the first error: an `OSError`
    with the chunk as its ``filename``, or what a ``then`` raised); `close` stops without
    waiting for chunks not yet begun.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None  # started by the first chunk
        self._pending: list[Future[None]] = []

    def add(self, path: Path, then: Callable[[], object] | None = None) -> None:
        """Sync ``path`` (a committed chunk) in the background, then call ``then`` (on the
        syncing thread: a pack's journal records the chunk once it is on disk)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tierfeed-chunk-sync")
        self._pending.append(self._pool.submit(_fsync, path, then))

    def wait(self) -> None:
        """Wait until every chunk given so far is synced (each wait is one local fsync)."""
        try:
            for done in self._pending:
                done.result()
        finally:
            self.close()

    def close(self) -> None:
        """Join the thread, dropping syncs not yet begun (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending = []

    def __enter__(self) -> ChunkSyncer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
