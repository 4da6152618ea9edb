"""The memory driver: objects in a dict, within a byte budget (the RAM tier)."""

from __future__ import annotations

import threading

from tierfeed.errors import NotFoundError, QuotaExceededError
from tierfeed.storage.driver import Driver

__all__ = ["MemoryDriver"]


class MemoryDriver(Driver):
    """Objects held in this process's memory.

    Args:
        budget: the most bytes it may hold; a write past it raises QuotaExceededError.
    """

    name = "memory"

    def __init__(self, budget: int = 2**62, read_only: bool = False) -> None:
        super().__init__(read_only)
        self.budget = budget
        self._objects: dict[str, bytes] = {}
        self._mutex = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes held now."""
        with self._mutex:
            return sum(len(v) for v in self._objects.values())

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        with self._mutex:
            data = self._objects.get(path)
        if data is None:
            raise NotFoundError(f"{self}: no object {path!r}")
        self.counters.add(reads=1, bytes_read=min(length, max(0, len(data) - offset)))
        return data[offset : offset + length]

    def size(self, path: str) -> int:
        self.counters.add(stats=1)
        with self._mutex:
            data = self._objects.get(path)
        if data is None:
            raise NotFoundError(f"{self}: no object {path!r}")
        return len(data)

    def list(self, prefix: str = "") -> list[str]:
        self.counters.add(lists=1)
        with self._mutex:
            return sorted(p for p in self._objects if p.startswith(prefix))

    def _write(self, path: str, data: bytes) -> None:
        with self._mutex:
            used = sum(len(v) for k, v in self._objects.items() if k != path)
            if used + len(data) > self.budget:
                raise QuotaExceededError(
                    f"{self}: {path} ({len(data)} bytes) exceeds the budget of {self.budget} "
                    f"bytes ({used} in use)"
                )
            self._objects[path] = bytes(data)

    def _delete(self, path: str) -> None:
        with self._mutex:
            if self._objects.pop(path, None) is None:
                raise NotFoundError(f"{self}: no object {path!r}")
