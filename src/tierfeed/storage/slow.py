"""The slow driver: wraps another and delays each operation by the seeded latency model."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from tierfeed.latency import LatencyModel, LatencySampler
from tierfeed.storage.driver import Driver

__all__ = ["SlowDriver"]


class SlowDriver(Driver):
    """``inner`` with every read, stat and list delayed by ``model`` (per-op counters kept).

    Args:
        inner: the driver slowed down.
        model: the latency model (lognormal latency, stall tail, bandwidth cap).
    """

    def __init__(self, inner: Driver, model: LatencyModel) -> None:
        super().__init__(inner.read_only)
        self.inner = inner
        self.sampler = LatencySampler(model)
        self.name = f"slow:{inner.name}"
        self.delay_s = 0.0

    def _sleep(self, nbytes: int = 0) -> None:
        seconds = self.sampler.delay(nbytes)
        self.delay_s += seconds
        time.sleep(seconds)

    def _read(
        self, read: Callable[[str, int, int], bytes], path: str, offset: int, length: int
    ) -> bytes:
        self._sleep(length)
        data = read(path, offset, length)
        self.counters.add(reads=1, bytes_read=len(data))
        return data

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return self._read(self.inner.read_range, path, offset, length)

    def read_block(self, path: str, offset: int, length: int) -> bytes:
        return self._read(self.inner.read_block, path, offset, length)

    def size(self, path: str) -> int:
        self._sleep()
        self.counters.add(stats=1)
        return self.inner.size(path)

    def list(self, prefix: str = "") -> list[str]:
        self._sleep()
        self.counters.add(lists=1)
        return self.inner.list(prefix)

    def _write(self, path: str, data: bytes) -> None:
        self._sleep(len(data))
        self.inner.write(path, data)

    def _delete(self, path: str) -> None:
        self._sleep()
        self.inner.delete(path)

    def for_hedges(self) -> Driver:
        """The inner driver's way for hedges, slowed by the same model with its own draws."""
        inner = self.inner.for_hedges()
        if inner is self.inner:
            return self
        model = self.sampler.model
        return SlowDriver(inner, dataclasses.replace(model, seed=model.seed + 1))

    def close(self) -> None:
        self.inner.close()
