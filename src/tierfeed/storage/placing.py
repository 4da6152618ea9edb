"""A copy of a chunk into a stack's tiers, run on a copy thread: whether a tier wants it, from
where (a tier holding it, else the origin, by the host's one process that claims it), its
arrival, its check, and its placement into each tier whose policy takes it (`Copies`)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from tierfeed.errors import ChunkCorruptError, StorageError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.disktier import Tier, cache_key
from tierfeed.storage.foresight import Foresight
from tierfeed.storage.holdings import Holdings
from tierfeed.storage.landing import Arrival, Landing
from tierfeed.storage.originfetch import OriginFetch
from tierfeed.storage.piecefetch import spread_piece

__all__ = ["Copies", "Landed"]

# A process that claims a copy writes its arrival's map at once: a claim found taken more than
# this long ago is over (its copy placed, refused or failed), not about to begin.
_CLAIM_TO_MAP_S = 0.2
_VIEW_S = 0.1  # a placement decision looks at a shared tier again after this long


class Landed:
    """A whole chunk, checked, on its way into the tiers: its bytes (read from where they
    landed at most once, and only for a tier that needs them), and the file they landed in,
    if any, which a disk tier can take as it is (`Driver.adopt`). The landed file is written
    by its fetcher only, and only before it is checked: the bytes read here are those checked.
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


class Copies:
    """What one copy of a chunk into a stack's tiers does, run by the `Copier`'s threads
    (`copy`), and whether one is wanted (`needed`): from a tier that holds the chunk, else
    from the origin (`OriginFetch.fetch`) by the one process of the host that claims it,
    through an `Arrival`, checked, then placed into every tier whose policy takes it
    (`place_all`, evicting as the policies choose). Handed a chunk id, it calls nothing back.

    Args:
        holdings: the tiers and their bookkeeping.
        fetch: the origin's requests.
        landing: where copies land while in flight.
        foresight: the reads to come (the order of a copy's pieces, their size).
    """

    def __init__(
        self, holdings: Holdings, fetch: OriginFetch, landing: Landing, foresight: Foresight
    ) -> None:
        self._h, self._fetch, self.landing, self._foresight = holdings, fetch, landing, foresight
        self._demanded: dict[int, int] = {}  # chunk -> offset a read waits for in its copy
        self._elsewhere: dict[int, float] = {}  # chunk -> when its claim was found taken
        self._landing_seen: set[int] = set()  # what `landing_here` found landing last time

    # --- whether a copy is wanted ---------------------------------------------------------

    def needed(self, chunk: int, fresh: bool = False) -> bool:
        """Whether a tier lacks ``chunk`` and its policy would take it (the copier asks once it
        marked the chunk in flight, so a copy landing meanwhile is seen and not repeated). A
        refusal is remembered until room is made or the future changes."""
        if self._h.settled(chunk):
            return False
        return self._h.wanted(chunk, self.landing_here(fresh))  # a listing: outside the lock

    def landing_here(self, fresh: bool = False) -> set[int]:
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

    def demand(self, chunk: int, offset: int) -> None:
        """A read waits for ``offset`` of the chunk: its copy fetches that piece first."""
        self._demanded.setdefault(chunk, offset)

    def awaited_elsewhere(self, info: ChunkInfo) -> bool:
        """Whether another process claimed the chunk's copy just now (its arrival is about to
        appear) and the chunk has not landed."""
        found = self._elsewhere.get(info.id)
        if found is None:
            return False
        if time.monotonic() - found > _CLAIM_TO_MAP_S or self._h.appeared(info):
            self._elsewhere.pop(info.id, None)
            return False
        return True

    def forget_elsewhere(self, chunk: int) -> None:
        """The next read asks for a copy (and a claim) of ``chunk`` anew."""
        self._elsewhere.pop(chunk, None)

    # --- one copy -------------------------------------------------------------------------

    def copy(self, chunk: int) -> None:
        """Copy ``chunk`` into the tiers that want it: from a tier that holds it, else from
        the origin, by the one process of the host that claims it."""
        h = self._h
        info = h.chunks[chunk]
        h.appeared(info)  # a tier another process filled meanwhile: seen before deciding
        # Asked when queued, here, and over a shared tier under its placement lock (`_begin`).
        # Queued is not wanted: a copy waits while others fill the tiers, and one no tier
        # takes now must not read a lower tier's copy whole or take a claim. Nor is this the
        # last word over a shared tier: only under the host's common lock, with a fresh look,
        # are the other processes' copies landing seen.
        if not self.needed(chunk):
            return  # filled meanwhile (by this process's copies or another's), or refused
        started = time.perf_counter()
        data = h.whole(info)  # held by a lower tier, or landed from a sibling process
        if data is not None:
            self.place_all(info, Landed(data), started)
            return
        home = h.shared or h.tiers[0]  # where copies are claimed and land
        with home.files.claim(cache_key(info)) as mine:
            if not mine:
                self._elsewhere[chunk] = time.monotonic()  # another process copies it now
                return
            self._elsewhere.pop(chunk, None)
            data = h.whole(info)  # a sibling DataLoader worker may have copied it already
            if data is not None:
                self.place_all(info, Landed(data), started)
                return
            arrival = self._begin(info, home)
            if arrival is not None:
                self._land(arrival, started)

    def _begin(self, info: ChunkInfo, home: Tier) -> Arrival | None:
        """The chunk's arrival, decided again and begun under the tier's placement lock
        (`Holdings.host_lock`): a sibling deciding at the same moment sees this copy landing
        (its room taken)."""
        try:
            with self._h.host_lock(home):  # bounded: past it, a TimeoutError (an OSError)
                if self._h.shared is not None and not self.needed(info.id, fresh=True):
                    return None
                return self.landing.begin(info, self.piece(info))
        except OSError as exc:
            self._landing_failed(info, exc)
            return None

    def piece(self, info: ChunkInfo) -> int:
        """The piece size of the chunk's copy: the tuner's, or less where the plan's reads of
        the chunk are spread (`spread_piece`)."""
        tuner = self._fetch.tuner
        reads = self._foresight.reads_of(info.id)
        return spread_piece(tuner.piece, tuner.limits.min_piece, *reads)

    def _land(self, arrival: Arrival, started: float) -> None:
        """Fetch the arrival's pieces from the origin, check the chunk, place it."""
        info = arrival.info
        demanded = self._demanded.pop(info.id, None)
        first = None if demanded is None else demanded // arrival.piece
        try:
            self._fetch.fetch(arrival, self._foresight.reads_of(info.id), first)
            self._fetch.origin_counters.add(copies=1)
            self.place_all(info, Landed(arrival=arrival), started)
        except ChunkCorruptError as exc:
            self._h.mark_corrupt(info.id, f"chunk {info.name} at the origin is bad: {exc}")
        except OSError as exc:
            if isinstance(exc, StorageError):
                raise  # the origin's: a failed copy
            self._landing_failed(info, exc)
        finally:
            self.landing.end(arrival)  # after placing: readers go from one to the other

    def failed(self, chunk: int, exc: Exception) -> None:
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
        self._place_failed(tier, info, exc)

    # --- placement -------------------------------------------------------------------------

    def place_all(self, info: ChunkInfo, chunk: Landed, started: float) -> None:
        """Inclusive: every tier that accepts the chunk keeps it, so a persistent disk tier
        still holds it when the processes owning the RAM tiers are gone."""
        for i, tier in enumerate(self._h.tiers):
            try:
                placed = self._place(i, tier, info, chunk)
            except Exception as exc:  # a full disk, a vanished directory: the others go on
                self._place_failed(tier, info, exc)
                continue
            if placed:
                with self._h.mutex:
                    tier.counters.copies += 1
                    tier.counters.copy_s += time.perf_counter() - started

    def _place(self, i: int, tier: Tier, info: ChunkInfo, chunk: Landed) -> bool:
        """Put the chunk into ``tier`` if its policy takes it; True if this call put it. One
        placement per tier at a time (its ``placing`` lock, and for a shared directory the
        cross-process lock where room is short: `Holdings.host_lock`): the decision and its
        writes cannot interleave with another's, so the quota holds."""
        h = self._h
        with tier.placing, h.host_lock(tier):
            if tier.shared:
                h.scan(tier)  # other processes' copies and evictions count too
            victims = h.make_room(i, info)
            if victims is None:
                return False
            for victim in victims:
                tier.files.evict(cache_key(h.chunks[victim]))
            self._write(tier, info, chunk)
            h.placed(tier, info)
            return True

    @staticmethod
    def _write(tier: Tier, info: ChunkInfo, chunk: Landed) -> None:
        """A disk tier on the file system the chunk landed on links the landed file in (no
        second write of its bytes); any other tier is written its bytes. Either way under a
        temporary name, then renamed."""
        key = cache_key(info)
        landed = chunk.file()
        if landed is not None:
            # Checked whole where it landed: marked before it appears at its key, so that no
            # process's read finds it unmarked and reads all of it to check it again.
            tier.files.mark(key, landed[1])
        if landed is None or not tier.driver.adopt(key, *landed):
            tier.driver.write(key, chunk.data())
            tier.files.mark(key)  # checked before it was written

    def _place_failed(self, tier: Tier, info: ChunkInfo, exc: Exception) -> None:
        """Count and log (once) that ``tier`` could not keep the chunk."""
        with self._h.mutex:
            tier.counters.copy_failures += 1
        self._h.warn(f"place:{tier.name}", f"cannot keep chunk {info.name} in {tier.name}: {exc}")
