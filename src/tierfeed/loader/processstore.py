"""A feed's store and reader threads, opened once in each process that reads (workers too)."""

from __future__ import annotations

import os
from collections.abc import Callable
from multiprocessing import util as mp_util
from typing import Any

from tierfeed.format.index import Index
from tierfeed.loader.compose import StoreOpener
from tierfeed.loader.location import StoreLocation
from tierfeed.loader.readers import Readers
from tierfeed.loader.resume import StoreId
from tierfeed.storage.driver import Driver
from tierfeed.storage.store import Sample, Store

__all__ = ["ProcessStore"]


class ProcessStore:
    """Opens a store with ``opener`` lazily, once per process (a DataLoader worker opens its
    own), with the process's reader threads; shared by a feed and the views a Loader makes of
    it (`Feed.for_loader`), so that they open one store and start one set of threads."""

    def __init__(
        self, opener: Callable[[], Store], index: Index | None = None, origin: Driver | None = None
    ) -> None:
        self.opener = opener
        self._index = index  # the index this process planned from, kept open
        self._origin = origin  # the driver of its chunks' URL, open, until `take_origin`
        self._origin_pid = os.getpid()
        self._store: Store | None = None
        self._pid = -1
        self._readers: Readers | None = None
        self._store_id: StoreId | None = None
        self._exit_pid = -1  # the process in which `close_at_exit` was asked for

    def store(self) -> Store:
        """This process's store."""
        if self._store is None or self._pid != os.getpid():
            self._store = self.opener()
            self._pid = os.getpid()
        return self._store

    def readers(self, threads: int, decode: Callable[[Sample], Any]) -> Readers:
        """This process's reader threads, kept across epochs: a read that storage holds for
        seconds finishes on its own thread instead of holding up the end of an epoch."""
        if self._readers is None or self._readers.pid != os.getpid():
            self._readers = Readers(threads, decode)
        return self._readers

    def plan_index(self) -> Index:
        """The index to plan from: by path, the index alone (no tier stack, no copy threads
        in a process that forks workers next); otherwise this process's store's."""
        if self._index is not None:
            return self._index
        if isinstance(self.opener, StoreOpener):
            self._index = self.opener.index()
            return self._index
        return self.store().index

    def take_origin(self) -> Driver | None:
        """The open driver that fetched this process's index, or for a directory whose index
        records a URL chunk root that URL's (its client made), handed over once (the taker
        closes it); None after that, in another process, or for a directory of chunk files."""
        origin, self._origin = self._origin, None
        return origin if self._origin_pid == os.getpid() else None

    def store_id(self) -> StoreId:
        """What a loader state records of the store it reads (`StoreId`), so that a state is
        never resumed on another store: taken from the index's header once, O(1)."""
        if self._store_id is None:
            where = (
                StoreLocation.of(self.opener.path).text
                if isinstance(self.opener, StoreOpener)
                else None
            )
            self._store_id = StoreId.of(self.plan_index(), where)
        return self._store_id

    def close_at_exit(self) -> None:
        """Close this process's store as the process ends: a DataLoader worker ends without a
        close, and its copies then end (boundedly, `TierStack.close`) before the process does,
        none cut off inside a file. Once per process; a no-op for a store closed before."""
        if self._exit_pid != os.getpid():
            self._exit_pid = os.getpid()
            mp_util.Finalize(None, self.close, exitpriority=0)  # run by the worker's exit

    def close(self) -> None:
        """Stop this process's reads and close its store."""
        if self._readers is not None and self._readers.pid == os.getpid():
            self._readers.close()
        self._readers = None
        if self._store is not None and self._pid == os.getpid():
            self._store.close()
        self._store = None
        origin = self.take_origin()
        if origin is not None:
            origin.close()

    def __getstate__(self) -> dict[str, Any]:
        # Threads and open stores belong to the process that made them.
        gone = {"_readers": None, "_store": None, "_pid": -1, "_index": None, "_origin": None}
        return {**self.__dict__, **gone}
