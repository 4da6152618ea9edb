"""Requests to a tier stack's origin: single reads, and the pieces of whole-chunk copies.

Every request is timed for the `FetchTuner`, which learns the origin's latency and bandwidth
and chooses the piece size and the requests in flight. `OriginFetch.fetch` makes a copy's
pieces plain jobs (`Piece`) and hands them to a `PieceFetch`, which runs them on the fetch
threads, in the order the epoch's reads need them, with the stack's `PieceRequests`: a place
among the requests in flight, the request itself, and a budget of bytes for the
second requests of late pieces (hedges, `tierfeed.hedging`, through a way to the origin of
their own). Data flows one way: `OriginFetch` -> `PieceFetch` -> `PieceRequests` -> driver.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.daemonpool import DaemonPool
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.hedging import Hedges
from tierfeed.storage.disktier import TierCounters
from tierfeed.storage.driver import Driver
from tierfeed.storage.fetch import damaged_chunk, short_chunk
from tierfeed.storage.landing import Arrival, FetchCounters
from tierfeed.storage.piecefetch import Piece, PieceFetch, piece_order, piece_ranks
from tierfeed.storage.tuning import FetchTuner

__all__ = ["OriginFetch", "PieceRequests"]

_SPLITS = 4  # pieces read as two halves for the fetch tuner's first fit, at most
# Second requests for late pieces read at most _HEDGE_SHARE of the copies' bytes begun, and
# only _HEDGE_FLOOR of them until hedges win: each hedge that landed its piece first earns
# _HEDGE_EARNED more of its size. Where pieces run late from noise (queueing, a busy host)
# rather than stalls, no hedge wins, and they would read the full share for nothing. The
# first hedge is always within the floor (if within the share): a process that copies one
# chunk has a floor smaller than a piece, and its first stall was waited out in full.
_HEDGE_SHARE = 0.02
_HEDGE_FLOOR = 0.005
_HEDGE_EARNED = 4
# The first pieces of copies, until the fetch tuner has measured the origin: small where a
# request is cheap (a late one is hedged at little cost), larger where requests are billed.
_FIRST_PIECE = 512 * 1024
_FIRST_PIECE_COSTLY = 4 * 2**20
# While a worker's head reads (its first batch, as exact ranges) are in flight, the pieces of
# copies wait for them, this long at most: they share the link, and the batch waits for all.
_HEADS_FIRST_S = 0.3

Reads = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


class OriginFetch:
    """A stack's requests to its read-only origin.

    Args:
        origin: the origin's driver.
        copies: whether whole chunks are copied (a stack with tiers): fetch threads and a way
            of its own for hedges are made only then.
        fetch_threads: origin reads in flight at once while copying (before the tuner fits).
        piece_bytes: bytes per piece until the tuner chooses; None: by the origin's kind.
    """

    def __init__(
        self, origin: Driver, copies: bool, fetch_threads: int, piece_bytes: int | None
    ) -> None:
        self.origin = origin
        self.counters = FetchCounters()
        piece = piece_bytes or (_FIRST_PIECE_COSTLY if origin.costly_requests else _FIRST_PIECE)
        self.tuner = FetchTuner.starting(
            origin.parallel_requests, fetch_threads, piece, origin.costly_requests
        )
        # The requests in flight are bounded by the gate; a thread holds its piece a while
        # after its request ends (writing it where it lands). Where many requests are in
        # flight (an object store), threads to spare let the next request start meanwhile.
        most = self.tuner.limits.max_inflight
        threads = most * (2 if origin.parallel_requests > 0 else 1) if copies else 1
        # Daemon threads, waited for a bounded time at close: a request the origin holds (a
        # hung mount's open) neither holds the close nor the process's exit; what it returns
        # late lands nothing (`PieceFetch`).
        self._pool = DaemonPool(threads, "tierfeed-fetch", ranked=True)  # pieces by need
        self._stop = threading.Event()
        self._hedges = Hedges()
        self._hedge_origin = origin.for_hedges() if copies else origin
        self._splits = 0  # pieces read as halves for the tuner's fit (a few)
        # ``hits``: reads served from the origin; ``bytes``: every byte it gave (reads, the
        # pieces of copies, hedges); ``copies``, ``copy_failures``: whole-chunk copies.
        self.origin_counters = TierCounters()
        self.requests = PieceRequests(
            origin, self._hedge_origin, self.tuner, self.counters, self.origin_counters, self._stop
        )

    def read(self, info: ChunkInfo, offset: int, length: int, block: bool = False) -> bytes:
        """One request that is not a piece of a copy, timed for the tuner: a sample read, or
        a ``block`` read (a head read), read past the page cache where the origin can
        (`Driver.read_block`).

        Raises:
            ChunkCorruptError: the origin returned fewer bytes than the index says are there.
        """
        started = time.perf_counter()
        data = (self.origin.read_block if block else self.origin.read_range)(
            info.name, offset, length
        )
        self.tuner.observe(len(data), time.perf_counter() - started, time.monotonic())
        if len(data) != length:
            raise short_chunk(info, self.origin.name, offset, length)
        self.origin_counters.add(hits=1, bytes=length)
        return bytes(data)

    def heads_begin(self, reads: int) -> None:
        """``reads`` head reads began: pieces of copies wait until they end, or at most
        `_HEADS_FIRST_S` from now (`PieceRequests.heads_begin`)."""
        self.requests.heads_begin(reads)

    def heads_end(self) -> None:
        """One head read ended (landed or failed)."""
        self.requests.heads_end()

    def fetch(self, arrival: Arrival, reads: Reads, first: int | None) -> None:
        """Every piece of ``arrival``'s chunk, in parallel on the fetch threads: piece
        ``first`` first (a read waits for it), then in the order the epoch's ``reads``
        (positions, starts, ends) need them, else in offset order; checked whole.

        Raises:
            ChunkCorruptError: the origin's copy is shorter than the index says, or its
                checksum differs.
            StorageError: the origin could not be read.
        """
        self.requests.begun(arrival.info.size)
        # A hedge's way to the chunk is opened now, while no request of it stalls: on FUSE an
        # open waits for the pages a stalled read holds (and on NFS an open may hang itself).
        if self._hedge_origin is not self.origin:
            self._hedge_origin.open_ahead([arrival.info.name])
        pieces = PieceFetch(
            arrival, self.requests, self._pool, self._hedges, self.counters, self._stop
        )
        positions, offsets, ends = reads
        ranks = piece_ranks(positions, offsets, arrival.piece, arrival.pieces, first, ends)
        order = piece_order(ranks)
        # Ranked across copies where the link is the limit (a file system); from an object
        # store, whose cold epoch is bound by the CPU its GETs and reads take, each copy's
        # pieces in turn: a chunk whole sooner is read locally sooner, and reads served by
        # copies in flight cost more (issue 45: fewer samples/s ranked, through
        # `bench/s3_compare.py`'s endpoint; docs/BENCHMARKS.md, "From an object store: head
        # reads and ranked pieces tried, and left off").
        ranked = None if self.origin.costly_requests else ranks.tolist()
        pieces.run(self._jobs(arrival, order), self.tuner.limits.max_inflight, ranked)
        info = arrival.info
        size, checksum = arrival.digest()
        if size != info.size or checksum != info.checksum:
            raise damaged_chunk(info, self.origin.name, size)

    def _jobs(self, arrival: Arrival, order: list[int]) -> list[Piece]:
        """The pieces of ``arrival``'s chunk, in ``order``, as plain jobs. Until the tuner can
        tell latency from bandwidth, a few pieces are read as two halves: requests of two
        sizes are what the fit needs. A few: all of a chunk's pieces may start before the
        first ends, and each split is one request more. None from a store that bills
        requests: there the fit takes the sizes that occur (each chunk's shorter last piece,
        sample reads)."""
        splits = 0 if self.origin.costly_requests else _SPLITS
        jobs = []
        for index in order:
            offset, length = arrival.span(index)
            if self.tuner.fitted is None and index % 2 and length > 1 and self._splits < splits:
                self._splits += 1
                half = length // 2
                jobs.append(Piece(index, ((offset, half), (offset + half, length - half))))
            else:
                jobs.append(Piece(index, ((offset, length),)))
        return jobs

    def stats(self) -> dict[str, Any]:
        """The pieces and reads served from copies in flight, what the tuner chose
        (``piece_kib``, ``inflight``) and the origin's throughput it measured."""
        return dict(
            self.counters.snapshot(),
            piece_kib=self.tuner.piece // 1024,
            inflight=self.tuner.inflight,
            origin_mbps=round(self.tuner.rate / 1e6, 1),
        )

    @property
    def stopped(self) -> bool:
        """Whether `stop` was called."""
        return self._stop.is_set()

    def stop(self) -> None:
        """End the copies under way now (each raises StorageError); no more can start."""
        self._stop.set()

    def close(self) -> None:
        """Stop the copies under way and the fetch threads and hedges (a bounded wait for
        requests running), close the origin's ways."""
        self.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._hedges.close()
        self.origin.close()
        if self._hedge_origin is not self.origin:
            self._hedge_origin.close()


class PieceRequests:
    """The requests that read the pieces of a stack's copies, for its `PieceFetch`es: a place
    among the requests in flight (the tuner's number; none for a hedge, which goes
    its own way and past that limit, so it does not queue behind the requests it hedges),
    after the head reads in flight (a bounded wait); each request timed for the tuner and read
    past the page cache where the origin can, as the buffers it arrived in
    (`Driver.read_parts`); and the budget of bytes for hedges.

    Args:
        origin: the origin's driver.
        hedge_origin: its way for hedges (``origin`` itself where there is none).
        tuner: times the requests; says when a piece is late.
        counters: the copies' counters (hedges won earn budget).
        origin_counters: the origin's bytes.
        stop: set when the stack closes: a wait for the head reads ends.
    """

    def __init__(
        self,
        origin: Driver,
        hedge_origin: Driver,
        tuner: FetchTuner,
        counters: FetchCounters,
        origin_counters: TierCounters,
        stop: threading.Event,
    ) -> None:
        self._origin, self._hedge_origin, self._tuner = origin, hedge_origin, tuner
        self._counters, self._origin_counters, self._stop = counters, origin_counters, stop
        self._places = threading.Condition()
        self._inside = self._aside = 0  # requests in their places; of them, set aside (late)
        self._mutex = threading.Lock()
        self._hedged_bytes = self._begun_bytes = self._hedges_granted = 0
        self._heads = threading.Condition()
        self._heads_left, self._heads_until = 0, 0.0

    @contextlib.contextmanager
    def slot(self, hedge: bool) -> Iterator[None]:
        """A place for one request of a piece: after the head reads in flight, once fewer
        than the tuner's requests in flight are in theirs (those set aside do not count: a
        stall does not take a place); a ``hedge`` takes none."""
        if hedge:
            yield
            return
        self.after_heads()
        with self._places:
            while self._inside - self._aside >= max(1, self._tuner.inflight):
                self._places.wait(0.05)  # bounded: a limit the tuner raised meanwhile is seen
            self._inside += 1
        try:
            yield
        finally:
            with self._places:
                self._inside -= 1
                self._places.notify()

    def read(self, info: ChunkInfo, offset: int, length: int, hedge: bool) -> list[Any]:
        """One request of a piece (in its `slot`), timed for the tuner, as the buffers it
        arrived in; a ``hedge`` through the way for hedges.

        Raises:
            ChunkCorruptError: the origin returned fewer bytes than the index says are there.
        """
        started = time.perf_counter()
        way = self._hedge_origin if hedge else self._origin
        parts = list(way.read_parts(info.name, offset, length))
        took = time.perf_counter() - started
        size = sum(len(part) for part in parts)
        self._tuner.observe(size, took, time.monotonic(), piece=True)
        if size != length:
            raise short_chunk(info, self._origin.name, offset, length)
        self._origin_counters.add(bytes=length)
        return parts

    def late_after(self) -> float | None:
        """Seconds after which a running piece is late; None: not known yet."""
        return self._tuner.late_after()

    def set_aside(self, n: int) -> None:
        """``n`` more requests in their places are late, replaced by hedges (negative: that
        many of them ended): they no longer count against the requests in flight."""
        with self._places:
            self._aside += n
            self._places.notify_all()

    def begun(self, nbytes: int) -> None:
        """A copy of ``nbytes`` began: hedges may read a share of it."""
        with self._mutex:
            self._begun_bytes += nbytes

    def may_hedge(self, nbytes: int) -> bool:
        """Whether a second request of ``nbytes`` for a late piece fits the budget: hedges
        read at most `_HEDGE_FLOOR` of the bytes of the copies begun (the first hedge always
        fits it), more as they win (each win earns `_HEDGE_EARNED` hedges of its size), never
        past `_HEDGE_SHARE`."""
        with self._mutex:
            spent = self._hedged_bytes + nbytes
            granted = self._hedges_granted
            won = self._counters.hedge_wins * self._hedged_bytes / granted if granted else 0.0
            floor = max(_HEDGE_FLOOR * self._begun_bytes, nbytes)
            earned = floor + _HEDGE_EARNED * won
            if spent > min(earned, _HEDGE_SHARE * self._begun_bytes):
                return False
            self._hedged_bytes = spent
            self._hedges_granted += 1
            return True

    def heads_begin(self, reads: int) -> None:
        """``reads`` head reads began: pieces wait until they end, or at most
        `_HEADS_FIRST_S` from now."""
        with self._heads:
            self._heads_left += reads
            self._heads_until = time.monotonic() + _HEADS_FIRST_S

    def heads_end(self) -> None:
        """One head read ended (landed or failed)."""
        with self._heads:
            self._heads_left -= 1
            if self._heads_left <= 0:
                self._heads.notify_all()

    def after_heads(self) -> None:
        """Wait while head reads are in flight, at most until their bound (or a stop)."""
        with self._heads:
            while self._heads_left > 0 and not self._stop.is_set():
                left = self._heads_until - time.monotonic()
                if left <= 0:
                    return
                self._heads.wait(min(left, 0.05))
