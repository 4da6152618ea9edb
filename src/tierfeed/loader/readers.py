"""A process's reader threads, kept across epochs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tierfeed.daemonpool import DaemonPool
from tierfeed.hedging import Hedges
from tierfeed.loader.decode import decode_sample
from tierfeed.storage.store import Sample, Store

__all__ = ["Readers"]


class Readers:
    """A process's reader threads and hedges, and its second way to the samples (for hedges);
    made in the process that uses them (threads do not cross fork)."""

    def __init__(self, threads: int, decode: Callable[[Sample], Any]) -> None:
        self.pid = os.getpid()
        self.pool = DaemonPool(threads, "tierfeed-read")
        self.hedges = Hedges()  # on the process's hedge threads, which the tier stack shares
        self._decode = decode
        self._second: Store | None = None
        self._made_second = False

    def hedge_reader(self, make: Callable[[], Store | None]) -> Callable[[int], Any] | None:
        """Reads a sample the second way (the store is made once per process); a decode
        failure names the sample, as on the first way."""
        if not self._made_second:
            self._second, self._made_second = make(), True
        second = self._second
        if second is None:
            return None
        return lambda i: decode_sample(self._decode, second, i)

    def close(self) -> None:
        """Cancel queued reads and wait a bounded time for running ones (a read stuck in the
        kernel is left to its daemon thread: see `tierfeed.daemonpool`)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.hedges.close()
        if self._second is not None:
            self._second.source.close()  # the index is the main store's: it stays open
