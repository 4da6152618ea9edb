"""Deadlines from recent read latencies: fixed, or k times a running high percentile."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np

from tierfeed.errors import ConfigError

__all__ = ["DeadlineOptions", "LatencyTracker"]


@dataclass(frozen=True)
class DeadlineOptions:
    """When a read counts as late, and what happens then.

    Attributes:
        enabled: the guard is on; off gives the plan's exact order (reads still prefetch).
        fixed_ms: a fixed deadline in ms; None means adaptive.
        k: adaptive deadline = k x the ``quantile`` of the last ``history`` read latencies.
        quantile: the running percentile the adaptive deadline follows.
        history: how many recent latencies the percentile is taken over.
        floor_ms: the adaptive deadline is never shorter than this.
        warmup: reads observed before the adaptive deadline applies (until then: no deferral
            shorter than ``floor_ms`` x 10).
        overtaken_share: the sample due is also late, before its deadline, once this share
            of the reads ahead (the window's) is ready while it is not and it has run longer
            than the ``quantile`` of recent reads: those reads, most of them begun after it,
            ended first, so it is slower than the reads of the moment whatever the deadline
            says. The deadline follows recent latencies, and a cold
            epoch's reads wait for copies in flight, which made it a second or more while a
            batch's worth of samples stood ready (issue 45). None: only the deadline.
        hedge_after_ms: issue a second read from another source after this long; None: no
            hedging. ``0`` hedges at the deadline.
        hedge_blocked: a late sample that the batch waits on alone (no read ahead is ready
            to take its place, as at an epoch's end, or the order is exact) is read a second
            way at once, from the origin past the tiers and the copies in flight, and the
            first of the two to land is delivered: a read waiting on a piece, a stalled
            request or open, holds the batch for its deadline and one more read, not for
            its own time (issue 45). Not from an object store, where a read waits for its
            copy's piece by design (a request is billed) and the copy hedges its own.
        hard_timeout_s: a read still missing after this long is an error naming it.
    """

    enabled: bool = True
    fixed_ms: float | None = None
    k: float = 4.0
    quantile: float = 0.9  # robust: stalls cluster (a stalled open holds many reads)
    history: int = 2048
    floor_ms: float = 2.0
    warmup: int = 32
    overtaken_share: float | None = 0.5
    hedge_after_ms: float | None = None
    hedge_blocked: bool = True
    hard_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.fixed_ms is not None and self.fixed_ms <= 0:
            raise ConfigError(f"fixed deadline must be > 0 ms, got {self.fixed_ms}")
        if self.k <= 0 or not 0 < self.quantile < 1 or self.history < 8:
            raise ConfigError(f"bad adaptive deadline settings: {self}")
        if self.overtaken_share is not None and not 0 < self.overtaken_share <= 1:
            raise ConfigError(f"overtaken share must be in (0, 1], got {self.overtaken_share}")
        if self.hard_timeout_s <= 0:
            raise ConfigError(f"hard timeout must be > 0 s, got {self.hard_timeout_s}")

    def for_origin(self, costly_requests: bool, second_way: bool = True) -> DeadlineOptions:
        """These options over an origin whose requests are ``costly_requests`` (an object
        store), with or without a ``second_way`` to it: no `hedge_blocked` over an object
        store, where a read waits for its copy's piece by design (a request is billed) and
        the copy hedges its own late requests, nor without a second way known (a job's
        namespace, whose chunk files hold what its node holds and no more)."""
        blocked = self.hedge_blocked and second_way and not costly_requests
        return self if blocked == self.hedge_blocked else replace(self, hedge_blocked=blocked)

    @property
    def hedges(self) -> bool:
        """Whether any read may be hedged."""
        return self.hedge_after_ms is not None or self.hedge_blocked


_RECOMPUTE = 128  # reads between two computations of the running quantile


class LatencyTracker:
    """A ring of recent latencies (seconds) and the deadline they imply; thread-safe."""

    def __init__(self, options: DeadlineOptions) -> None:
        self.options = options
        self._ring = np.zeros(options.history, dtype=np.float64)
        self._count = 0
        self._cached: float | None = None
        self._mutex = threading.Lock()

    def observe(self, seconds: float) -> None:
        """Record one completed read's latency."""
        with self._mutex:
            self._ring[self._count % len(self._ring)] = seconds
            self._count += 1
            if self._count % _RECOMPUTE == 0:
                self._cached = None  # recompute the percentile now and then, not per read

    def typical(self) -> float | None:
        """The running ``quantile`` of read latency (s); None while warming up."""
        cached = self._cached  # one attribute read: no lock on the path of every sample
        if cached is not None:
            return cached
        with self._mutex:
            if self._count < self.options.warmup:
                return None
            seen = self._ring[: min(self._count, len(self._ring))].copy()
        # Outside the lock: readers recording their latencies do not wait for the quantile.
        value = float(np.quantile(seen, self.options.quantile))
        self._cached = value
        return value

    def deadline(self) -> float:
        """Seconds a due read may take before it counts as late."""
        o = self.options
        if o.fixed_ms is not None:
            return o.fixed_ms / 1000.0
        typical = self.typical()
        if typical is None:
            return o.floor_ms * 10 / 1000.0
        return max(o.floor_ms / 1000.0, o.k * typical)

    def hedge_after(self) -> float | None:
        """Seconds after which a read is hedged, or None when hedging is off."""
        h = self.options.hedge_after_ms
        if h is None:
            return None
        return self.deadline() if h == 0 else h / 1000.0
