"""A process's reader threads, kept across epochs."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tierfeed.hedging import Hedges
from tierfeed.loader.decode import decode_sample
from tierfeed.storage.store import Sample, Store

__all__ = ["Readers"]


class Readers:
    """A process's reader threads and hedges, and its second way to the samples (for hedges);
    made in the process that uses them (threads do not cross fork)."""

    def __init__(self, threads: int, decode: Callable[[Sample], Any]) -> None:
        self.pid = os.getpid()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="tierfeed-read")
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
        """Cancel queued reads and join the threads (a stalled read is waited for here)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.hedges.close()
        if self._second is not None:
            self._second.source.close()  # the index is the main store's: it stays open
