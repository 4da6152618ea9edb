"""What a staged job moves, per rank and epoch, computed from a store's index alone.

The model is the job's own code run without I/O: the holdings stage-in copies by
(`holders.py`), the plan's orders and partitions, and the exchange schedules the exchanger
runs (`schedule.py`: ``fetch`` windows for global and local plans, ``move`` windows for
partial ones). Per rank and epoch it gives:

    origin     bytes read from the origin: stage-in (whole chunks with their tar headers, and
               the rank's parts, first member's data to last one's end), in epoch 0; nothing
               after (the job reads node-local storage only)
    sent, received
               sample bytes the exchange moves (members only, as the exchange sends them)
    held       the most sample bytes the rank stores at once: the samples it can read
               locally after stage-in (its node's whole chunks, its parts), and under
               partial plans what arrives before what leaves, window by window
    cache      bytes a cache tier of the rank holds after the epoch, if it has room: every
               chunk held whole on the rank's node that the rank has read so far (a tier
               copies only such chunks)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.exchanger import ExchangeOptions
from tierfeed.distributed.holders import SampleHolders
from tierfeed.distributed.parts import part_bytes
from tierfeed.distributed.schedule import Transfers, fetch_transfers, move_transfers, num_windows
from tierfeed.format.index import Index
from tierfeed.loader.compose import plan_for
from tierfeed.plan import Plan, PlanSpec
from tierfeed.world import World

__all__ = ["RankEpoch", "job_traffic"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RankEpoch:
    """One rank's bytes in one epoch (see the module's docstring)."""

    epoch: int
    rank: int
    origin: int
    sent: int
    received: int
    held: int
    cache: int

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for JSON)."""
        return asdict(self)


def _windows(
    plan: Plan, holdings: SampleHolders, epoch: int, m: int, window: int
) -> list[Transfers]:
    """The exchanges of ``epoch``, window by window, as the exchanger's strategy runs them."""
    if plan.spec.policy == "partial":
        return move_transfers(plan, epoch, m, window)
    orders = [plan.order(epoch, r, m) for r in range(m)]
    return [
        fetch_transfers(orders, w * window, (w + 1) * window, holdings)
        for w in range(num_windows(len(orders[0]), window))
    ]


def job_traffic(
    index: Index,
    plan: PlanSpec | str,
    world_size: int,
    local_world_size: int = 1,
    epochs: int = 3,
    window: int | None = None,
) -> list[RankEpoch]:
    """Every rank's traffic in each of ``epochs`` epochs of a job staged from ``index``'s store.

    Args:
        index: the store's index.
        plan: the job's plan.
        world_size: ranks in the job.
        local_world_size: ranks per node (they share a node's staged chunks).
        epochs: epochs to compute.
        window: positions per exchange window (default `ExchangeOptions`' own).

    Returns:
        One row per (epoch, rank), epoch by epoch.
    """
    p = plan_for(index, plan)
    m = world_size
    window = ExchangeOptions().window if window is None else window
    chunk_bytes = np.asarray(index.chunk_size, dtype=np.int64)
    holdings = SampleHolders.of(p.shape, chunk_bytes, p.spec, World(0, m, 0, local_world_size))
    sizes = index.sample_bytes()
    held = _held_after_stage(holdings, sizes, m)
    staged = _staged_bytes(index, holdings, chunk_bytes, m)
    whole = [holdings.local_to(r) for r in range(m)]
    read = [np.zeros(len(chunk_bytes), dtype=bool) for _ in range(m)]
    rows = []
    for epoch in range(epochs):
        sent, received, peak = _exchange(p, holdings, epoch, m, window, sizes, held)
        for r in range(m):
            read[r][np.unique(p.shape.sample_chunk[p.order(epoch, r, m)])] = True
            cache = int(chunk_bytes[read[r] & whole[r]].sum())
            rows.append(
                RankEpoch(
                    epoch,
                    r,
                    staged[r] if epoch == 0 else 0,
                    int(sent[r]),
                    int(received[r]),
                    int(peak[r]),
                    cache,
                )
            )
    return rows


def _held_after_stage(holdings: SampleHolders, sizes: IntArray, m: int) -> IntArray:
    """Sample bytes each rank can read locally once stage-in is done."""
    everything = np.arange(len(sizes), dtype=np.int64)
    return np.array(
        [int(sizes[holdings.local_samples(r, everything)].sum()) for r in range(m)], np.int64
    )


def _staged_bytes(
    index: Index, holdings: SampleHolders, chunk_bytes: IntArray, m: int
) -> list[int]:
    """Bytes each rank reads from the origin in stage-in: its whole chunks and its parts."""
    return [
        int(chunk_bytes[holdings.staged_by(r)].sum())
        + sum(part_bytes(index, q) for q in holdings.parts_of(r))
        for r in range(m)
    ]


def _exchange(
    p: Plan,
    holdings: SampleHolders,
    epoch: int,
    m: int,
    window: int,
    sizes: IntArray,
    held: IntArray,
) -> tuple[IntArray, IntArray, IntArray]:
    """Bytes each rank sends and receives in ``epoch``, and the most it holds at once.

    Under partial plans samples move, so ``held`` (per rank) is updated in place for the next
    epoch.
    """
    sent = np.zeros(m, dtype=np.int64)
    received = np.zeros(m, dtype=np.int64)
    peak = held.copy()
    for t in _windows(p, holdings, epoch, m, window):
        out = np.bincount(t.src, weights=sizes[t.sample], minlength=m).astype(np.int64)
        into = np.bincount(t.dst, weights=sizes[t.sample], minlength=m).astype(np.int64)
        sent += out
        received += into
        if p.spec.policy == "partial":  # moves: what arrives lands before what leaves
            peak = np.maximum(peak, held + into)
            held += into - out
    return sent, received, peak
