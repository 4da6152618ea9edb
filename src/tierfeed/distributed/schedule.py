"""Exchange schedules: which samples move between which ranks in each window of an epoch.

Two kinds, both pure functions of plans and holdings, computed identically on every rank:

    fetch   (one namespace) before rank d reads positions [a, b) of its order, every sample
            there that d's node does not hold is sent to d by the rank that staged its chunk.
    move    (partial local shuffling) the transfers of `Plan.exchange` that turn epoch e's
            partitions into epoch e+1's, each sent in the window after the sender has read
            the sample in epoch e.

A window is a range of positions in the ranks' orders (all ranks' orders are equally long), so
a window is the same number of steps on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.holders import SampleHolders
from tierfeed.plan import Plan

__all__ = [
    "RankFetch",
    "Transfers",
    "fetch_transfers",
    "move_transfers",
    "num_windows",
    "rank_fetch",
]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Transfers:
    """Rows of (sample, src, dst): each a sample sent from rank src to rank dst.

    Rows are sorted by (dst, src) with each pair's samples in the receiver's reading order:
    the order all_to_all delivers them in.
    """

    sample: IntArray
    src: IntArray
    dst: IntArray

    def __len__(self) -> int:
        return len(self.sample)

    def sent_by(self, rank: int) -> Transfers:
        """The rows rank ``rank`` sends."""
        return self._where(self.src == rank)

    def received_by(self, rank: int) -> Transfers:
        """The rows rank ``rank`` receives."""
        return self._where(self.dst == rank)

    def _where(self, mask: npt.NDArray[np.bool_]) -> Transfers:
        return Transfers(self.sample[mask], self.src[mask], self.dst[mask])

    @classmethod
    def empty(cls) -> Transfers:
        """No transfer."""
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none)

    @classmethod
    def sorted(cls, sample: IntArray, src: IntArray, dst: IntArray) -> Transfers:
        """Rows in (dst, src) order, stable within a pair."""
        order = np.lexsort((src, dst))  # last key first: dst, then src; stable
        return cls(sample[order], src[order], dst[order])


def num_windows(order_length: int, window: int) -> int:
    """Windows of ``window`` positions in an order of ``order_length``."""
    return -(-order_length // max(1, window))


def fetch_transfers(orders: list[IntArray], a: int, b: int, holdings: SampleHolders) -> Transfers:
    """Samples each rank reads at positions [a, b) of its order that its node lacks.

    Args:
        orders: every rank's order for the epoch (``orders[d]`` is rank d's).
        a, b: the window of positions.
        holdings: who staged which sample.
    """
    samples, srcs, dsts = [], [], []
    for dst, order in enumerate(orders):
        part = order[a:b]
        _, first = np.unique(part, return_index=True)
        part = part[np.sort(first)]  # each sample once, in reading order
        remote = part[~holdings.local_samples(dst, part)]
        samples.append(remote)
        srcs.append(holdings.sample_holder(remote))
        dsts.append(np.full(len(remote), dst, dtype=np.int64))
    if not samples:
        return Transfers.empty()
    return Transfers.sorted(
        np.concatenate(samples), np.concatenate(srcs).astype(np.int64), np.concatenate(dsts)
    )


@dataclass(frozen=True)
class RankFetch:
    """One rank's side of an epoch's fetch schedule, found without the other ranks' orders:
    its own order (what it receives) and the reads of the samples it staged by other nodes'
    ranks (what it sends), sorted by (window, receiver, position in the receiver's order)."""

    rank: int
    order: IntArray
    window: int
    send_sample: IntArray
    send_dst: IntArray
    send_window: IntArray

    def transfers(self, w: int, holdings: SampleHolders) -> Transfers:
        """This rank's rows of window ``w``: `fetch_transfers`' rows with it as src or dst."""
        part = self.order[w * self.window : (w + 1) * self.window]
        _, first = np.unique(part, return_index=True)
        part = part[np.sort(first)]
        got = part[~holdings.local_samples(self.rank, part)]
        lo, hi = np.searchsorted(self.send_window, [w, w + 1], side="left")
        sent = self.send_sample[lo:hi]
        sample = np.concatenate([got, sent])
        src = np.concatenate([holdings.sample_holder(got), np.full(len(sent), self.rank)])
        dst = np.concatenate([np.full(len(got), self.rank), self.send_dst[lo:hi]])
        return Transfers.sorted(sample, src.astype(np.int64), dst.astype(np.int64))


def rank_fetch(
    plan: Plan, holdings: SampleHolders, epoch: int, rank: int, world_size: int, window: int
) -> RankFetch:
    """Rank ``rank``'s side of the fetch schedule of ``epoch``, in O(N/M + what it sends):
    its own order, and where its staged samples are read (`Plan.readers`, the inverse of the
    global shuffle) by ranks that cannot read them locally. Global plans only.
    """
    order = plan.order(epoch, rank, world_size)
    sample, dst, index = plan.readers(epoch, holdings.samples_staged_by(rank), world_size)
    away = ~holdings.local_to_ranks(dst, sample)
    sample, dst, index = sample[away], dst[away], index[away]
    win = index // max(1, window)
    by = np.lexsort((index, dst, win))  # window, then receiver, then its reading order
    return RankFetch(rank, order, window, sample[by], dst[by], win[by])


def move_transfers(plan: Plan, epoch: int, world_size: int, window: int) -> list[Transfers]:
    """The moves made during ``epoch`` that build the partitions of ``epoch + 1``, by window.

    A sample moves in the window holding the position where its sender reads it in ``epoch``
    (so it has been read before it leaves).
    """
    exchange = plan.exchange(epoch + 1, world_size, batch_size=1)
    length = len(plan.order(epoch, 0, world_size))
    windows = num_windows(length, window)
    which = np.minimum(exchange.step // max(1, window), max(0, windows - 1))
    out = []
    for w in range(windows):
        here = which == w
        out.append(Transfers.sorted(exchange.sample[here], exchange.src[here], exchange.dst[here]))
    return out
