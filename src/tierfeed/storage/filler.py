"""How chunks get into a stack's tiers, and the reads served by copies in flight.

A `Filler` owns the copy threads (`Copier`), what a copy does (`Copies`: its requests to the
origin through `OriginFetch`, where it lands, its placement under each tier's policy), and
the look-ahead. Its contract to the tier stack (`tierfeed.storage.tiers`), which serves reads:

- `schedule(chunk)`: copy ``chunk`` into the tiers that lack it and would take it;
- `read_landing(info, offset, length)`: the range from the chunk's copy in flight, once it
  lands (the copy started at once if none is in flight); None when it does not land in time;
- `read_landed(info, offsets, lengths)`: the ranges from a copy in flight that landed whole;
- `seen(reads)`, `set_future`, `set_reads`, `prefetch`: the reads made and the reads to come;
- `drain`, `close`.

Bookkeeping is the `Holdings`' (one lock, never held across I/O); a placement into one tier is
serialised by that tier's own lock (and, for a directory every process of the host fills, its
cross-process lock). A copy that fails, for any reason, is counted and logged; its thread goes
on with the next one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy.typing as npt

from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.copier import Copier
from tierfeed.storage.foresight import Foresight
from tierfeed.storage.holdings import Holdings
from tierfeed.storage.landing import Arrival, Landing
from tierfeed.storage.originfetch import OriginFetch
from tierfeed.storage.placing import Copies
from tierfeed.storage.tieroptions import TierOptions

__all__ = ["Filler"]

_WAIT_MAX_S = 5.0  # a read waits for its piece of a copy in flight at most this long


class Filler:
    """Copies chunks into the tiers of ``holdings`` from ``fetch``'s origin.

    Args:
        holdings: the tiers and their bookkeeping.
        fetch: the origin's requests.
        landing: where copies land while in flight.
        options: threads, queue and the wait for a copy in flight.
    """

    def __init__(
        self, holdings: Holdings, fetch: OriginFetch, landing: Landing, options: TierOptions
    ) -> None:
        self._h, self._fetch, self.landing, self._options = holdings, fetch, landing, options
        self.foresight = Foresight(holdings)
        self._looks_ahead = holdings.clairvoyant  # other stacks do not count reads for it
        # A copy is a plain job, a chunk id, that the copier runs with `Copies.copy`: nothing
        # on a copy thread calls back into this filler.
        self.copies = Copies(holdings, fetch, landing, self.foresight)
        tiers = bool(holdings.tiers)
        self.copier = Copier(
            self.copies.copy,
            options.threads if tiers else 0,  # named tierfeed-copy-<i>
            options.queue,
            failed=self.copies.failed,
            urgent_threads=options.urgent_copies if tiers else 0,
        )

    # --- the reads made and to come ------------------------------------------------------

    def schedule(self, chunk: int) -> bool:
        """Queue a whole-chunk copy into the tiers; False if present, queued, or queue full."""
        if not self._h.tiers or not self._fetch.origin.holds_whole(self._h.chunks[chunk].name):
            return False  # e.g. a namespace holding only some members of the chunk
        return self._queue(chunk)

    def _queue(self, chunk: int, urgent: bool = False) -> bool:
        """Queue the copy of ``chunk`` if a tier wants it (an urgent one moved ahead if it is
        queued already). A copy that lands between the question and the queueing is queued
        again and ends at once: `Copies.copy` asks again before it copies."""
        if not self.copier.pending(chunk) and not self.copies.needed(chunk):
            return False
        return self.copier.schedule(chunk, urgent)

    @property
    def copies_at_once(self) -> int:
        """How many copies start together: the copy threads and the urgent ones beside them."""
        return self._options.threads + self._options.urgent_copies if self._h.tiers else 0

    def seen(self, reads: int) -> None:
        """``reads`` reads were made: a clairvoyant stack prefetches when it is due."""
        if self._looks_ahead:
            horizon = self.foresight.due(self._fetch.tuner.rate, self.copier.inflight, reads)
            if horizon:
                self.prefetch(horizon)

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """Tell clairvoyant tiers every read's chunk to come (`Foresight.set_future`), and
        prefetch its start: at least the first chunks of twice as many as the copy threads,
        so that the host's other processes, whose copy threads find this one's copies claimed,
        start the next ones at once (a small chunk first read a little later is then not
        left to the read that misses it, after the large ones have landed)."""
        self.foresight.set_future(sequence, read_bytes)
        self.prefetch(self.foresight.opening(2 * self._options.threads))

    def set_reads(
        self, chunks: npt.ArrayLike, offsets: npt.ArrayLike, ends: npt.ArrayLike | None = None
    ) -> None:
        """This epoch's reads in the order they are consumed (`Foresight.set_reads`)."""
        self.foresight.set_reads(chunks, offsets, ends)

    def served_first(self, reads: int) -> None:
        """The first ``reads`` of that order are read apart (`Foresight.served_first`)."""
        self.foresight.served_first(reads)

    def prefetch(self, horizon: int = 64) -> int:
        """Queue the chunks of the next ``horizon`` reads that the clairvoyant tiers would
        take; returns how many."""
        if not self._looks_ahead:
            return 0
        chosen = self.foresight.chosen(self.copies.landing_here(), horizon)
        return sum(self.schedule(chunk) for chunk in chosen)

    # --- reads served by copies in flight ----------------------------------------------

    def read_landing(self, info: ChunkInfo, offset: int, length: int) -> bytes | None:
        """The range from the copy of the chunk in flight (any process of the host), once it
        has landed; None if no copy is or will be in flight, or its bytes do not land within
        the wait (then the caller reads the origin: that is the hedge).

        A chunk the tiers would take and that no process copies yet is copied now, ahead of
        the queue: the read waits for its piece rather than reading its bytes from the origin
        apart from the copy, so a cold epoch reads each byte of the origin once.
        """
        if not self._h.tiers or self._h.shuns(info.id):
            return None
        started = time.perf_counter()
        wait = self._landing_wait()
        arrival = self._arrival(info, offset, started + wait)
        if arrival is None:
            return None
        try:
            data = arrival.read(offset, length, max(0.0, wait - (time.perf_counter() - started)))
            if data is not None and not self._h.is_landed_whole(info.id) and arrival.complete():
                self._h.landed_whole(info.id)  # read as local until it is placed
        except OSError:
            data = None
        finally:
            arrival.close()
        waited = time.perf_counter() - started
        if data is None or len(data) != length:
            self._fetch.counters.add(gave_up=1, waited_s=waited)
            return None
        self._fetch.counters.add(served=1, served_bytes=length, waited_s=waited)
        return data

    def _landing_wait(self) -> float:
        """How long a read waits for its bytes of a copy in flight. A piece that takes longer
        than the set wait to land (an object store's GET at tens of MB/s) is waited for up to
        twice its time; where every request is slow or billed, as long as a copy may take:
        reading the range apart from the copy would only add requests and bytes."""
        wait = self._options.landing_wait_s
        if wait <= 0:  # 0: never wait (set so)
            return wait
        costly = self._fetch.origin.costly_requests
        longest = _WAIT_MAX_S if costly else 2 * self._fetch.tuner.piece_seconds()
        return max(wait, min(longest, _WAIT_MAX_S))

    def read_landed(
        self, info: ChunkInfo, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes] | None:
        """The ranges from the chunk's copy in flight, landed whole (no wait), with one open
        of it; None once it is over (placed, or failed)."""
        arrival = self.landing.find(info)
        served: list[bytes] = []
        if arrival is not None:
            try:
                for offset, length in zip(offsets, lengths, strict=True):
                    data = arrival.read(offset, length, 0.0)
                    if data is None or len(data) != length:
                        break
                    served.append(data)
            except OSError:
                pass
            finally:
                arrival.close()
        if arrival is None or len(served) != len(offsets):
            self._h.forget_landed(info.id)
            return None
        self._fetch.counters.add(served=len(served), served_bytes=sum(map(len, served)))
        return served

    def shun_landing(self, info: ChunkInfo) -> bool:
        """The chunk's copy in flight served bytes that failed their check: read the chunk
        from the origin from now on. False if no copy of it is in flight (or one was shunned
        already)."""
        h = self._h
        h.forget_landed(info.id)
        arrival = None if h.shuns(info.id) else self.landing.find(info)
        if arrival is None:
            return False
        arrival.close()
        h.shun(info.id)
        return True

    def _arrival(self, info: ChunkInfo, offset: int, deadline: float) -> Arrival | None:
        """The chunk's copy in flight; one is started (ahead of the queue) when a tier would
        take the chunk, and waited for until ``deadline`` (perf_counter) while it is queued
        here, or claimed by another process whose arrival appears once it has begun."""
        arrival = self.landing.find(info)
        if arrival is not None or not self._fetch.origin.holds_whole(info.name):
            return arrival
        self.copies.demand(info.id, offset)
        self._queue(info.id, urgent=True)
        pause = 0.001
        while time.perf_counter() < deadline:
            if not self.copier.pending(info.id) and not self.copies.awaited_elsewhere(info):
                return None
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
            arrival = self.landing.find(info)
            if arrival is not None:
                return arrival
        self.copies.forget_elsewhere(info.id)  # the next read asks for a copy anew
        return None

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until queued copies are done, at most ``timeout`` seconds.

        Raises:
            StorageError: they are not.
        """
        self.copier.drain(timeout)

    def close(self, wait_s: float | None = None) -> None:
        """Drop queued copies and join the copy threads (running copies finish), for at most
        ``wait_s`` seconds."""
        self.copier.close(wait_s)

    def join(self, wait_s: float) -> None:
        """Wait at most ``wait_s`` more seconds for the copy threads (after `close`)."""
        self.copier.join(wait_s)
