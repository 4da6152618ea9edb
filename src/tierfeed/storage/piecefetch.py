"""The pieces of one chunk copy in flight, with hedges for the ones that stall.

A copy reads its chunk from the origin as pieces, in parallel on the fetch threads, into an
`Arrival` that reads are served from as pieces land. One stalled request (an NFS server that
hiccups, an object store's slow GET) would hold the whole copy, and with it every read that
waits for that piece. So a piece whose request has run past ``late_after`` (a few times the
usual time of a piece, from the fetch tuner) gets a second request on threads of its own, and
the first of the two to end lands the piece; the other's bytes are dropped. Hedges cost origin
bytes: the reader's budget (`PieceReader.may_hedge`) keeps them within bounds.

A piece is a plain job (`Piece`: its index and the requests that read it); the fetch runs it
with a `PieceReader` it is handed, which makes each request and calls nothing back.

Every piece lands once, under this fetch's lock, and never after the fetch is over: a request
that ends after it (a loser, or the rest of a failed copy) writes nothing to an arrival that
may be closed by then.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tierfeed.daemonpool import DaemonPool
from tierfeed.errors import StorageError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.format.indexcheck import concat_ranges
from tierfeed.storage.landing import Arrival, FetchCounters
from tierfeed.storage.tuning import PIECE_ROUND

__all__ = [
    "Piece",
    "PieceFetch",
    "PieceReader",
    "piece_order",
    "piece_ranks",
    "spread_piece",
]

_POLL_S = 0.01  # how often a copy looks for late pieces while it waits
# A chunk's reads are spread when reads next to each other in it are, in the median, further
# apart than this in the order of consumption (a few batches): a shuffle, not a sequence.
_NEAR = 256
_SPREAD_READS = 4  # a spread chunk's piece holds about this many reads' bytes


@dataclass(frozen=True)
class Piece:
    """One piece of a chunk copy, a plain job for a fetch thread: its index in the chunk, and
    the requests (offset, length) that read it, in order (one; two halves while the fetch
    tuner fits)."""

    index: int
    requests: tuple[tuple[int, int], ...]


class PieceReader(Protocol):
    """What a `PieceFetch` reads pieces with (`tierfeed.storage.originfetch.PieceRequests`):
    it is handed requests and returns bytes, and never calls back."""

    def slot(self, hedge: bool) -> AbstractContextManager[None]:
        """A place for one request: within the requests in flight; a ``hedge`` past them."""

    def read(self, info: ChunkInfo, offset: int, length: int, hedge: bool) -> list[Any]:
        """One request's bytes, as the buffers they arrived in."""

    def late_after(self) -> float | None:
        """Seconds after which a running piece is late; None: not known yet (no hedges)."""

    def may_hedge(self, nbytes: int) -> bool:
        """Whether a second request of ``nbytes`` may be made now (a budget)."""

    def set_aside(self, n: int) -> None:
        """``n`` more requests in flight are late (negative: that many of them ended): they
        no longer count against the requests in flight."""


class PieceFetch:
    """Fetch every piece of ``arrival`` once, hedging the late ones.

    Args:
        arrival: where the pieces land.
        reader: makes each request (`PieceReader`). A piece is late by the time its first
            request runs (in its `PieceReader.slot`), not by its time queued.
        pool: the fetch threads (a `DaemonPool`: pieces go to it ranked by when they are
            needed, so that of the pieces of every copy in flight the one needed soonest is
            fetched first).
        hedge_pool: threads for second requests (behind the fetch threads, they would start
            late).
        counters: pieces landed, hedges made and won.
        stop: set when the copy is to end now, whatever it waits for (its owner closes).
    """

    def __init__(
        self,
        arrival: Arrival,
        reader: PieceReader,
        pool: DaemonPool,
        hedge_pool: Executor,
        counters: FetchCounters,
        stop: threading.Event | None = None,
    ) -> None:
        self.arrival = arrival
        self._reader = reader
        self._pool, self._hedge_pool = pool, hedge_pool
        self._counters = counters
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._landed: set[int] = set()
        # piece index -> when its first request began, and the piece (a hedge's job)
        self._running: dict[int, tuple[float, Piece]] = {}
        self._hedged: set[int] = set()
        self._over = False

    def run(self, pieces: Sequence[Piece], queued: int, ranks: Sequence[int] | None = None) -> None:
        """Fetch ``pieces`` (the arrival's, in order); returns once every one has landed. At
        most ``queued`` wait on the fetch threads at once (the next one is asked for as one
        ends), so that copies of several chunks share the threads; with ``ranks``
        (`piece_ranks`, by piece index), the threads take the queued piece needed soonest.

        Raises:
            Exception: what the request for a piece raised, once no other request for it is
                left (the rest of the copy is cancelled).
            StorageError: ``stop`` was set (a request the origin holds is not waited for).
        """
        todo = deque(pieces)
        requests: dict[Future[None], int] = {}  # first requests and hedges not ended yet
        firsts: dict[int, Future[None]] = {}  # first requests queued or running, not late
        left: Counter[int] = Counter()  # requests per piece not ended yet

        def ask() -> None:
            while todo and len(firsts) < max(1, queued):
                piece = todo.popleft()
                rank = 0 if ranks is None else ranks[piece.index]
                future = self._pool.submit_ranked(rank, self._fetch, piece, False)
                requests[future] = piece.index
                firsts[piece.index] = future
                left[piece.index] += 1

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
                for piece in self._late():
                    requests[self._hedge_pool.submit(self._fetch, piece, True)] = piece.index
                    left[piece.index] += 1
                    firsts.pop(piece.index, None)  # set aside: the next piece takes its place
        finally:
            with self._lock:
                self._over = True  # a request that ends from now on lands nothing
            for future in requests:
                future.cancel()

    def _late(self) -> list[Piece]:
        """Pieces whose request has run past the limit and that get a second one now (the
        longest-running first, while the budget lasts)."""
        after = self._reader.late_after()
        if after is None:
            return []
        now = time.monotonic()
        out = []
        with self._lock:
            late = [
                (began, i, piece)
                for i, (began, piece) in self._running.items()
                if now - began > after and i not in self._hedged
            ]
            for _, index, piece in sorted(late):
                if not self._reader.may_hedge(self.arrival.span(index)[1]):
                    break
                self._hedged.add(index)
                out.append(piece)
        if out:
            self._reader.set_aside(len(out))
            self._counters.add(hedges=len(out))
        return out

    def _fetch(self, piece: Piece, hedge: bool) -> None:
        """Run ``piece``'s requests (a ``hedge``: its second ones) and land it, first come."""
        index = piece.index
        if hedge:  # not timed: a hedge is never hedged again
            data = self._read(piece, hedge)
        else:
            try:
                data = self._read(piece, hedge)
            finally:
                with self._lock:
                    self._running.pop(index, None)
                    was_late = index in self._hedged
                if was_late:
                    self._reader.set_aside(-1)
        with self._lock:  # the write too: the arrival is not closed under a piece landing
            if self._over or index in self._landed:
                return
            self.arrival.put(index, data)
            self._landed.add(index)
        size = sum(len(part) for part in data)
        self._counters.add(pieces=1, piece_bytes=size, hedge_wins=int(hedge))

    def _read(self, piece: Piece, hedge: bool) -> list[Any]:
        """The piece's bytes, request by request, each in a place of its own."""
        data: list[Any] = []
        for offset, length in piece.requests:
            with self._reader.slot(hedge):
                if not hedge:
                    with self._lock:  # a piece is late from when its first request runs
                        self._running.setdefault(piece.index, (time.monotonic(), piece))
                data += self._reader.read(self.arrival.info, offset, length, hedge)
        return data


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
