"""A mergeable log-bucketed latency histogram: tail percentiles without keeping samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LatencyHistogram"]

_LO_S = 1e-6  # 1 µs
_DECADES = 8  # up to 100 s; longer waits land in the last bucket (max is kept exactly)
_PER_DECADE = 40  # buckets per decade: ~6% relative resolution
_EDGES = _LO_S * 10 ** (np.arange(_DECADES * _PER_DECADE + 1) / _PER_DECADE)


def _zeros() -> npt.NDArray[np.int64]:
    return np.zeros(len(_EDGES) + 1, dtype=np.int64)


@dataclass
class LatencyHistogram:
    """Counts of durations (seconds) in log-spaced buckets, plus the exact count, sum and max."""

    counts: npt.NDArray[np.int64] = field(default_factory=_zeros)
    total: int = 0
    sum_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        """Record one duration."""
        self.counts[int(np.searchsorted(_EDGES, seconds, side="right"))] += 1
        self.total += 1
        self.sum_s += seconds
        self.max_s = max(self.max_s, seconds)

    def add_many(self, seconds: npt.ArrayLike) -> None:
        """Record many durations at once."""
        values = np.asarray(seconds, dtype=np.float64)
        if values.size == 0:
            return
        np.add.at(self.counts, np.searchsorted(_EDGES, values, side="right"), 1)
        self.total += int(values.size)
        self.sum_s += float(values.sum())
        self.max_s = max(self.max_s, float(values.max()))

    def merge(self, other: LatencyHistogram) -> None:
        """Add another histogram's counts into this one (workers, ranks, epochs)."""
        self.counts += other.counts
        self.total += other.total
        self.sum_s += other.sum_s
        self.max_s = max(self.max_s, other.max_s)

    def quantile(self, q: float) -> float:
        """The q-quantile in seconds (upper edge of its bucket, capped at the exact max)."""
        if self.total == 0:
            return 0.0
        rank = q * self.total
        bucket = int(np.searchsorted(np.cumsum(self.counts), rank, side="left"))
        upper = _EDGES[min(bucket, len(_EDGES) - 1)]
        return float(min(upper, self.max_s))

    def summary(self) -> dict[str, float]:
        """p50, p99, p99.9, p99.99, max and mean in seconds, and the count."""
        return {
            "count": self.total,
            "mean": self.sum_s / self.total if self.total else 0.0,
            "p50": self.quantile(0.5),
            "p99": self.quantile(0.99),
            "p99.9": self.quantile(0.999),
            "p99.99": self.quantile(0.9999),
            "max": self.max_s,
        }

    def cdf(self) -> tuple[list[float], list[float]]:
        """Bucket upper edges (s) and the cumulative fraction at each non-empty bucket."""
        if self.total == 0:
            return [], []
        cum = np.cumsum(self.counts) / self.total
        nz = np.flatnonzero(self.counts)
        edges = np.append(_EDGES, self.max_s)[nz]
        return [float(e) for e in np.minimum(edges, self.max_s)], [float(c) for c in cum[nz]]

    def to_dict(self) -> dict[str, Any]:
        """Sparse plain form for JSON: non-empty buckets only."""
        nz = np.flatnonzero(self.counts)
        return {
            "buckets": {str(int(i)): int(self.counts[i]) for i in nz},
            "total": self.total,
            "sum_s": self.sum_s,
            "max_s": self.max_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyHistogram:
        """Inverse of `to_dict`."""
        h = cls()
        for i, n in d["buckets"].items():
            h.counts[int(i)] = int(n)
        h.total, h.sum_s, h.max_s = int(d["total"]), float(d["sum_s"]), float(d["max_s"])
        return h
