"""How a chunk gets into the tiers: whether a tier wants it, where its bytes come from (a
tier that holds it, else the origin in parallel pieces that reads are served from as they land:
see `tierfeed.storage.landing`), and its placement under each tier's policy.

`TierStack` (`tierfeed.storage.tiers`) orders the tiers and serves reads; this part of it runs
on the copy threads, and serves the reads that find their chunk's copy in flight. Bookkeeping
is under the stack's one lock, never held across I/O; a placement into one tier is
serialised by that tier's own lock (and, for a directory every process of the host fills, its
cross-process lock).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ChunkCorruptError, NotFoundError, StorageError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.storage.copier import Copier, Gate
from tierfeed.storage.disktier import Tier, TierCounters, cache_key
from tierfeed.storage.driver import Driver
from tierfeed.storage.fetch import damaged_chunk, short_chunk
from tierfeed.storage.landing import Arrival, FetchCounters, Landing
from tierfeed.storage.piecefetch import PieceFetch, piece_order
from tierfeed.storage.placement import Placement
from tierfeed.storage.tuning import FetchTuner

if TYPE_CHECKING:
    from tierfeed.storage.tiers import TierOptions

__all__ = ["TierFilling"]

_WAIT_MAX_S = 5.0  # a read waits for its piece of a copy in flight at most this long
_SPLITS = 4  # pieces read as two halves for the fetch tuner's first fit, at most
# A process that claims a copy writes its arrival's map at once: a claim found taken more than
# this long ago is over (its copy placed, refused or failed), not about to begin.
_CLAIM_TO_MAP_S = 0.2
_VIEW_S = 0.1  # a placement decision looks at a shared tier again after this long
_HEDGE_SHARE = 0.02  # second requests for late pieces read at most this share of the copies' bytes


class _Landed:
    """A whole chunk, checked, on its way into the tiers: its bytes (read from where they
    landed at most once, and only for a tier that needs them), and the file they landed in,
    if any, which a disk tier can take as it is (`Driver.adopt`).

    The landed file is written by its fetcher only, and only before it is checked: a later
    fetch of the chunk writes new files, so the bytes read here are the bytes checked.
    """

    def __init__(self, data: bytes | None = None, arrival: Arrival | None = None) -> None:
        self._data, self._arrival = data, arrival

    def data(self) -> bytes:
        if self._data is None:
            assert self._arrival is not None  # one of the two is always given
            self._data = self._arrival.whole()
        return self._data

    def file(self) -> tuple[Path, int] | None:
        return None if self._arrival is None else self._arrival.landed_file()


class TierFilling(ABC):
    """The copy side of a tier stack (a base of `TierStack`, which provides what is declared
    here)."""

    chunks: Sequence[ChunkInfo]
    origin: Driver
    tiers: list[Tier]
    # Chunks whose copy in flight this process saw landed whole: read as local (whole batches
    # at once, no wait) until placed. A set: membership and updates are atomic.
    _complete: set[int]
    policies: list[Placement]
    origin_counters: TierCounters
    _mutex: threading.Lock
    _corrupt: dict[int, str]
    _refused: set[int]
    _sizes: Mapping[int, int]
    _fetches: ThreadPoolExecutor
    _hedges: ThreadPoolExecutor
    _hedged_bytes: int
    _begun_bytes: int
    _hedge_origin: Driver
    landing: Landing
    fetch_counters: FetchCounters
    options: TierOptions
    _shunned: set[int]
    _demanded: dict[int, int]
    _elsewhere: dict[int, float]
    _splits: int
    _landing_seen: set[int]  # what `_landing_here` found landing last time
    _gate: Gate
    tuner: FetchTuner
    _copier: Copier

    @abstractmethod
    def _scan(self, tier: Tier) -> None:
        """Refresh what a shared tier holds."""

    @abstractmethod
    def _usable(self, tier: Tier, info: ChunkInfo) -> bool:
        """Whether the tier's copy of the chunk may be served (checked once per process)."""

    @abstractmethod
    def _warn(self, what: str, message: str) -> None:
        """Log the first failure of a kind."""

    @abstractmethod
    def _reads_of(
        self, chunk: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Where in the epoch's order of consumption each read of ``chunk`` comes, and the
        byte range it reads, start and end (empty when not told)."""

    def _shares_room(self) -> bool:
        """Whether a tier's room is shared with the host's other processes."""
        return any(t.shared for t in self.tiers)

    def _needed(self, chunk: int, fresh: bool = False) -> bool:
        """Whether a tier lacks ``chunk`` and its policy would take it (the copier asks once it
        marked the chunk in flight, so a copy landing meanwhile is seen and not repeated). A
        refusal is remembered until room is made or the future changes: a full tier is not
        asked again on every read."""
        size = self._sizes[chunk]
        with self._mutex:  # asked on every read of a chunk no tier holds: the cheap answers
            if chunk in self._refused or all(chunk in t.held for t in self.tiers):
                return False
        landing = self._landing_here(fresh)  # outside the lock: a directory listing
        with self._mutex:
            lacking = [(t, p) for t, p in zip(self.tiers, self.policies, strict=True)
                       if chunk not in t.held]  # fmt: skip
            if not lacking or chunk in self._refused:
                return False
            if any(
                p.choose(self._committed(t, landing, chunk), chunk, size, t.quota, fetched=True)[0]
                for t, p in lacking
            ):
                return True
            self._refused.add(chunk)  # every tier that lacks it said no
            return False

    def _landing_here(self, fresh: bool = False) -> set[int]:
        """This store's chunks whose copies land on this host now (any process's): the
        room they will take. A shared tier's view of what it holds is refreshed when a copy
        seen landing before has ended (placed, most likely: in the directory now, and no
        longer landing), the view is older than `_VIEW_S`, or ``fresh`` (the last look before
        a copy begins)."""
        landing = {
            c for c, checksum in self.landing.in_flight()
            if 0 <= c < len(self.chunks) and self.chunks[c].checksum == checksum
        }  # fmt: skip
        with self._mutex:
            ended = bool(self._landing_seen - landing)
            self._landing_seen = landing
        for tier in self.tiers:
            if tier.shared and (fresh or ended or time.monotonic() - tier.scanned > _VIEW_S):
                with contextlib.suppress(StorageError):
                    self._scan(tier)
        return landing

    def _committed(self, tier: Tier, landing: set[int], chunk: int) -> dict[int, int]:
        """What a placement decision for ``chunk`` counts as taken in ``tier`` (under
        `_mutex`): what it holds and, in a tier the host's processes share, the copies
        landing for it. Deciding on what was held alone, each of two DataLoader workers saw
        room for the same bytes: both copied, and chunks were evicted before their reads
        came (the origin bytes it cost: docs/BENCHMARKS.md)."""
        if not tier.shared:
            return tier.held
        view = dict(tier.held)
        for c in landing - {chunk} - view.keys():
            view[c] = self._sizes[c]
        return view

    # --- reads served by copies in flight ----------------------------------------------

    def _from_arrival(self, info: ChunkInfo, offset: int, length: int) -> bytes | None:
        """The range from the copy of the chunk in flight (any process of the host), once it
        has landed; None if no copy is or will be in flight, or its bytes do not land within
        ``landing_wait_s`` (then the caller reads the origin: that is the hedge).

        A chunk the tiers would take and that no process copies yet is copied now, ahead of
        the prefetch queue (beside the copy threads when they are all busy: `Copier`'s
        ``urgent_threads``): the read waits for its piece rather than reading its bytes from
        the origin apart from the copy, so a cold epoch reads each byte of the origin once.
        """
        if not self.tiers or info.id in self._shunned:
            return None
        started = time.perf_counter()
        # A piece that takes longer than the set wait to land (an object store's GET at tens
        # of MB/s) is waited for up to twice its time: reading the range apart from the copy
        # would only add requests and bytes (late reads are the guard's to defer).
        wait = self.options.landing_wait_s
        if wait > 0:  # 0: never wait (set so)
            # An origin whose every request is slow or billed (an object store): wait for the
            # copy as long as it may take, rather than make a request of one's own beside it.
            longest = _WAIT_MAX_S if self.origin.costly_requests else 2 * self.tuner.piece_seconds()
            wait = max(wait, min(longest, _WAIT_MAX_S))
        arrival = self._arrival(info, offset, started + wait)
        if arrival is None:
            return None
        try:
            left = wait - (time.perf_counter() - started)
            data = arrival.read(offset, length, max(0.0, left))
            if data is not None and info.id not in self._complete and arrival.complete():
                self._complete.add(info.id)  # read as local until it is placed
        except OSError:
            data = None
        finally:
            arrival.close()
        waited = time.perf_counter() - started
        if data is None or len(data) != length:
            self.fetch_counters.add(gave_up=1, waited_s=waited)
            return None
        self.fetch_counters.add(served=1, served_bytes=length, waited_s=waited)
        return data

    def _from_complete(
        self, info: ChunkInfo, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes] | None:
        """The ranges from the chunk's copy in flight, which has landed whole (no wait), with
        one open of it; None once it is over (placed, or failed: the caller reads the tiers,
        else as for any miss)."""
        arrival = self.landing.find(info)
        if arrival is None:
            self._complete.discard(info.id)
            return None
        served: list[bytes] = []
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
        if len(served) != len(offsets):
            self._complete.discard(info.id)
            return None
        self.fetch_counters.add(served=len(served), served_bytes=sum(map(len, served)))
        return served

    def _arrival(self, info: ChunkInfo, offset: int, deadline: float) -> Arrival | None:
        """The chunk's copy in flight; one is started (ahead of the queue) when a tier would
        take the chunk, and waited for until ``deadline`` (perf_counter) while it is queued."""
        arrival = self.landing.find(info)
        if arrival is not None or not self.origin.holds_whole(info.name):
            return arrival
        self._demanded.setdefault(info.id, offset)
        self._copier.schedule(info.id, urgent=True)
        pause = 0.001
        # Queued in this process; or claimed by another, whose arrival appears once that
        # process has begun it (between its claim and its map, this one's copy found the claim
        # taken and ended: the arrival is still awaited, unless the chunk lands meanwhile).
        while time.perf_counter() < deadline:
            if not self._copier.pending(info.id) and not self._awaited_elsewhere(info):
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
        if time.monotonic() - found > _CLAIM_TO_MAP_S or self._appeared(info):
            self._elsewhere.pop(info.id, None)
            return False
        return True

    def _appeared(self, info: ChunkInfo) -> bool:
        """Whether a shared tier that this process thinks lacks the chunk has it now (a copy
        by another process lands, and its arrival ends, between two looks)."""
        for tier in self.tiers:
            if info.id in tier.held:
                return True
            if tier.shared:
                with contextlib.suppress(StorageError):
                    if tier.files.has(cache_key(info)):
                        with self._mutex:
                            tier.held[info.id] = info.size
                        return True
        return False

    def _origin_read(
        self,
        info: ChunkInfo,
        offset: int,
        length: int,
        gated: bool = True,
        begun: Callable[[], None] | None = None,
        origin: Driver | None = None,
        block: bool = False,
    ) -> bytes:
        """One request to the origin (through ``origin``, by default the stack's), timed for
        the tuner; ``gated`` (a copy's piece): within the tuner's budget of requests in
        flight; ``begun`` is told when it starts; ``block``: a piece of a copy, read past the
        page cache where the origin can (`Driver.read_block`).

        Raises:
            ChunkCorruptError: the origin returned fewer bytes than the index says are there.
        """
        with self._gate.held(self.tuner.inflight) if gated else contextlib.nullcontext():
            if begun is not None:
                begun()
            started = time.perf_counter()
            way = origin or self.origin
            data = (way.read_block if block else way.read_range)(info.name, offset, length)
            took = time.perf_counter() - started
        self.tuner.observe(len(data), took, time.monotonic(), piece=begun is not None)
        if len(data) != length:
            raise short_chunk(info, self.origin.name, offset, length)
        return data

    # --- copies ---------------------------------------------------------------------------

    def _copy_failed(self, chunk: int, exc: Exception) -> None:
        """A copy raised: the read path still serves from the origin; count it, log it once."""
        with self._mutex:
            self.origin_counters.copy_failures += 1
        name = self.chunks[chunk].name
        self._warn("copy", f"copy of chunk {name} from the origin failed: {exc!r}")

    def _copy(self, chunk: int) -> None:
        if not self._needed(chunk):
            return  # queued while a tier had room; the copies landed since filled it
        info = self.chunks[chunk]
        if self._appeared(info) and not self._needed(chunk):
            return  # another process of the host placed it meanwhile: nothing to read again
        started = time.perf_counter()
        # Held by a lower tier (or landed from a sibling process): fill the others from it,
        # with no claim (a RAM tier is each process's own) and no origin read.
        data = self._from_tiers(info)
        if data is not None:
            self._place_all(info, _Landed(data), started)
            return
        # One process of a host copies a chunk: it claims it in the first tier others fill.
        claims = next((t.files for t in self.tiers if t.shared), self.tiers[0].files)
        with claims.claim(cache_key(info)) as mine:
            if not mine:
                self._elsewhere[chunk] = time.monotonic()  # another process copies it now
                return
            self._elsewhere.pop(chunk, None)
            # Another process (a sibling DataLoader worker) may have copied it already: take
            # it from the shared directory rather than from the origin.
            data = self._from_tiers(info)
            if data is not None:
                self._place_all(info, _Landed(data), started)
                return
            # Decided again and begun under the tier's placement lock: a sibling deciding at
            # the same moment sees this copy landing (its room taken), and this one sees its.
            with claims.placing():
                if self._shares_room() and not self._needed(chunk, fresh=True):
                    return
                try:
                    arrival = self.landing.begin(info, self.tuner.piece)
                except OSError as exc:
                    self._landing_failed(info, exc)
                    return
            with self._mutex:
                self._begun_bytes += info.size
            try:
                landed = self._fetch(arrival)
                with self._mutex:
                    self.origin_counters.copies += 1
                self._place_all(info, landed, started)
            except ChunkCorruptError as exc:
                with self._mutex:
                    self._corrupt[chunk] = f"chunk {info.name} at the origin is bad: {exc}"
            except OSError as exc:
                if isinstance(exc, StorageError):
                    raise  # the origin's: a failed copy
                self._landing_failed(info, exc)
            finally:
                self.landing.end(arrival)  # after placing: readers go from one to the other

    def _landing_failed(self, info: ChunkInfo, exc: OSError) -> None:
        """The chunk could not land where copies land (the disk tier's directory: full, gone):
        counted as that tier's failure to keep it; reads go on from the origin."""
        tier = next((t for t in self.tiers if t.shared), None)
        if tier is None:  # landing in memory: not a disk's failure
            raise exc
        with self._mutex:
            tier.counters.copy_failures += 1
        self._warn(f"place:{tier.name}", f"cannot keep chunk {info.name} in {tier.name}: {exc}")

    def _fetch(self, arrival: Arrival) -> _Landed:
        """Every piece of ``arrival``'s chunk from the origin, in parallel on the fetch
        threads and in order of offset; the whole chunk, checked against the index (where it
        landed: its bytes are read again only for a tier that cannot take the file).

        Raises:
            ChunkCorruptError: the origin's copy is shorter than the index says, or its
                checksum differs.
            StorageError: the origin could not be read.
        """
        # A hedge's way to the chunk is opened now, while no request of it stalls: on FUSE an
        # open waits for the pages a stalled read holds (and on NFS an open may hang itself).
        if self._hedge_origin is not self.origin:
            self._hedge_origin.open_ahead([arrival.info.name])
        # The piece a read waits for first (it asked for this copy), then in the order the
        # plan reads them (told by `set_reads`), else in offset order.
        demanded = self._demanded.pop(arrival.info.id, None)
        first = None if demanded is None else demanded // arrival.piece
        positions, offsets, ends = self._reads_of(arrival.info.id)
        pieces = PieceFetch(
            arrival,
            lambda index, begun, hedge: self._read_piece(arrival, index, begun, hedge),
            self._fetches,
            self._hedges,
            self.tuner.late_after,
            self._may_hedge,
            self.fetch_counters,
            self._gate.set_aside,
        )
        pieces.run(
            piece_order(positions, offsets, arrival.piece, arrival.pieces, first, ends),
            self.tuner.limits.max_inflight,
        )
        info = arrival.info
        size, checksum = arrival.digest()
        if size != info.size or checksum != info.checksum:
            raise damaged_chunk(info, self.origin.name, size)
        return _Landed(arrival=arrival)

    def _read_piece(
        self, arrival: Arrival, index: int, begun: Callable[[], None], hedge: bool
    ) -> bytes:
        """Piece ``index`` of ``arrival``'s chunk from the origin (its first request's start
        told to ``begun``); every byte is counted, a hedge's too. A ``hedge`` (a second
        request for a late piece) goes through the hedges' own way to the origin and past the
        limit on requests in flight, so that it does not queue behind the requests of other
        pieces."""
        offset, length = arrival.span(index)
        # Until the tuner can tell latency from bandwidth, a few pieces are read as two halves:
        # requests of two sizes are what the fit needs. A few: all of a chunk's pieces may
        # start before the first ends, and each split is one request more. None from a store
        # that bills requests: there the fit takes the sizes that occur (each chunk's shorter
        # last piece, sample reads).
        splits = 0 if self.origin.costly_requests else _SPLITS
        halves = 1
        if self.tuner.fitted is None and index % 2 and length > 1 and self._splits < splits:
            self._splits += 1
            halves = 2
        cut = [offset + length * k // halves for k in range(halves + 1)]
        origin = self._hedge_origin if hedge else self.origin
        parts = [
            self._origin_read(arrival.info, a, b - a, not hedge, begun, origin, block=True)
            for a, b in itertools.pairwise(cut)
        ]
        with self._mutex:
            self.origin_counters.bytes += length  # every byte the origin gave, copies too
        return parts[0] if halves == 1 else b"".join(parts)

    def _may_hedge(self, nbytes: int) -> bool:
        """Whether a second request of ``nbytes`` for a late piece fits the budget: hedges
        read at most `_HEDGE_SHARE` of the bytes of the copies begun."""
        with self._mutex:
            if self._hedged_bytes + nbytes > _HEDGE_SHARE * self._begun_bytes:
                return False
            self._hedged_bytes += nbytes
            return True

    def _from_tiers(self, info: ChunkInfo) -> bytes | None:
        """The whole chunk from a tier that holds it (a shared one rescanned first: another
        process may have filled it), checked; None if none does."""
        for tier in self.tiers:
            if tier.shared:
                self._scan(tier)
            with self._mutex:
                held = info.id in tier.held
            if held and self._usable(tier, info):
                with contextlib.suppress(NotFoundError):
                    data = tier.driver.read(cache_key(info))
                    # Checked again whatever the marks say: it is about to be copied on.
                    if len(data) == info.size and checksum_bytes(data) == info.checksum:
                        return data
        return None

    def _place_all(self, info: ChunkInfo, chunk: _Landed, started: float) -> None:
        # Inclusive: every tier that accepts the chunk keeps it, so a persistent disk tier
        # still holds it when the processes owning the RAM tiers are gone (DataLoader workers).
        for i, tier in enumerate(self.tiers):
            try:
                placed = self._place(i, tier, info, chunk)
            except Exception as exc:  # a full disk, a vanished directory: the others go on
                with self._mutex:
                    tier.counters.copy_failures += 1
                self._warn(
                    f"place:{tier.name}", f"cannot keep chunk {info.name} in {tier.name}: {exc}"
                )
                continue
            if placed:
                with self._mutex:
                    tier.counters.copies += 1
                    tier.counters.copy_s += time.perf_counter() - started

    def _place(self, i: int, tier: Tier, info: ChunkInfo, chunk: _Landed) -> bool:
        """Put the chunk into ``tier`` if its policy takes it; True if this call put it. A disk
        tier on the file system the chunk landed on links the landed file in (no second write
        of its bytes); any other tier is written its bytes.

        One placement per tier at a time (its ``placing`` lock, and for a shared directory the
        cross-process lock): the decision and the writes it implies cannot interleave with
        another's, so the quota holds.
        """
        with tier.placing, tier.files.placing():
            if tier.shared:
                self._scan(tier)  # other processes' copies and evictions count too
            with self._mutex:
                if info.id in tier.held:
                    return False  # another process wrote it
                ok, victims = self.policies[i].choose(
                    tier.held, info.id, info.size, tier.quota, fetched=True
                )
                if not ok:
                    return False
                for victim in victims:
                    tier.held.pop(victim, None)
                    tier.verified.discard(victim)
                    tier.counters.evictions += 1
                self._refused.clear()  # room made, or a chunk placed: ask again
            for victim in victims:
                tier.files.evict(cache_key(self.chunks[victim]))
            key = cache_key(info)
            landed = chunk.file()  # temporary name, then rename, either way
            if landed is not None:
                # Checked whole where it landed: marked before it appears at its key, so that
                # no process's read finds it unmarked and reads all of it to check it again.
                tier.files.mark(key, landed[1])
            if landed is None or not tier.driver.adopt(key, *landed):
                tier.driver.write(key, chunk.data())
                tier.files.mark(key)  # checked before it was written
            with self._mutex:
                tier.held[info.id] = info.size
                tier.verified.add(info.id)
            return True
