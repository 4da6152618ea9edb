"""Chunks on their way into the tiers: the bytes fetched so far, and which pieces have landed.

The process that copies a chunk from the origin (the one holding its claim) fetches it as
pieces, in parallel, into an `Arrival`; a read of that chunk whose bytes have landed is served
from it, and one whose bytes are still on their way waits for them (a bounded wait) instead
of reading the origin a second time. An arrival is never a cache entry: the chunk is placed in
the tiers only once every piece has landed and the whole was checked against the index; then
the arrival ends. A read served from it is still checked against its member's checksum.

Two kinds, one interface. `FileLanding` (`tierfeed.storage.filelanding`) keeps arrivals in a
disk tier's directory, so every process of a host (DataLoader workers, ranks) reads from the
one fetch in flight:

- ``.landing/KEY``: the chunk's bytes, written in place piece by piece;
- ``.landing/KEY.map``: a header (the fetching process, the piece size) and one byte per
  piece, set after that piece's bytes were written (on one host, a reader that sees the byte
  sees the bytes).

A fetching process killed midway leaves an arrival whose owner is gone: readers stop waiting
for it, the next copy starts a fresh one (new files, so a reader holding the old ones reads
consistent bytes), and `sweep` removes it. `MemoryLanding` is the same for a process without
a disk tier.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.telemetry.counters import Counters

__all__ = ["Arrival", "FetchCounters", "Landing", "MemoryLanding", "pieces_of"]

_POLL_FIRST_S = 0.001
_POLL_MAX_S = 0.02


@dataclass
class FetchCounters(Counters[float]):
    """What copies in flight did: pieces fetched, and reads they served."""

    pieces: int = 0  # origin reads of copies
    piece_bytes: int = 0
    served: int = 0  # reads served from a copy in flight
    served_bytes: int = 0
    gave_up: int = 0  # reads that waited for a copy in flight, then read the origin
    waited_s: float = 0.0
    hedges: int = 0  # second requests for pieces that ran late (`PieceFetch`)
    hedge_wins: int = 0  # pieces landed by their second request


def pieces_of(size: int, piece: int) -> int:
    return max(1, -(-size // piece))


class Arrival(ABC):
    """One chunk being fetched: its pieces of ``piece`` bytes, each landed or not yet."""

    def __init__(self, info: ChunkInfo, piece: int) -> None:
        self.info = info
        self.piece = piece
        self.pieces = pieces_of(info.size, piece)

    def span(self, index: int) -> tuple[int, int]:
        """Offset and length of piece ``index``."""
        start = index * self.piece
        return start, min(self.piece, self.info.size - start)

    @abstractmethod
    def _landed(self) -> bytes:
        """One byte per piece, nonzero where it landed."""

    @abstractmethod
    def _read(self, offset: int, length: int) -> bytes:
        """Bytes at ``offset`` (landed ones only are asked for)."""

    @abstractmethod
    def put(self, index: int, data: bytes | list[Any]) -> None:
        """Write piece ``index`` (the fetcher), then record it landed: its bytes, or the
        buffers they arrived in, in order (`Driver.read_parts`), written as they are."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether its fetcher is still at work (False: nothing more will land)."""

    def close(self) -> None:  # noqa: B027 - memory arrivals hold nothing
        """Release what this process holds of it."""

    def complete(self) -> bool:
        """Whether every piece has landed."""
        landed = self._landed()
        return len(landed) == self.pieces and all(landed)

    def whole(self) -> bytes:
        """The whole chunk; only once `complete`."""
        return self._read(0, self.info.size)

    def digest(self) -> tuple[int, int]:
        """(bytes, checksum) of the whole chunk as landed; only once `complete`."""
        data = self.whole()
        return len(data), checksum_bytes(data)

    def landed_file(self) -> tuple[Path, int] | None:
        """The file the bytes landed in and a descriptor open on it, for a tier that can take
        the file itself (`Driver.adopt`); None when they landed in memory."""
        return None

    def read(self, offset: int, length: int, wait_s: float) -> bytes | None:
        """The range once its pieces have landed, waiting at most ``wait_s`` seconds for
        them; None when they do not land in time, the fetch died, or the range is outside the
        chunk (the caller then reads the origin)."""
        if offset < 0 or length < 0 or offset + length > self.info.size:
            return None
        first = offset // self.piece
        last = max(first, (offset + length - 1) // self.piece)
        deadline = time.monotonic() + wait_s
        pause = _POLL_FIRST_S
        while True:
            landed = self._landed()
            if len(landed) == self.pieces and all(landed[first : last + 1]):
                return self._read(offset, length)
            now = time.monotonic()
            if now >= deadline or not self.alive():
                return None
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, _POLL_MAX_S)


class Landing(ABC):
    """Where chunks land while they are fetched."""

    @abstractmethod
    def begin(self, info: ChunkInfo, piece: int) -> Arrival:
        """A fresh arrival for ``info`` (the fetcher, holding the chunk's claim)."""

    @abstractmethod
    def find(self, info: ChunkInfo) -> Arrival | None:
        """The arrival of ``info`` in flight now, if any (a reader; `Arrival.close` it)."""

    @abstractmethod
    def end(self, arrival: Arrival) -> None:
        """The fetch is over (placed, or failed): readers no longer find it."""

    def sweep(self) -> int:
        """Remove arrivals whose fetcher is gone; returns how many."""
        return 0

    @abstractmethod
    def in_flight(self) -> set[tuple[int, int]]:
        """(chunk id, chunk checksum) of every arrival in flight now, whoever fetches it."""


class _MemoryArrival(Arrival):
    def __init__(self, info: ChunkInfo, piece: int) -> None:
        super().__init__(info, piece)
        self._data = bytearray(info.size)
        self._state = bytearray(self.pieces)
        self.ended = False

    def _landed(self) -> bytes:
        return bytes(self._state)

    def _read(self, offset: int, length: int) -> bytes:
        return bytes(self._data[offset : offset + length])

    def put(self, index: int, data: bytes | list[Any]) -> None:
        start, length = self.span(index)
        for view in views_of(data, length):
            self._data[start : start + len(view)] = view
            start += len(view)
        self._state[index] = 1

    def alive(self) -> bool:
        return not self.ended


def views_of(data: bytes | list[Any], length: int) -> list[memoryview]:
    """The first ``length`` bytes of ``data`` (bytes, or buffers in order) as byte views, none
    copied."""
    views, left = [], length
    for part in [data] if isinstance(data, bytes) else data:
        view = memoryview(part).cast("B")[:left]
        if view:
            views.append(view)
            left -= len(view)
    return views


class MemoryLanding(Landing):
    """Arrivals in this process's memory (a tier stack without a disk tier)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals: dict[int, _MemoryArrival] = {}

    def begin(self, info: ChunkInfo, piece: int) -> Arrival:
        arrival = _MemoryArrival(info, piece)
        with self._lock:
            self._arrivals[info.id] = arrival
        return arrival

    def find(self, info: ChunkInfo) -> Arrival | None:
        with self._lock:
            return self._arrivals.get(info.id)

    def in_flight(self) -> set[tuple[int, int]]:
        with self._lock:
            return {(a.info.id, a.info.checksum) for a in self._arrivals.values()}

    def end(self, arrival: Arrival) -> None:
        with self._lock:
            if self._arrivals.get(arrival.info.id) is arrival:
                del self._arrivals[arrival.info.id]
        if isinstance(arrival, _MemoryArrival):
            arrival.ended = True
