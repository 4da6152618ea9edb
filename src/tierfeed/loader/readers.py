"""A process's reader threads, kept across epochs."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from tierfeed.daemonpool import DaemonPool
from tierfeed.hedging import Hedges
from tierfeed.loader.decode import decode_sample
from tierfeed.storage import ChunkSource, DirectoryChunks
from tierfeed.storage.store import Sample, Store

__all__ = ["Readers", "hedge_store"]


class Readers:
    """A process's reader threads and hedges, and its second way to the samples (for hedges);
    made in the process that uses them (threads do not cross fork)."""

    def __init__(self, threads: int, decode: Callable[[Sample], Any]) -> None:
        self.pid = os.getpid()
        self.pool = DaemonPool(threads, "tierfeed-read")
        self.hedges = Hedges()  # on the process's hedge threads, which the tier stack shares
        self._decode = decode
        self._second: Store | None = None
        self._making = threading.Lock()  # hedge threads make the second store once

    def hedge_reader(self, make: Callable[[], Store]) -> Callable[[int], Any]:
        """Reads a sample the second way; the store is made at the first hedge, once per
        process (no second client or descriptor unless a read is hedged). A decode failure
        names the sample, as on the first way."""

        def read(i: int) -> Any:
            with self._making:
                if self._second is None:
                    self._second = make()
                second = self._second
            return decode_sample(self._decode, second, i)

        return read

    def close(self, wait: bool = True) -> None:
        """Cancel queued reads and, with ``wait``, wait a bounded time for running ones (a
        read stuck in the kernel is left to its daemon thread: see `tierfeed.daemonpool`)."""
        self.pool.shutdown(wait=wait, cancel_futures=True)
        self.hedges.shutdown(wait=wait, cancel_futures=True)
        with self._making:
            second, self._second = self._second, None
        if second is not None:
            second.source.close()  # the index is the main store's: it stays open


def hedge_store(store: Store, make: Callable[[], ChunkSource] | None) -> Store:
    """A second way to the store's samples for hedged reads: ``make``'s, else the origin's
    directory read straight."""
    if make is not None:
        return Store(store.index, make())
    return Store(
        store.index, DirectoryChunks(store.root, store.chunks, store.index.path, direct=True)
    )
