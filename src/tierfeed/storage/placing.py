"""Placement: a whole, checked chunk put into each tier whose policy takes it."""

from __future__ import annotations

import time
from pathlib import Path

from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.disktier import Tier, cache_key
from tierfeed.storage.holdings import Holdings
from tierfeed.storage.landing import Arrival

__all__ = ["Landed", "Placer"]


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


class Placer:
    """Places chunks into the tiers of ``holdings`` (evicting as their policies choose)."""

    def __init__(self, holdings: Holdings) -> None:
        self._h = holdings

    def place_all(self, info: ChunkInfo, chunk: Landed, started: float) -> None:
        """Inclusive: every tier that accepts the chunk keeps it, so a persistent disk tier
        still holds it when the processes owning the RAM tiers are gone."""
        for i, tier in enumerate(self._h.tiers):
            try:
                placed = self._place(i, tier, info, chunk)
            except Exception as exc:  # a full disk, a vanished directory: the others go on
                self.failed(tier, info, exc)
                continue
            if placed:
                with self._h.mutex:
                    tier.counters.copies += 1
                    tier.counters.copy_s += time.perf_counter() - started

    def _place(self, i: int, tier: Tier, info: ChunkInfo, chunk: Landed) -> bool:
        """Put the chunk into ``tier`` if its policy takes it; True if this call put it. One
        placement per tier at a time (its ``placing`` lock, and for a shared directory the
        cross-process lock): the decision and its writes cannot interleave with another's,
        so the quota holds."""
        h = self._h
        with tier.placing, tier.files.placing():
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

    def failed(self, tier: Tier, info: ChunkInfo, exc: Exception) -> None:
        """Count and log (once) that ``tier`` could not keep the chunk."""
        with self._h.mutex:
            tier.counters.copy_failures += 1
        self._h.warn(f"place:{tier.name}", f"cannot keep chunk {info.name} in {tier.name}: {exc}")
