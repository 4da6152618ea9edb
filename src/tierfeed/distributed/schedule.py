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

from tierfeed.distributed.holders import Holdings
from tierfeed.plan import Plan

__all__ = ["Transfers", "fetch_transfers", "move_transfers", "num_windows"]

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


def fetch_transfers(orders: list[IntArray], a: int, b: int, holdings: Holdings) -> Transfers:
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
