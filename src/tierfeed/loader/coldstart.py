"""The first copies of a Loader's start, made by the main process while its workers start.

A DataLoader worker asks the origin for nothing until it has started: forked, its store
opened (an object store's client made, its index and chunks looked at), its reads planned.
The main process knows the plan before that. So, right after the workers are forked, it
opens a tier stack of its own over the same disk tier (no RAM tier: it serves no read),
tells it the rank's reads of the epoch, and copies the chunks they open with (the stack's
first prefetch, `Filler.set_future`), each claimed in the directory the host shares. A
worker that needs one of them finds it claimed and reads its pieces as they land
(`tierfeed.storage.filelanding`); the workers copy the chunks after those themselves.

Nothing changes what is read or delivered: the copies are the ones a worker would have made,
placed under the same quota and checked the same way, and the origin's bytes of the epoch
are the same (a chunk is copied by the one process that claims it). Once the opening copies
are done the stack is closed: no thread of it runs when the Loader forks workers again
(`ColdStart.stop` is called first, and waits a bounded time).

It applies to a store opened by path or URL (`StoreOpener`) with a disk tier and the
clairvoyant policy (`StoreOpener.copier_over`); a process without a disk tier lands copies in
its own memory, which a worker cannot read. The stack reads the index the main process
planned from, so the index is not opened or fetched again.

The same stack reads the first batch a Loader delivers itself, while its workers start
(`holding`, `tierfeed.loader.opening.read_opening`; where it does: `opens`): its samples read
at once as exact ranges. The stack is not closed under that read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import TierfeedError
from tierfeed.loader.clairvoyance import head_pays, open_ahead, tell_future
from tierfeed.loader.compose import StoreOpener
from tierfeed.loader.processstore import ProcessStore
from tierfeed.storage.store import Store

__all__ = ["ColdStart"]

log = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]

_COPIES_S = 60.0  # the opening copies may take this long; then the stack is closed anyway
_STOP_S = 30.0  # `stop` waits this long for running copies to finish
_OPENING = 8  # chunks of the first reads opened ahead (the first prefetch copies some)
_POLL_S = 0.05  # how often the copying thread looks whether it was told to stop


class ColdStart:
    """Copies the opening chunks of ``reads`` (the rank's reads of an epoch, in the order the
    Loader hands them out) into the host's disk tier: made before the workers are forked (its
    stack runs no thread until it copies), `start`ed after the fork.

    Args:
        store: the store's index as this process has it open, over a tier stack that only
            copies, into the disk tier the workers share (`StoreOpener.copier_over`); its
            stack is closed here, its index left open.
        reads: gives the rank's samples of the epoch the workers start on, in order; called
            on the copying thread, after the fork (a rank's order is O(its samples) to make).
        copies_s: the most seconds the opening copies are waited for.
    """

    def __init__(
        self, store: Store, reads: Callable[[], IntArray], copies_s: float = _COPIES_S
    ) -> None:
        self._store = store
        self._reads = reads
        self._made: IntArray | None = None  # `reads()`, once made
        self._making = threading.Lock()
        self._copies_s = copies_s
        self._stopping = threading.Event()
        self._reading = threading.Lock()  # held while this process reads through the stack
        self.stats: dict[str, Any] | None = None  # the stack's counters, once it is closed
        self._thread = threading.Thread(target=self._run, name="tierfeed-coldstart", daemon=True)

    @classmethod
    def of(cls, process: ProcessStore, reads: Callable[[], IntArray]) -> ColdStart | None:
        """The copies of ``reads`` from ``process``'s store, over the index it planned from;
        None where they do not apply (a store not opened by path or URL, no disk tier the
        host shares, another policy) or its stack cannot be made here (the workers say why)."""
        opener = process.opener
        if not isinstance(opener, StoreOpener):
            return None
        index = process.plan_index()
        try:
            store = opener.copier_store(index, process.take_origin())
        except (TierfeedError, OSError):
            return None
        return None if store is None else cls(store, reads)

    def start(self) -> ColdStart:
        """Begin copying in the background (after the fork); returns self."""
        self._thread.start()
        return self

    def reads(self) -> IntArray:
        """The rank's reads of the epoch, in order: made once, by the first caller (this
        process's first batch, else the copying thread)."""
        with self._making:
            if self._made is None:
                self._made = self._reads()
            return self._made

    def opens(self, samples: int) -> bool:
        """Whether this process reads the first ``samples`` of the reads itself, as the
        workers start (`tierfeed.loader.opening`): from a file system always; from an object
        store where a worker would read them at once (`head_pays`): a GET each, which on a
        store of a few chunks costs the cold epoch more than the first batch gains
        (docs/BENCHMARKS.md, "The first batch read by the training process")."""
        if not self._store.source.costly_requests:
            return True
        first = self.reads()[:samples]
        self._store.index.check_samples(first)
        return head_pays(self._store, first)

    @contextlib.contextmanager
    def holding(self) -> Iterator[Store]:
        """The store, to read through on the calling thread (before or after `start`); the
        copies' end does not close it until the ``with`` block is left (their thread waits
        at most ``_STOP_S`` for that)."""
        with self._reading:
            yield self._store

    @property
    def started(self) -> bool:
        """Whether `start` was called."""
        return self._thread.ident is not None

    def stop(self, timeout: float = _STOP_S) -> bool:
        """Drop the copies not begun, let the running ones finish, and wait for them at most
        ``timeout`` seconds; True if they have ended (or never began)."""
        self._stopping.set()
        if not self.started:  # never started: nothing runs, close it here
            self._close()
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @staticmethod
    def stop_if_any(cold: ColdStart | None) -> None:
        """`stop` ``cold`` if given; warn if its copies are still running after the wait."""
        if cold is not None and not cold.stop():
            warnings.warn(
                "tierfeed: the main process's copies of the first chunks are still running",
                stacklevel=3,
            )

    def _run(self) -> None:
        store = self._store
        try:
            reads = self.reads() if store.source.uses_future else None
            if reads is not None and len(reads):
                store.index.check_samples(reads)
                open_ahead(store, reads, _OPENING)  # e.g. an S3 client made meanwhile
                tell_future(store, reads, [reads])
                self._wait()
        except TierfeedError as exc:  # the workers read the same and say what is wrong
            log.debug("tierfeed: the main process's copies stopped: %s", exc)
        finally:
            self._close()

    def _wait(self) -> None:
        """Until the copies are done, the thread is told to stop, or ``copies_s`` passed."""
        deadline = time.monotonic() + self._copies_s
        while not self._stopping.is_set() and time.monotonic() < deadline:
            try:
                self._store.source.drain(timeout=_POLL_S)
                return
            except TierfeedError:  # still copying
                continue

    def _close(self) -> None:
        reading = self._reading.acquire(timeout=_STOP_S)  # a read through the stack ends first
        try:
            self._close_stack()
        finally:
            if reading:
                self._reading.release()

    def _close_stack(self) -> None:
        if self.stats is None:
            self.stats = self._store.source.stats() or {}
            self._store.source.close()  # copies not begun are dropped; running ones finish
