"""Seeded latency model for slowed storage: lognormal latency, a stall tail, a bandwidth cap.

A leaf (no I/O, imports only errors): used by the ``slow`` storage driver and by the
``slowfs`` FUSE pass-through, so that every comparison in tests and benchmarks runs against
the same slowed origin.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from tierfeed.errors import ConfigError

__all__ = ["LatencyModel", "LatencySampler"]


@dataclass(frozen=True)
class LatencyModel:
    """Parameters of the slowed storage.

    Attributes:
        median_ms: median latency of one operation (open, stat, read), in ms.
        sigma: shape of the lognormal (0 makes every operation take ``median_ms``).
        tail_prob: probability that an operation stalls on top of its latency.
        stall_ms: duration of a stall, in ms.
        bandwidth_mbps: bandwidth cap for reads in MB/s (10**6 bytes); 0 means none.
        seed: seed of the latency sequence.
        open_tail_prob: probability that an open stalls, on top of its latency and of the
            tail every operation has (a metadata server's slow answer).
        open_stall_ms: duration of an open's stall, in ms.
    """

    median_ms: float = 0.0
    sigma: float = 0.0
    tail_prob: float = 0.0
    stall_ms: float = 0.0
    bandwidth_mbps: float = 0.0
    seed: int = 0
    open_tail_prob: float = 0.0
    open_stall_ms: float = 0.0

    def __post_init__(self) -> None:
        times = (self.median_ms, self.sigma, self.stall_ms, self.bandwidth_mbps, self.open_stall_ms)
        if min(times) < 0:
            raise ConfigError(f"latency model parameters must be >= 0: {self}")
        for name in ("tail_prob", "open_tail_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {getattr(self, name)}")

    @classmethod
    def parse(cls, spec: str) -> LatencyModel:
        """Parse ``"median_ms=2,sigma=0.5,tail_prob=1e-4,stall_ms=2000,bandwidth_mbps=500,seed=1"``.

        Also accepts the names ``none`` (no delay), ``nfs``, ``heavy-tail`` and ``stalls``
        (``nfs`` with a 2 s stall on one operation in 10,000 and 150 ms on one open in 100:
        a busy shared file system as a large job meets it).
        """
        presets = {
            "none": cls(),
            "nfs": cls(median_ms=1.0, sigma=0.5, bandwidth_mbps=400.0),
            "heavy-tail": cls(
                median_ms=1.0, sigma=0.5, tail_prob=1e-3, stall_ms=1000.0, bandwidth_mbps=400.0
            ),
            "stalls": cls(
                median_ms=1.0,
                sigma=0.5,
                tail_prob=1e-4,
                stall_ms=2000.0,
                bandwidth_mbps=400.0,
                open_tail_prob=0.01,
                open_stall_ms=150.0,
            ),
        }
        spec = spec.strip()
        if spec in presets:
            return presets[spec]
        fields: dict[str, float | int] = {}
        names = {f for f in cls.__dataclass_fields__}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or name not in names:
                raise ConfigError(
                    f"bad latency spec part {part!r}; expected NAME=VALUE with NAME in "
                    f"{sorted(names)} or a preset in {sorted(presets)}"
                )
            try:
                fields[name] = int(value) if name == "seed" else float(value)
            except ValueError:
                raise ConfigError(f"latency spec {name}={value!r} is not a number") from None
        return cls(**fields)  # type: ignore[arg-type]

    @property
    def is_zero(self) -> bool:
        """True when the model adds no delay at all."""
        return (
            self.median_ms == 0
            and (self.tail_prob == 0 or self.stall_ms == 0)
            and (self.open_tail_prob == 0 or self.open_stall_ms == 0)
            and (self.bandwidth_mbps == 0)
        )


class LatencySampler:
    """Draws per-operation delays (seconds) from a LatencyModel; thread-safe and seeded.

    The k-th draw is the same on every machine for the same model (PCG64 with the model's seed).
    """

    def __init__(self, model: LatencyModel) -> None:
        self.model = model
        self._rng = np.random.Generator(np.random.PCG64(model.seed))
        self._lock = threading.Lock()

    def delay(self, nbytes: int = 0, opening: bool = False) -> float:
        """Seconds one operation moving ``nbytes`` should take under the model (an open:
        ``opening``)."""
        return self.draw(nbytes, opening)[0]

    def draw(self, nbytes: int = 0, opening: bool = False) -> tuple[float, bool]:
        """Seconds one operation should take, and whether it stalled (an open may stall as
        every operation does, and apart from that as opens do)."""
        m = self.model
        with self._lock:
            base = m.median_ms * math.exp(m.sigma * float(self._rng.standard_normal()))
            stalled = m.tail_prob > 0 and float(self._rng.random()) < m.tail_prob
            slow_open = (
                opening and m.open_tail_prob > 0 and (float(self._rng.random()) < m.open_tail_prob)
            )
        ms = base + (m.stall_ms if stalled else 0.0) + (m.open_stall_ms if slow_open else 0.0)
        stalled = (stalled and m.stall_ms > 0) or (slow_open and m.open_stall_ms > 0)
        seconds = ms / 1000.0
        if m.bandwidth_mbps > 0 and nbytes > 0:
            seconds += nbytes / (m.bandwidth_mbps * 1e6)
        return seconds, stalled
