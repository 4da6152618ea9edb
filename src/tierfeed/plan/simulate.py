"""`tierfeed simulate`: per-rank and total origin, exchange and cache bytes per epoch, from plans.

Model: ``global`` reads each rank's share from the origin every epoch; ``local`` and
``partial`` stage each rank's partition in once (epoch 0) and then read only local storage;
``partial`` also sends the exchanged samples to a peer each epoch. For large jobs a sample of
ranks is computed and totals are extrapolated (say ``--sample-ranks`` to change it).
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tierfeed.errors import ConfigError
from tierfeed.plan.plan import Plan
from tierfeed.plan.shape import DatasetShape

__all__ = ["EpochTraffic", "simulate"]


@dataclass
class EpochTraffic:
    """Bytes per rank (mean, max over the sampled ranks) and job totals for one epoch."""

    epoch: int
    origin_mean: float = 0.0
    origin_max: float = 0.0
    exchange_mean: float = 0.0
    cache_max: float = 0.0
    plan_seconds_max: float = 0.0
    plan_peak_bytes: int = 0
    totals: dict[str, float] = field(default_factory=dict)


def _rank_epoch(plan: Plan, epoch: int, rank: int, m: int) -> tuple[float, float, float]:
    """(origin, exchange sent, cache held) bytes of one rank in one epoch."""
    sizes = plan.shape.sample_bytes
    if sizes is None:
        raise ConfigError("simulate needs the samples' sizes (DatasetShape.sample_bytes)")
    order = plan.order(epoch, rank, m)
    if plan.spec.policy == "global":
        return float(sizes[np.unique(order)].sum()), 0.0, 0.0
    part = plan.partition(epoch, rank, m)
    held = float(sizes[part].sum())
    origin = held if epoch == 0 else 0.0
    sent = 0.0
    k = plan.exchange_size(m)
    if epoch >= 1 and k:
        before = plan.partition(epoch - 1, rank, m)
        slots, _ = plan.exchanged_slots(epoch, m)
        sent = float(sizes[before[slots]].sum())
    return origin, sent, held + sent  # at worst, received samples land before sent ones go


def simulate(
    shape: DatasetShape, plan: Plan, world_size: int, epochs: int, sample_ranks: int = 16
) -> list[EpochTraffic]:
    """Traffic of ``epochs`` epochs of ``plan`` on ``world_size`` ranks."""
    rng = np.random.default_rng(0)
    ranks = np.sort(rng.choice(world_size, min(sample_ranks, world_size), replace=False))
    out = []
    for epoch in range(epochs):
        row = EpochTraffic(epoch)
        origin, sent, cache = [], [], []
        for r in ranks.tolist():
            tracemalloc.start()
            t0 = time.perf_counter()
            o, s, c = _rank_epoch(plan, epoch, r, world_size)
            row.plan_seconds_max = max(row.plan_seconds_max, time.perf_counter() - t0)
            row.plan_peak_bytes = max(row.plan_peak_bytes, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            origin.append(o)
            sent.append(s)
            cache.append(c)
        row.origin_mean, row.origin_max = float(np.mean(origin)), float(np.max(origin))
        row.exchange_mean, row.cache_max = float(np.mean(sent)), float(np.max(cache))
        row.totals = {
            "origin": row.origin_mean * world_size,
            "exchange": row.exchange_mean * world_size,
        }
        out.append(row)
    return out


def as_dict(rows: list[EpochTraffic]) -> list[dict[str, Any]]:
    """Plain values for JSON."""
    return [r.__dict__ for r in rows]
