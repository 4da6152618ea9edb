"""Placement policies: pure decisions of what to cache where and what to evict (no I/O).

fill-top      Monarch's: place while there is room, never evict.
lru           evict the least recently used chunks to make room.
clairvoyant   Belady's, made cost-aware: the future reads are known (the plan gives them).
              A chunk is copied only if its reads before it would be evicted pay for the
              copy (a copy costs size / ``read_bytes`` reads); to make room it evicts the
              chunk whose next use is furthest away, only when the newcomer's reads before
              that next use pay for both copies. It prefetches the next chunks that fit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Mapping

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError

__all__ = ["POLICIES", "Clairvoyant", "FillTop", "Lru", "Placement", "make_policy"]

NEVER = float("inf")


class Placement(ABC):
    """Decides, for one tier, whether a chunk goes in and which chunks leave for it."""

    name = "placement"

    def accessed(self, chunk: int) -> None:  # noqa: B027 - most policies need no history
        """A read of ``chunk`` happened (from any tier)."""

    @abstractmethod
    def choose(
        self, cached: Mapping[int, int], chunk: int, size: int, quota: int, fetched: bool = False
    ) -> tuple[bool, list[int]]:
        """(place?, victims) for putting ``chunk`` of ``size`` bytes into a tier holding
        ``cached`` ({chunk: size}) under ``quota`` bytes."""


class FillTop(Placement):
    """Place while the tier has room; never evict."""

    name = "fill-top"

    def choose(
        self, cached: Mapping[int, int], chunk: int, size: int, quota: int, fetched: bool = False
    ) -> tuple[bool, list[int]]:
        return sum(cached.values()) + size <= quota, []


class Lru(Placement):
    """Evict the least recently accessed chunks until the new one fits."""

    name = "lru"

    def __init__(self) -> None:
        self._recent: OrderedDict[int, None] = OrderedDict()

    def accessed(self, chunk: int) -> None:
        self._recent.pop(chunk, None)
        self._recent[chunk] = None

    def choose(
        self, cached: Mapping[int, int], chunk: int, size: int, quota: int, fetched: bool = False
    ) -> tuple[bool, list[int]]:
        if size > quota:
            return False, []
        free = quota - sum(cached.values())
        # Oldest first; chunks never accessed in this process count as oldest of all.
        age = {c: i for i, c in enumerate(self._recent)}
        by_age = sorted(cached, key=lambda c: age.get(c, -1))
        victims = []
        for victim in by_age:
            if free >= size:
                break
            if victim != chunk:
                victims.append(victim)
                free += cached[victim]
        return free >= size, victims if free >= size else []


class Clairvoyant(Placement):
    """Belady's optimal replacement on the known future access sequence."""

    name = "clairvoyant"

    def __init__(self) -> None:
        self._uses: dict[int, list[int]] = {}
        self._now = 0
        self._future: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self.read_bytes = 0.0  # 0: a copy costs one read

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """The chunk of every read to come, in order (one entry per read, from the plan).

        Args:
            sequence: chunk ids, one per read.
            read_bytes: the mean bytes of one read; copying a chunk of ``size`` bytes costs
                as much as size / read_bytes reads (0: as much as one read).
        """
        self.read_bytes = read_bytes
        self._future = np.asarray(sequence, dtype=np.int64)
        self._uses = {}
        for i, c in enumerate(self._future.tolist()):
            self._uses.setdefault(c, []).append(i)
        self._now = 0

    def accessed(self, chunk: int) -> None:
        # The clock counts reads. Reads leave the plan's order by up to the read-ahead window
        # (many reader threads, deferred samples); moving the clock to this chunk's next use
        # instead let one early read skip it past every other chunk's uses, an epoch at a
        # time, until nothing seemed needed again and each copy was dropped once made.
        if self._now < len(self._future):
            self._now += 1

    def next_use(self, chunk: int) -> float:
        """Index of the chunk's next access at or after now (inf if never)."""
        uses = self._uses.get(chunk, [])
        i = bisect_right(uses, self._now - 1)
        return float(uses[i]) if i < len(uses) else NEVER

    def uses_before(self, chunk: int, until: float) -> int:
        """Reads of ``chunk`` from now until index ``until`` (exclusive)."""
        uses = self._uses.get(chunk, [])
        lo = bisect_right(uses, self._now - 1)
        hi = len(uses) if until == NEVER else bisect_right(uses, int(until) - 1)
        return max(0, hi - lo)

    def choose(
        self, cached: Mapping[int, int], chunk: int, size: int, quota: int, fetched: bool = False
    ) -> tuple[bool, list[int]]:
        if size > quota:
            return False, []
        free = quota - sum(cached.values())
        if self.next_use(chunk) == NEVER:
            # Not read again in the known future (this process's share of the plan): it may
            # take free room, which costs no read of the future (it is the first victim when
            # room is needed), and serves what lies beyond (the next epoch; the other
            # processes sharing the tier); it displaces nothing.
            return free >= size, []
        victims = []
        # Ranked only when room must be made: with room free, no victim is looked at (the
        # ranking is a bisect per held chunk, and a prefetch look asks for each chunk ahead).
        for victim in sorted(cached, key=self.next_use, reverse=True) if free < size else ():
            if free >= size:
                break
            victims.append(victim)
            free += cached[victim]
        if free < size:
            return False, []
        # Held until the earliest next use among the victims (or for good): do the reads it
        # serves in that time pay for its copy, and for re-copying what it displaces?
        until = min((self.next_use(v) for v in victims), default=NEVER)
        payoff = max(1.0, size / self.read_bytes) if self.read_bytes > 0 else 1.0
        # Its copy (unless the bytes are already here: then only keeping it is decided), and
        # each victim read again copied back and read (one never read again costs nothing).
        again = sum(1 for v in victims if self.next_use(v) != NEVER)
        needed = payoff * ((0 if fetched else 1) + 2 * again)
        return (True, victims) if self.uses_before(chunk, until) >= needed else (False, [])

    def prefetch(
        self, cached: Mapping[int, int], quota: int, sizes: Mapping[int, int], horizon: int = 64
    ) -> Iterator[int]:
        """Chunks worth fetching now: the next ones in the future not cached that fit."""
        planned = dict(cached)  # what the tier will hold once earlier prefetches land
        # Each chunk ahead judged once, at its first read (in that order): a chunk refused
        # was judged again at every later read of it in the horizon, as it is in a process
        # whose own reads of a chunk do not pay for its copy (a worker of a rank of 4: a few
        # dozen reads of a 64 MiB chunk, worth hundreds), every look, every 50 ms.
        ahead = self._future[self._now : self._now + horizon]
        firsts = np.unique(ahead, return_index=True)[1]
        for c in ahead[np.sort(firsts)].tolist():
            if c in planned:
                continue
            place, victims = self.choose(planned, c, sizes[c], quota)
            if place:
                for v in victims:
                    del planned[v]
                planned[c] = sizes[c]
                yield c


POLICIES: dict[str, type[Placement]] = {p.name: p for p in (FillTop, Lru, Clairvoyant)}


def make_policy(name: str) -> Placement:
    """A fresh policy by name: fill-top, lru or clairvoyant."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError(f"unknown placement {name!r}; use one of {sorted(POLICIES)}") from None
