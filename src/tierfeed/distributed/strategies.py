"""What the exchanger sends and requests in each window: two schedule strategies.

    fetch   (global and local plans over node-local storage) each window of an epoch is
            fetched ``ahead`` windows before the loader reaches it, and deleted once read.
    move    (partial(q)) the moves that build the next epoch's partitions are made in the
            window after the senders have read the samples; the receiver writes them into its
            inbox and the sender deletes its copy (a hole punched in its staged chunk, or a
            segment of its inbox), so a rank never holds more than its partition plus what it
            has received but not yet read.

A strategy decides; the window executor (`tierfeed.distributed.windows`) runs the windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.copies import LocalCopies
from tierfeed.distributed.holders import SampleHolders
from tierfeed.distributed.schedule import (
    RankFetch,
    Transfers,
    move_transfers,
    rank_fetch,
)
from tierfeed.plan import Plan

__all__ = ["EpochState", "FetchStrategy", "MoveStrategy", "ScheduleStrategy", "strategy_for"]

IntArray = npt.NDArray[np.int64]


@dataclass
class EpochState:
    """One epoch's exchanges, shared by the training loop and the exchange thread."""

    epoch: int
    windows: int
    consumed: int = 0  # positions the loader has delivered
    margin: int = 0  # positions the loader may read ahead of what it reported
    ended: bool = False
    window: int | None = None  # the window running now (for messages)
    schedule: list[Transfers] = field(default_factory=list)  # the strategy's plan of windows


class ScheduleStrategy(Protocol):
    """What to exchange in each window, and what to do around it."""

    mode: str
    keeps_epochs_apart: bool  # end_epoch waits for the epoch's exchanges, then forgets them

    def prepare(self, state: EpochState) -> None:
        """Plan the epoch's windows (on the exchange thread)."""

    def transfers(self, state: EpochState, w: int) -> Transfers:
        """The transfers of window ``w`` (every rank's, or at least this rank's)."""

    def collective(self, transfers: Transfers) -> bool:
        """Whether window ``w``'s all-to-all runs, decided alike on every rank."""

    def ready(self, state: EpochState, w: int) -> bool:
        """Whether window ``w`` may run, given how far the loader is."""

    def settle(self, copies: LocalCopies, sent: Transfers, received: Transfers) -> int:
        """After a window: what changes in this rank's copies; returns bytes punched out."""

    def after(self, copies: LocalCopies, state: EpochState, w: int) -> None:
        """Housekeeping once window ``w`` ran (or had nothing to move)."""


@dataclass
class FetchStrategy:
    """Fetch each window's samples ``ahead`` windows early; delete them once read.

    Global plans: each rank computes only its own side of the schedule (its order, and where
    the samples it staged are read: `rank_fetch`), O(N/M + what it sends; chunk-wise, plus
    the chunk table and the windows its samples fall in), and every window runs its
    collective where the job spans nodes. ``local`` plans fetch nothing (a rank reads its own
    partition, all staged by itself).
    """

    plan: Plan
    holdings: SampleHolders
    world_size: int
    window: int
    ahead: int
    rank: int = 0
    mode: str = "fetch"
    keeps_epochs_apart: bool = True
    _mine: RankFetch | None = None

    def prepare(self, state: EpochState) -> None:
        self._mine = None
        if self.plan.spec.policy == "global":  # local: a rank holds its whole partition
            self._mine = rank_fetch(
                self.plan, self.holdings, state.epoch, self.rank, self.world_size, self.window
            )

    def transfers(self, state: EpochState, w: int) -> Transfers:
        if self._mine is None:
            return Transfers.empty()
        return self._mine.transfers(w, self.holdings)

    def collective(self, transfers: Transfers) -> bool:
        """Whether this window's all-to-all runs (every rank must decide alike): it knows
        only its own rows, so whenever the job spans nodes."""
        return self._mine is not None and self.world_size > self.holdings.local_world_size

    def ready(self, state: EpochState, w: int) -> bool:
        return state.ended or w * self.window < state.consumed + state.margin + (
            self.ahead * self.window
        )

    def settle(self, copies: LocalCopies, sent: Transfers, received: Transfers) -> int:
        return 0  # a fetched sample is a copy: the holder keeps its own

    def after(self, copies: LocalCopies, state: EpochState, w: int) -> None:
        copies.forget_read(state.epoch, (state.consumed - state.margin) // self.window - 1)


@dataclass
class MoveStrategy:
    """Move samples into the next epoch's partitions once their senders have read them."""

    plan: Plan
    world_size: int
    window: int
    mode: str = "move"
    keeps_epochs_apart: bool = False

    def prepare(self, state: EpochState) -> None:
        state.schedule = move_transfers(self.plan, state.epoch, self.world_size, self.window)

    def transfers(self, state: EpochState, w: int) -> Transfers:
        return state.schedule[w]

    def collective(self, transfers: Transfers) -> bool:
        return len(transfers) > 0  # every rank's rows: the same answer everywhere

    def ready(self, state: EpochState, w: int) -> bool:
        return state.ended or (w + 1) * self.window + state.margin <= state.consumed

    def settle(self, copies: LocalCopies, sent: Transfers, received: Transfers) -> int:
        return copies.discard(sent.sample)

    def after(self, copies: LocalCopies, state: EpochState, w: int) -> None:
        return None

    def restore(self, epoch: int, holdings: SampleHolders) -> Transfers:
        """One exchange that moves each sample of ``epoch``'s partitions from the rank that
        staged it (a restarted job rebuilding its partitions)."""
        samples, srcs, dsts = [], [], []
        for dst in range(self.world_size):
            part = self.plan.partition(epoch, dst, self.world_size)
            away = part[holdings.sample_holder(part) != dst]
            samples.append(away)
            srcs.append(holdings.sample_holder(away))
            dsts.append(np.full(len(away), dst, dtype=np.int64))
        return Transfers.sorted(np.concatenate(samples), np.concatenate(srcs), np.concatenate(dsts))


def strategy_for(
    plan: Plan, holdings: SampleHolders, world_size: int, window: int, ahead: int, rank: int = 0
) -> FetchStrategy | MoveStrategy:
    """Partial plans move samples; the others fetch them."""
    if plan.spec.policy == "partial":
        return MoveStrategy(plan, world_size, window)
    return FetchStrategy(plan, holdings, world_size, window, ahead, rank)
