"""What a tier stack knows of the reads to come: the plan's chunk order for clairvoyant
placement and prefetch, and the byte ranges each chunk's reads need, in order of use."""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from tierfeed.storage.chunktable import mean_chunk_size
from tierfeed.storage.holdings import Holdings
from tierfeed.storage.originfetch import Reads
from tierfeed.storage.placement import Clairvoyant
from tierfeed.storage.tuning import LookAhead

_AHEAD_MAX = 8192  # reads of the future looked at for the first copies

__all__ = ["Foresight"]


class Foresight:
    """The future a stack is told (`set_future`, `set_reads`) and what follows from it."""

    def __init__(self, holdings: Holdings) -> None:
        self._holdings = holdings
        self._ahead = LookAhead(mean_chunk_size(holdings.chunks))
        empty = np.zeros(0, dtype=np.int64)
        self._reads = (empty, empty, empty, empty)  # see `set_reads`
        self._firsts = np.zeros(0, dtype=np.int64)  # see `opening`
        self._served = 0  # see `served_first`

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """Tell the clairvoyant tiers' policies the chunk of every read to come, in order
        (``read_bytes``: a read's mean size, which weighs a whole-chunk copy against reads)."""
        h = self._holdings
        # Where each chunk is first read, in the look's reach: the first copies to start.
        head = np.asarray(sequence, dtype=np.int64)[:_AHEAD_MAX]
        self._firsts = np.sort(np.unique(head, return_index=True)[1])
        for i, policy in enumerate(h.policies):
            if isinstance(policy, Clairvoyant):
                # Built aside (an O(reads) pass), then swapped in: readers never wait on it.
                fresh = Clairvoyant()
                fresh.set_future(sequence, read_bytes)
                h.set_policy(i, fresh)  # the future decides what a tier takes

    def set_reads(
        self, chunks: npt.ArrayLike, offsets: npt.ArrayLike, ends: npt.ArrayLike | None = None
    ) -> None:
        """This epoch's reads in the order they are consumed: their chunks and byte ranges
        (``offsets`` to ``ends``, exclusive; None: the start only)."""
        chunk_of = np.asarray(chunks, dtype=np.int64)
        by_chunk = np.argsort(chunk_of, kind="stable")  # each chunk's reads, in order
        starts = np.asarray(offsets, dtype=np.int64)
        stops = starts + 1 if ends is None else np.asarray(ends, dtype=np.int64)
        self._reads = (chunk_of[by_chunk], by_chunk, starts, stops)

    def opening(self, copies: int, horizon: int = 64) -> int:
        """The reads to prefetch over when the future is told: at least ``horizon``, and as
        many as reach the first ``copies`` chunks to be read (of the reads looked at)."""
        firsts = self._firsts
        if copies < 1 or not len(firsts):
            return horizon
        return max(horizon, int(firsts[min(copies, len(firsts)) - 1]) + 1)

    def served_first(self, reads: int) -> None:
        """The first ``reads`` of the order `set_reads` gave are served apart (every worker's
        head reads): they rank after every other read (`reads_of`), so the copies fetch the
        pieces of the batches after the heads while the head reads run, not after them."""
        self._served = max(0, reads)

    def reads_of(self, chunk: int) -> Reads:
        """Where in the order of consumption each read of ``chunk`` comes (those served apart
        after all others: `served_first`), and the byte range it reads, start and end (empty
        when not told)."""
        sorted_chunks, positions, starts, stops = self._reads
        lo, hi = np.searchsorted(sorted_chunks, (chunk, chunk + 1))
        mine = positions[lo:hi]
        served = self._served
        ranked = np.where(mine < served, mine + len(positions), mine) if served else mine
        return ranked, starts[mine], stops[mine]

    def due(self, rate: float, inflight: int, reads: int) -> int:
        """How many reads ahead to prefetch now, ``reads`` reads having been made (0: not yet:
        see `LookAhead`), at the origin's measured ``rate`` with ``inflight`` copies running."""
        return self._ahead.due(time.monotonic(), rate, inflight, reads)

    def chosen(self, landing: set[int], horizon: int) -> list[int]:
        """The chunks of the next ``horizon`` reads of the known future that the clairvoyant
        tiers would take (their quotas and policies decide), ``landing`` counted as taken."""
        h = self._holdings
        out: list[int] = []
        for tier, policy in zip(h.tiers, h.policies, strict=True):
            if isinstance(policy, Clairvoyant):
                with h.mutex:
                    taken = dict(h.committed(tier, landing, -1))
                # The look (O(horizon) in Python) runs on that copy, outside the mutex that
                # every read of this process takes: held through it, each of the look's GIL
                # switches on a crowded machine held those reads too, and the host's
                # placement lock waited behind them (docs/BENCHMARKS.md, "Ranks on a crowded
                # node"). The policy is read as it is: a read advancing its clock meanwhile
                # moves the look by a read at most; a placement decides again.
                out += policy.prefetch(taken, tier.quota, h.sizes, horizon)
        return out
