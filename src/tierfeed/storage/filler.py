"""How chunks get into a stack's tiers, and the reads served by copies in flight.

A `Filler` owns the copy threads (`Copier`), the copies' requests to the origin
(`OriginFetch`), where copies land (`Landing`: a disk tier's directory, shared by the host's
processes, else memory), their placement under each tier's policy, and the look-ahead. Its
contract to the tier stack (`tierfeed.storage.tiers`), which serves reads:

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

import contextlib
import time
from collections.abc import Sequence

import numpy.typing as npt

from tierfeed.errors import ChunkCorruptError, StorageError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.copier import Copier
from tierfeed.storage.disktier import TierFiles, cache_key
from tierfeed.storage.foresight import Foresight
from tierfeed.storage.holdings import Holdings
from tierfeed.storage.landing import Arrival, Landing
from tierfeed.storage.originfetch import OriginFetch
from tierfeed.storage.piecefetch import spread_piece
from tierfeed.storage.placing import Landed, Placer
from tierfeed.storage.tieroptions import TierOptions

__all__ = ["Filler"]

_WAIT_MAX_S = 5.0  # a read waits for its piece of a copy in flight at most this long
# A process that claims a copy writes its arrival's map at once: a claim found taken more than
# this long ago is over (its copy placed, refused or failed), not about to begin.
_CLAIM_TO_MAP_S = 0.2
_VIEW_S = 0.1  # a placement decision looks at a shared tier again after this long


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
        self._placer = Placer(holdings)
        self._demanded: dict[int, int] = {}  # chunk -> offset a read waits for in its copy
        self._elsewhere: dict[int, float] = {}  # chunk -> when its claim was found taken
        self._landing_seen: set[int] = set()  # what `_landing_here` found landing last time
        self._looks_ahead = holdings.clairvoyant  # other stacks do not count reads for it
        copies = bool(holdings.tiers)
        self.copier = Copier(
            self._copy,
            options.threads if copies else 0,  # named tierfeed-copy-<i>
            options.queue,
            failed=self._copy_failed,
            urgent_threads=options.urgent_copies if copies else 0,
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
        again and ends at once: `_copy` asks again before it copies."""
        if not self.copier.pending(chunk) and not self._needed(chunk):
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
        chosen = self.foresight.chosen(self._landing_here(), horizon)
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
        self._demanded.setdefault(info.id, offset)
        self._queue(info.id, urgent=True)
        pause = 0.001
        while time.perf_counter() < deadline:
            if not self.copier.pending(info.id) and not self._awaited_elsewhere(info):
                return None
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
            arrival = self.landing.find(info)
            if arrival is not None:
                return arrival
        self._elsewhere.pop(info.id, None)  # the next read asks for a copy (and a claim) anew
        return None

    def _awaited_elsewhere(self, info: ChunkInfo) -> bool:
        """Whether another process claimed the chunk's copy just now (its arrival is about to
        appear) and the chunk has not landed."""
        found = self._elsewhere.get(info.id)
        if found is None:
            return False
        if time.monotonic() - found > _CLAIM_TO_MAP_S or self._h.appeared(info):
            self._elsewhere.pop(info.id, None)
            return False
        return True

    # --- whether a copy is wanted ---------------------------------------------------------

    def _needed(self, chunk: int, fresh: bool = False) -> bool:
        """Whether a tier lacks ``chunk`` and its policy would take it (the copier asks once it
        marked the chunk in flight, so a copy landing meanwhile is seen and not repeated). A
        refusal is remembered until room is made or the future changes."""
        if self._h.settled(chunk):
            return False
        return self._h.wanted(chunk, self._landing_here(fresh))  # a listing: outside the lock

    def _landing_here(self, fresh: bool = False) -> set[int]:
        """This store's chunks whose copies land on this host now (any process's): the room
        they will take. A shared tier's view is looked at again when a copy seen landing
        before has ended (placed, most likely), the view is older than `_VIEW_S`, or ``fresh``
        (the last look before a copy begins)."""
        chunks = self._h.chunks
        landing = {
            c
            for c, checksum in self.landing.in_flight()
            if 0 <= c < len(chunks) and chunks[c].checksum == checksum
        }
        with self._h.mutex:
            ended = bool(self._landing_seen - landing)
            self._landing_seen = landing
        for tier in self._h.tiers:
            if tier.shared and (fresh or ended or time.monotonic() - tier.scanned > _VIEW_S):
                with contextlib.suppress(StorageError):
                    self._h.scan(tier)
        return landing

    # --- copies ---------------------------------------------------------------------------

    def _copy(self, chunk: int) -> None:
        """Copy ``chunk`` into the tiers that want it: from a tier that holds it, else from
        the origin, by the one process of the host that claims it."""
        h = self._h
        info = h.chunks[chunk]
        h.appeared(info)  # a tier another process filled meanwhile: seen before deciding
        if not self._needed(chunk):
            return  # filled meanwhile (by this process's copies or another's)
        started = time.perf_counter()
        data = h.whole(info)  # held by a lower tier, or landed from a sibling process
        if data is not None:
            self._placer.place_all(info, Landed(data), started)
            return
        claims = (h.shared or h.tiers[0]).files
        with claims.claim(cache_key(info)) as mine:
            if not mine:
                self._elsewhere[chunk] = time.monotonic()  # another process copies it now
                return
            self._elsewhere.pop(chunk, None)
            data = h.whole(info)  # a sibling DataLoader worker may have copied it already
            if data is not None:
                self._placer.place_all(info, Landed(data), started)
                return
            arrival = self._begin(info, claims)
            if arrival is not None:
                self._land(arrival, started)

    def _begin(self, info: ChunkInfo, claims: TierFiles) -> Arrival | None:
        """The chunk's arrival, decided again and begun under the tier's placement lock: a
        sibling deciding at the same moment sees this copy landing (its room taken)."""
        try:
            with claims.placing():  # bounded: past it, a TimeoutError (an OSError)
                if self._h.shared is not None and not self._needed(info.id, fresh=True):
                    return None
                return self.landing.begin(info, self._piece(info))
        except OSError as exc:
            self._landing_failed(info, exc)
            return None

    def _piece(self, info: ChunkInfo) -> int:
        """The piece size of the chunk's copy: the tuner's, or less where the plan's reads of
        the chunk are spread (`spread_piece`)."""
        tuner = self._fetch.tuner
        return spread_piece(tuner.piece, tuner.limits.min_piece, *self.foresight.reads_of(info.id))

    def _land(self, arrival: Arrival, started: float) -> None:
        """Fetch the arrival's pieces from the origin, check the chunk, place it."""
        info = arrival.info
        demanded = self._demanded.pop(info.id, None)
        first = None if demanded is None else demanded // arrival.piece
        try:
            self._fetch.fetch(arrival, self.foresight.reads_of(info.id), first)
            self._fetch.origin_counters.add(copies=1)
            self._placer.place_all(info, Landed(arrival=arrival), started)
        except ChunkCorruptError as exc:
            self._h.mark_corrupt(info.id, f"chunk {info.name} at the origin is bad: {exc}")
        except OSError as exc:
            if isinstance(exc, StorageError):
                raise  # the origin's: a failed copy
            self._landing_failed(info, exc)
        finally:
            self.landing.end(arrival)  # after placing: readers go from one to the other

    def _copy_failed(self, chunk: int, exc: Exception) -> None:
        """A copy raised: the read path still serves from the origin; count it, log it once
        (not one stopped by the close of its stack)."""
        if self._fetch.stopped:
            return
        self._fetch.origin_counters.add(copy_failures=1)
        name = self._h.chunks[chunk].name
        self._h.warn("copy", f"copy of chunk {name} from the origin failed: {exc!r}")

    def _landing_failed(self, info: ChunkInfo, exc: OSError) -> None:
        """The chunk could not land where copies land (the disk tier's directory: full, gone,
        or held by another process past the lock's bound): counted as that tier's failure to
        keep it; reads go on from the origin (after a held lock, without waiting again)."""
        tier = self._h.shared
        if tier is None:  # landing in memory: not a disk's failure
            raise exc
        if isinstance(exc, TimeoutError):  # another process holds the tier: don't wait again
            self._h.shun(info.id)
        self._placer.failed(tier, info, exc)

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
