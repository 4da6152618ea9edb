"""The pieces of one chunk copy in flight, with hedges for the ones that stall.

A copy reads its chunk from the origin as pieces, in parallel on the fetch threads, into an
`Arrival` that reads are served from as pieces land. One stalled request (an NFS server that
hiccups, an object store's slow GET) would hold the whole copy, and with it every read that
waits for that piece. So a piece whose request has run past ``late_after`` (a few times the
usual time of a piece, from the fetch tuner) gets a second request on threads of its own, and
the first of the two to end lands the piece; the other's bytes are dropped. Hedges cost origin
bytes: the caller's ``may_hedge`` keeps them within a budget.

Every piece lands once, under this fetch's lock, and never after the fetch is over: a request
that ends after it (a loser, or the rest of a failed copy) writes nothing to an arrival that
may be closed by then.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.daemonpool import DaemonPool
from tierfeed.errors import StorageError
from tierfeed.format.indexcheck import concat_ranges
from tierfeed.storage.landing import Arrival, FetchCounters
from tierfeed.storage.tuning import PIECE_ROUND

__all__ = ["PieceFetch", "piece_order", "piece_ranks", "spread_piece"]

_POLL_S = 0.01  # how often a copy looks for late pieces while it waits
# A chunk's reads are spread when reads next to each other in it are, in the median, further
# apart than this in the order of consumption (a few batches): a shuffle, not a sequence.
_NEAR = 256
_SPREAD_READS = 4  # a spread chunk's piece holds about this many reads' bytes


class PieceFetch:
    """Fetch every piece of ``arrival`` once, hedging the late ones.

    Args:
        arrival: where the pieces land.
        read: ``read(index, begun, hedge)`` returns piece ``index``'s bytes from the origin and
            calls ``begun()`` once its first request is under way (past any limit on requests
            in flight): a piece is late by the time its request runs, not by its time queued.
            ``hedge``: the second request for a late piece.
        pool: the fetch threads (a `DaemonPool`: pieces go to it ranked by when they are
            needed, so that of the pieces of every copy in flight the one needed soonest is
            fetched first).
        hedge_pool: threads for second requests (behind the fetch threads, they would start
            late).
        late_after: seconds after which a running piece is late; None: not known yet (no
            hedges).
        may_hedge: whether a second request of so many bytes may be made now (a budget).
        counters: pieces landed, hedges made and won.
        set_aside: told of requests found late (+n) and of late ones that ended (-n): they
            no longer count against the requests in flight (`Gate.set_aside`).
        stop: set when the copy is to end now, whatever it waits for (its owner closes).
    """

    def __init__(
        self,
        arrival: Arrival,
        read: Callable[[int, Callable[[], None], bool], bytes | list[Any]],
        pool: DaemonPool,
        hedge_pool: Executor,
        late_after: Callable[[], float | None],
        may_hedge: Callable[[int], bool],
        counters: FetchCounters,
        set_aside: Callable[[int], None] = lambda n: None,
        stop: threading.Event | None = None,
    ) -> None:
        self.arrival = arrival
        self._read = read
        self._pool, self._hedge_pool = pool, hedge_pool
        self._late_after, self._may_hedge = late_after, may_hedge
        self._counters = counters
        self._set_aside = set_aside
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._landed: set[int] = set()
        self._running: dict[int, float] = {}  # piece -> when its first request began
        self._hedged: set[int] = set()
        self._over = False

    def run(self, order: Sequence[int], queued: int, ranks: Sequence[int] | None = None) -> None:
        """Fetch the pieces in ``order``; returns once every one has landed. At most
        ``queued`` wait on the fetch threads at once (the next one is asked for as one ends),
        so that copies of several chunks share the threads; with ``ranks`` (`piece_ranks`),
        the threads take the queued piece of any copy that is needed soonest.

        Raises:
            Exception: what the request for a piece raised, once no other request for it is
                left (the rest of the copy is cancelled).
            StorageError: ``stop`` was set (a request the origin holds is not waited for).
        """
        todo = deque(order)
        requests: dict[Future[None], int] = {}  # first requests and hedges not ended yet
        firsts: dict[int, Future[None]] = {}  # first requests queued or running, not late
        left: Counter[int] = Counter()  # requests per piece not ended yet

        def ask() -> None:
            while todo and len(firsts) < max(1, queued):
                index = todo.popleft()
                rank = 0 if ranks is None else ranks[index]
                future = self._pool.submit_ranked(rank, self._fetch, index, False)
                requests[future] = index
                firsts[index] = future
                left[index] += 1

        try:
            ask()
            while len(self._landed) < self.arrival.pieces:
                done, _ = wait(list(requests), timeout=_POLL_S, return_when=FIRST_COMPLETED)
                if self._stop.is_set():
                    raise StorageError(f"{self.arrival.info.name}: copy stopped: its owner closed")
                for future in done:
                    index = requests.pop(future)
                    if firsts.get(index) is future:
                        del firsts[index]
                    left[index] -= 1
                    failure = future.exception()
                    if failure is not None and index not in self._landed and not left[index]:
                        raise failure
                ask()
                for index in self._late():
                    requests[self._hedge_pool.submit(self._fetch, index, True)] = index
                    left[index] += 1
                    firsts.pop(index, None)  # set aside: the next piece takes its place
        finally:
            with self._lock:
                self._over = True  # a request that ends from now on lands nothing
            for future in requests:
                future.cancel()

    def _late(self) -> list[int]:
        """Pieces whose request has run past the limit and that get a second one now (the
        longest-running first, while the budget lasts)."""
        after = self._late_after()
        if after is None:
            return []
        now = time.monotonic()
        out = []
        with self._lock:
            late = [
                (began, i)
                for i, began in self._running.items()
                if now - began > after and i not in self._hedged
            ]
            for _, index in sorted(late):
                if not self._may_hedge(self.arrival.span(index)[1]):
                    break
                self._hedged.add(index)
                out.append(index)
        if out:
            self._set_aside(len(out))
            self._counters.add(hedges=len(out))
        return out

    def _begun(self, index: int) -> None:
        with self._lock:
            self._running.setdefault(index, time.monotonic())

    def _fetch(self, index: int, hedge: bool) -> None:
        if hedge:  # not timed: a hedge is never hedged again
            data = self._read(index, lambda: None, hedge)
        else:
            try:
                data = self._read(index, lambda: self._begun(index), hedge)
            finally:
                with self._lock:
                    self._running.pop(index, None)
                    was_late = index in self._hedged
                if was_late:
                    self._set_aside(-1)
        with self._lock:  # the write too: the arrival is not closed under a piece landing
            if self._over or index in self._landed:
                return
            self.arrival.put(index, data)
            self._landed.add(index)
        size = len(data) if isinstance(data, bytes) else sum(len(part) for part in data)
        self._counters.add(pieces=1, piece_bytes=size, hedge_wins=int(hedge))


def piece_order(ranks: npt.NDArray[np.int64]) -> list[int]:
    """The order to fetch a chunk's pieces in, by their `piece_ranks`: the piece a read waits
    for, then by when the plan reads them first, then the ones it does not read, in offset
    order."""
    return [int(i) for i in np.lexsort((np.arange(len(ranks)), ranks))]


def piece_ranks(
    positions: npt.NDArray[np.integer[Any]],
    offsets: npt.NDArray[np.integer[Any]],
    piece: int,
    pieces: int,
    first: int | None = None,
    ends: npt.NDArray[np.integer[Any]] | None = None,
) -> npt.NDArray[np.int64]:
    """When each of a chunk's ``pieces`` of ``piece`` bytes is needed: the place of the first
    read of it in the order of consumption; -1 for piece ``first`` (a read waits for it);
    the int64 maximum for a piece no read needs.

    Args:
        positions: where in the order of consumption each read of this chunk comes.
        offsets: the byte offset in the chunk that each read starts at.
        piece: bytes per piece.
        pieces: how many pieces the chunk has.
        first: the piece to fetch first (None: none is waited for).
        ends: the byte offset each read ends at (exclusive), so that every piece a read
            spans is needed when it is; None: each read needs the piece it starts in only.
    """
    never = np.iinfo(np.int64).max
    rank = np.full(pieces, never, dtype=np.int64)
    size = max(1, piece)
    starts = np.asarray(offsets, dtype=np.int64)
    lo = np.clip(starts // size, 0, pieces - 1)
    at, when = lo, np.asarray(positions, dtype=np.int64)
    if ends is not None and len(starts):
        last = np.maximum(np.asarray(ends, dtype=np.int64), starts + 1) - 1
        spans = np.clip(last // size, 0, pieces - 1) - lo + 1  # >= 1: pieces each read needs
        at, when = concat_ranges(lo, spans), np.repeat(when, spans)
    np.minimum.at(rank, at, when)
    if first is not None:
        rank[min(max(first, 0), pieces - 1)] = -1
    return rank


def spread_piece(
    piece: int,
    floor: int,
    positions: npt.NDArray[np.integer[Any]],
    starts: npt.NDArray[np.integer[Any]],
    ends: npt.NDArray[np.integer[Any]],
) -> int:
    """The piece size for a copy of a chunk whose reads are ``positions`` (where in the order
    of consumption each comes), ``starts`` and ``ends`` (their bytes): ``piece`` where
    neighbouring reads of the chunk come close together (a sequence, chunk-wise windows),
    else about `_SPREAD_READS` reads' bytes, never under ``floor``. Under a shuffle each read
    of the first batches waits for a piece of its own and the copies bring every piece
    before the reads can go local, so a batch waits for as many pieces as it has samples:
    pieces of megabytes made the cold epoch's first batches wait seconds, those of a few
    samples wait in step with the link (issue 45, docs/BENCHMARKS.md)."""
    if len(positions) < 2 or piece <= floor:
        return piece
    by_offset = np.argsort(np.asarray(starts), kind="stable")
    gaps = np.abs(np.diff(np.asarray(positions, dtype=np.int64)[by_offset]))
    if float(np.median(gaps)) <= _NEAR:
        return piece
    sizes = np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
    want = -(-_SPREAD_READS * int(np.median(sizes)) // PIECE_ROUND) * PIECE_ROUND
    return min(piece, max(floor, want))
