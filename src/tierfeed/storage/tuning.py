"""How hard to pull from the origin, from what its reads measured: bytes per request, requests
in flight, and how far ahead of the reads to fetch.

An origin request costs a fixed latency plus its bytes over the bandwidth a request gets,
``t = a + s / b``; `FetchTuner` fits ``a`` and ``b`` to the recent requests (small sample reads
and large pieces of chunk copies both feed it) and makes a piece large enough that ``a`` is a
small share of it (``overhead``), yet no larger than it needs to be: a read waiting for a
piece waits for all of it. The number of requests in flight climbs while the origin's
aggregate throughput grows with it, and steps back when it stops growing, down to a floor
(many parallel readers are what a parallel file system or object store needs; a local disk or
a saturated link gains nothing from more; processes sharing a link must not starve one
another: see `FetchLimits.min_inflight`). `lead_reads` says how many reads ahead a prefetch
must look for a chunk to land before it is read, from the read rate and the origin's
throughput.

Pure: every figure comes in as an argument (the clock included), nothing here does I/O.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

__all__ = ["PIECE_ROUND", "FetchLimits", "FetchTuner", "LookAhead", "lead_reads"]

PIECE_ROUND = 64 * 1024  # pieces are whole multiples of this
_AHEAD_S = 0.05  # reads look ahead for chunks to prefetch this often
_AHEAD_MAX = 8192  # reads looked ahead at most (a look is O(reads))
# A piece's request is late (and hedged) past this many times the median piece's time, never
# sooner than _LATE_MIN_S, and only once _LATE_SEEN pieces were timed.
_LATE_FACTOR = 3.0
_LATE_MIN_S = 0.05
_LATE_SEEN = 8
_STALLED = 4.0  # a request this many times slower than the fit says stalled: not fitted
# A piece's bytes take at most this long at a request's fitted bandwidth: a read waiting for
# its piece waits for all of it, and a need-ordered cold epoch delivers at the pace pieces land.
_PIECE_S = 0.1


@dataclass(frozen=True)
class FetchLimits:
    """Bounds on what the tuner chooses.

    Attributes:
        min_piece: the smallest piece (bytes).
        max_piece: the largest piece (bytes).
        min_inflight: requests in flight at least. Processes that share a link each see
            their rate stay flat when they add requests, and step back; without a floor one
            of them ends near a single request while the others fill the link, and when they
            are done it fetches what it has left alone at a fraction of the link, climbing one
            request per round: the end of a cold epoch went so in a trace of 2 DataLoader
            workers over the `nfs` model (`bench/cold_trace.py`, docs/BENCHMARKS.md). 4 is as many
            as a tuner starts with; then it kept one process near the link on its own.
        max_inflight: requests in flight at most (the fetch threads).
        overhead: the share of a piece's time its fixed latency may take.
        window: requests the fit looks at.
    """

    min_piece: int = 512 * 1024
    max_piece: int = 16 * 2**20
    min_inflight: int = 4
    max_inflight: int = 16
    overhead: float = 0.1
    window: int = 128


class FetchTuner:
    """Piece size and requests in flight, from the origin's measured latency and bandwidth.

    Thread-safe: every fetch thread reports its requests with `observe`.

    Args:
        limits: the bounds.
        piece: the piece size until the fit has seen enough.
        inflight: requests in flight to start with.
    """

    def __init__(
        self, limits: FetchLimits | None = None, piece: int = 4 * 2**20, inflight: int = 4
    ) -> None:
        self.limits = limits or FetchLimits()
        lo, hi = self.limits.min_inflight, self.limits.max_inflight
        self._piece = piece
        self._inflight = min(max(inflight, lo), hi)
        self._seen: deque[tuple[int, float]] = deque(maxlen=self.limits.window)
        self._piece_times: deque[float] = deque(maxlen=self.limits.window)
        self._lock = threading.Lock()
        # The throughput climb: bytes and span of the current round, and the best so far.
        self._round_bytes = 0
        self._round_start: float | None = None
        self._round_n = 0
        self._last_rate = 0.0
        self._step = 1  # +1: try more in flight next round; -1: fewer
        self.rate = 0.0  # the origin's aggregate throughput over the last round (bytes/s)
        self.fitted: tuple[float, float] | None = None  # the last fit, see `fit`

    @classmethod
    def starting(cls, parallel: int, threads: int, piece: int, costly: bool = False) -> FetchTuner:
        """A tuner whose requests in flight move within ``threads`` fetch threads, starting at
        a few; or, for an origin that does well with ``parallel`` > 0 at once (an object store,
        whose every connection is slow), starting there, free to climb to twice as many (the
        link, not one connection, is the limit it looks for). ``costly``: each request is
        billed, so pieces are never smaller than ``piece``: a cold epoch then makes at most
        ``ceil(chunk / piece)`` GETs per chunk, whatever the fit."""
        least = FetchLimits.min_inflight
        if parallel <= 0:
            limits = FetchLimits(min_inflight=min(least, threads), max_inflight=threads)
            return cls(limits, piece=piece, inflight=min(4, threads))
        most = max(threads, 2 * parallel)
        floor = piece if costly else FetchLimits.min_piece
        limits = FetchLimits(
            min_piece=floor,
            max_piece=max(floor, FetchLimits.max_piece),
            min_inflight=min(least, most),
            max_inflight=most,
        )
        return cls(limits, piece=piece, inflight=parallel)

    @property
    def piece(self) -> int:
        """Bytes per origin request of a chunk copy."""
        with self._lock:
            return self._piece

    @property
    def inflight(self) -> int:
        """Origin requests to keep in flight."""
        with self._lock:
            return self._inflight

    def piece_seconds(self) -> float:
        """How long one piece takes to land, by the last fit (0 before there is one)."""
        with self._lock:
            fitted, piece = self.fitted, self._piece
        if fitted is None:
            return 0.0
        latency, per_request = fitted
        return latency + piece / per_request

    def fit(self) -> tuple[float, float] | None:
        """``(latency s, bytes/s per request)`` fitted to the recent requests, or None while
        they do not tell the two apart (too few, or all of one size).

        Requests that took far longer than the fit says (`_STALLED` times: a heavy tail's
        stalls) are left out and the fit made again, twice at most: one stall of 1 s among
        128 requests of a few ms otherwise made the fitted latency 0 or several times too
        large, and the piece follow it (a model test in tests/storage/test_tuning.py)."""
        with self._lock:
            seen = list(self._seen)
        fitted = _least_squares(seen)
        for _ in range(2):
            if fitted is None:
                return None
            latency, per_request = fitted
            kept = [(s, t) for s, t in seen if t <= _STALLED * (latency + s / per_request)]
            if len(kept) == len(seen):
                break
            seen, fitted = kept, _least_squares(kept)
        return fitted

    def late_after(self) -> float | None:
        """Seconds after which a piece's request is late: `_LATE_FACTOR` times the median time
        of the recent pieces (at least `_LATE_MIN_S`); None until `_LATE_SEEN` were timed."""
        with self._lock:
            times = sorted(self._piece_times)
        if len(times) < _LATE_SEEN:
            return None
        return max(_LATE_MIN_S, _LATE_FACTOR * times[len(times) // 2])

    def observe(self, nbytes: int, seconds: float, now: float, piece: bool = False) -> None:
        """One origin request of ``nbytes`` took ``seconds``, ending at ``now`` (monotonic);
        ``piece``: it read a piece of a chunk copy."""
        with self._lock:
            self._seen.append((nbytes, seconds))
            if piece:
                self._piece_times.append(seconds)
            if self._round_start is None:
                self._round_start = now - seconds
            self._round_bytes += nbytes
            self._round_n += 1
            if self._round_n < max(8, 2 * self._inflight):
                return
            span = max(1e-6, now - self._round_start)
            rate = self._round_bytes / span
            self._round_start, self._round_bytes, self._round_n = now, 0, 0
            self._climb(rate)
        fitted = self.fit()
        if fitted is not None:
            with self._lock:
                self.fitted = fitted
                self._piece = self._piece_for(*fitted)

    def _climb(self, rate: float) -> None:
        """One round ended at ``rate``: keep going the way that paid; where it made no
        difference, fewer requests do as well; after a loss, turn back."""
        lo, hi = self.limits.min_inflight, self.limits.max_inflight
        if rate < self._last_rate * 0.95:
            self._step = -self._step
        elif rate < self._last_rate * 1.05:
            self._step = -1
        self.rate, self._last_rate = rate, rate
        self._inflight = min(max(self._inflight + self._step, lo), hi)

    def _piece_for(self, latency: float, per_request: float) -> int:
        """The smallest piece whose fixed latency is at most ``overhead`` of its time, and
        whose bytes take no longer than `_PIECE_S` at a request's share of the measured
        throughput (a latency that is mostly queueing on a shared link makes the first rule
        ask for pieces of seconds). Called under the lock."""
        o = self.limits.overhead
        # What a request gets while the others in flight share the link with it.
        share = min(per_request, self.rate / self._inflight) if self.rate > 0 else per_request
        want = min(latency * per_request * (1 - o) / o, share * _PIECE_S)
        rounded = math.ceil(want / PIECE_ROUND) * PIECE_ROUND
        return int(min(max(rounded, self.limits.min_piece), self.limits.max_piece))


def _least_squares(seen: list[tuple[int, float]]) -> tuple[float, float] | None:
    """``(latency, bytes/s per request)`` of ``t = latency + s / rate`` fitted to ``(s, t)``
    by least squares; None for fewer than 8, or sizes that do not tell the two apart."""
    n = len(seen)
    if n < 8:
        return None
    ms = sum(s for s, _ in seen) / n
    mt = sum(t for _, t in seen) / n
    var = sum((s - ms) ** 2 for s, _ in seen)
    if var <= 0 or ms <= 0:
        return None
    slope = sum((s - ms) * (t - mt) for s, t in seen) / var  # seconds per byte
    if slope <= 0:
        return None
    return max(0.0, mt - slope * ms), 1.0 / slope


def lead_reads(
    read_rate: float,
    chunk_bytes: float,
    origin_rate: float,
    queued_bytes: float = 0.0,
    margin: float = 2.0,
    floor: int = 64,
) -> int:
    """How many reads ahead a prefetch looks: those made while the chunks queued before it and
    the next chunk itself are fetched, with a ``margin``; at least ``floor``.

    Args:
        read_rate: reads per second the consumer makes.
        chunk_bytes: bytes of a chunk.
        origin_rate: bytes per second the origin delivers (0: not measured yet).
        queued_bytes: bytes of copies already queued ahead of it.
        margin: how many times the fetch time to look ahead.
        floor: the fewest reads looked ahead.
    """
    if origin_rate <= 0 or read_rate <= 0:
        return floor
    seconds = (queued_bytes + chunk_bytes) / origin_rate
    return max(floor, math.ceil(read_rate * seconds * margin))


class LookAhead:
    """When to prefetch again while reads go on, and how far: every `_AHEAD_S` seconds, the
    reads made while the copies queued and the next chunk are fetched (`lead_reads`)."""

    def __init__(self, chunk_bytes: float) -> None:
        self.chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        self._reads = 0
        self._since: float | None = None  # the clock at the first read
        self._rate = 0.0  # reads per second, smoothed

    def due(self, now: float, origin_rate: float, queued: int, count: int = 1) -> int:
        """``count`` reads happened at ``now``: the horizon (reads) to prefetch over, or 0 for
        not yet."""
        with self._lock:
            self._reads += count
            if self._since is None:
                self._since = now
            span = now - self._since
            if span < _AHEAD_S:
                return 0
            rate = self._reads / span
            self._rate = rate if self._rate == 0 else 0.5 * (self._rate + rate)
            self._reads, self._since = 0, now
            reads = self._rate
        lead = lead_reads(reads, self.chunk_bytes, origin_rate, queued * self.chunk_bytes)
        return min(lead, _AHEAD_MAX)
