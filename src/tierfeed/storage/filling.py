"""How a chunk gets into the tiers: whether a tier wants it, where its bytes come from (a
tier that holds it, else the origin, verified), and its placement under each tier's policy.

`TierStack` (`tierfeed.storage.tiers`) orders the tiers and serves reads; this part of it runs
on the copy threads. Bookkeeping is under the stack's one lock, never held across I/O; a
placement into one tier is serialised by that tier's own lock (and, for a directory every
process of the host fills, its cross-process lock).
"""

from __future__ import annotations

import contextlib
import threading
import time
from abc import ABC, abstractmethod

from tierfeed.errors import ChunkCorruptError, NotFoundError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.storage.disktier import Tier, TierCounters, cache_key
from tierfeed.storage.driver import Driver
from tierfeed.storage.fetch import fetch_verified
from tierfeed.storage.placement import Placement

__all__ = ["TierFilling"]


class TierFilling(ABC):
    """The copy side of a tier stack (a base of `TierStack`, which provides what is declared
    here)."""

    chunks: list[ChunkInfo]
    origin: Driver
    tiers: list[Tier]
    policies: list[Placement]
    origin_counters: TierCounters
    _mutex: threading.Lock
    _corrupt: dict[int, str]
    _refused: set[int]
    _sizes: dict[int, int]

    @abstractmethod
    def _scan(self, tier: Tier) -> None:
        """Refresh what a shared tier holds."""

    @abstractmethod
    def _usable(self, tier: Tier, info: ChunkInfo) -> bool:
        """Whether the tier's copy of the chunk may be served (checked once per process)."""

    @abstractmethod
    def _warn(self, what: str, message: str) -> None:
        """Log the first failure of a kind."""

    def _needed(self, chunk: int) -> bool:
        """Whether a tier lacks ``chunk`` and its policy would take it (the copier asks once it
        marked the chunk in flight, so a copy landing meanwhile is seen and not repeated). A
        refusal is remembered until room is made or the future changes: a full tier is not
        asked again on every read."""
        size = self._sizes[chunk]
        with self._mutex:
            lacking = [(t, p) for t, p in zip(self.tiers, self.policies, strict=True)
                       if chunk not in t.held]  # fmt: skip
            if not lacking or chunk in self._refused:
                return False
            if any(p.choose(t.held, chunk, size, t.quota, fetched=True)[0] for t, p in lacking):
                return True
            self._refused.add(chunk)  # every tier that lacks it said no
            return False

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
        started = time.perf_counter()
        # Held by a lower tier (or landed from a sibling process): fill the others from it,
        # with no claim (a RAM tier is each process's own) and no origin read.
        data = self._from_tiers(info)
        if data is not None:
            self._place_all(info, data, started)
            return
        # One process of a host copies a chunk: it claims it in the first tier others fill.
        claims = next((t.files for t in self.tiers if t.shared), self.tiers[0].files)
        with claims.claim(cache_key(info)) as mine:
            if not mine:
                return  # another process copies it now; a later miss finds it landed
            # Another process (a sibling DataLoader worker) may have copied it already: take
            # it from the shared directory rather than from the origin.
            data = self._from_tiers(info)
            if data is None:
                try:
                    data = fetch_verified(self.origin, info)
                except ChunkCorruptError as exc:
                    with self._mutex:
                        self._corrupt[chunk] = f"chunk {info.name} at the origin is bad: {exc}"
                    return
                with self._mutex:
                    self.origin_counters.copies += 1
            self._place_all(info, data, started)

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

    def _place_all(self, info: ChunkInfo, data: bytes, started: float) -> None:
        # Inclusive: every tier that accepts the chunk keeps it, so a persistent disk tier
        # still holds it when the processes owning the RAM tiers are gone (DataLoader workers).
        for i, tier in enumerate(self.tiers):
            try:
                placed = self._place(i, tier, info, data)
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

    def _place(self, i: int, tier: Tier, info: ChunkInfo, data: bytes) -> bool:
        """Write the chunk into ``tier`` if its policy takes it; True if this call wrote it.

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
            tier.driver.write(cache_key(info), data)  # temporary name, then rename
            with self._mutex:
                tier.held[info.id] = info.size
                tier.verified.add(info.id)
            tier.files.mark(cache_key(info))  # checked before it was written
            return True
