"""Chunks on their way into the tiers: the bytes fetched so far, and which pieces have landed.

The process that copies a chunk from the origin (the one holding its claim) fetches it as
pieces, in parallel, into an `Arrival`; a read of that chunk whose bytes have landed is served
from it, and one whose bytes are still on their way waits for them (a bounded wait) instead
of reading the origin a second time. An arrival is never a cache entry: the chunk is placed in
the tiers only once every piece has landed and the whole was checked against the index; then
the arrival ends. A read served from it is still checked against its member's checksum.

Two kinds, one interface. `FileLanding` keeps arrivals in a disk tier's directory, so every
process of a host (DataLoader workers, ranks) reads from the one fetch in flight:

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

import contextlib
import os
import re
import struct
import threading
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from tierfeed.cachedir import list_names, open_cache_dir, open_subdir
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes, checksum_range
from tierfeed.publish import temporary_path, writer_pid
from tierfeed.telemetry.counters import Counters

__all__ = ["Arrival", "FetchCounters", "FileLanding", "Landing", "MemoryLanding", "landing_for"]

_DIR = ".landing"
_HEADER = struct.Struct("<4sIQQ")  # magic, owner pid, piece size, chunk size
_MAGIC = b"TFL1"
_POLL_FIRST_S = 0.001
_POLL_MAX_S = 0.02
_MAP_NAME = re.compile(r"([0-9]{8,})-([0-9a-f]{16})\.map")  # `FileLanding._names`


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


def _pieces(size: int, piece: int) -> int:
    return max(1, -(-size // piece))


class Arrival(ABC):
    """One chunk being fetched: its pieces of ``piece`` bytes, each landed or not yet."""

    def __init__(self, info: ChunkInfo, piece: int) -> None:
        self.info = info
        self.piece = piece
        self.pieces = _pieces(info.size, piece)

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
    def put(self, index: int, data: bytes) -> None:
        """Write piece ``index`` (the fetcher), then record it landed."""

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

    def put(self, index: int, data: bytes) -> None:
        start, length = self.span(index)
        self._data[start : start + length] = data[:length]
        self._state[index] = 1

    def alive(self) -> bool:
        return not self.ended


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


def _map_header(name: str, dir_fd: int) -> tuple[bytes, int] | None:
    """(magic, fetcher's pid) of the arrival's map ``name`` in the directory open as
    ``dir_fd``; None if it is too short to hold them.

    Raises:
        OSError: the map cannot be read (gone, say).
    """
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        header = os.pread(fd, _HEADER.size, 0)
    finally:
        os.close(fd)
    if len(header) != _HEADER.size:
        return None
    magic, owner, _, _ = _HEADER.unpack(header)
    return magic, owner


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


class _FileArrival(Arrival):
    """An arrival in a directory: the data file and its map, open in this process."""

    def __init__(
        self, info: ChunkInfo, piece: int, path: Path, data_fd: int, map_fd: int, owner: int
    ) -> None:
        super().__init__(info, piece)
        self.path = path
        self._data_fd, self._map_fd, self.owner = data_fd, map_fd, owner

    def digest(self) -> tuple[int, int]:
        # In blocks from the file: no copy of the whole chunk in memory.
        return checksum_range(self._data_fd, 0, self.info.size)

    def landed_file(self) -> tuple[Path, int] | None:
        return self.path, self._data_fd

    def _landed(self) -> bytes:
        return os.pread(self._map_fd, self.pieces, _HEADER.size)

    def _read(self, offset: int, length: int) -> bytes:
        parts, done = [], 0
        while done < length:
            part = os.pread(self._data_fd, length - done, offset + done)
            if not part:
                break  # truncated behind our back: the member checksum refuses it
            parts.append(part)
            done += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def put(self, index: int, data: bytes) -> None:
        start, length = self.span(index)
        view, done = memoryview(data)[:length], 0
        while done < length:
            done += os.pwrite(self._data_fd, view[done:], start + done)
        os.pwrite(self._map_fd, b"\x01", _HEADER.size + index)

    def alive(self) -> bool:
        # Ended (its map unlinked: placed, or failed) or its fetcher gone: nothing will land.
        try:
            ended = os.fstat(self._map_fd).st_nlink == 0
        except OSError:
            return False
        return not ended and _pid_alive(self.owner)

    def close(self) -> None:
        for fd in (self._data_fd, self._map_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._data_fd = self._map_fd = -1


class FileLanding(Landing):
    """Arrivals in ``root/.landing``, shared by every process of the host that uses ``root``.

    The directory and its ``.landing`` are checked and held open (`tierfeed.cachedir`):
    every file of ``.landing`` is created, opened and removed relative to them, never
    through a link.

    Args:
        root: a disk tier's directory.
        file_mode: mode of the files it creates (the tier's).

    Raises:
        ConfigError: ``root`` is a link, another user's (root's may be shared), or writable
            by others without being sticky.
        StorageError: there is no directory ``root``.
    """

    def __init__(self, root: Path, file_mode: int = 0o600) -> None:
        self.dir = root / _DIR
        self._mode = file_mode
        # The tier's driver made the directory and checked it as what it is (private or
        # shared); checked here as a shared one, which either kind passes.
        root_fd = open_cache_dir(root, shared=True, create=False)
        self._fds = [root_fd]  # the root's, then ``.landing``'s once it is there
        weakref.finalize(self, _close_all, self._fds)
        self._lock = threading.Lock()

    def _at(self, create: bool = False) -> int:
        """The descriptor of ``.landing`` (made if ``create``; FileNotFoundError if none)."""
        if len(self._fds) == 1:
            with self._lock:
                if len(self._fds) == 1:
                    mode = 0o700 if self._mode == 0o600 else 0o755
                    self._fds.append(open_subdir(self._fds[0], _DIR, mode, create))
        return self._fds[1]

    def _names(self, info: ChunkInfo) -> tuple[str, str]:
        """The arrival's data file and map, in ``.landing``."""
        key = f"{info.id:08d}-{info.checksum:016x}"
        return key, f"{key}.map"

    def _open(self, name: str, flags: int, create: bool = False) -> int:
        flags |= os.O_CLOEXEC | os.O_NOFOLLOW
        return os.open(name, flags, self._mode, dir_fd=self._at(create))

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self._at())

    def begin(self, info: ChunkInfo, piece: int) -> Arrival:
        data_name, map_name = self._names(info)
        at = self._at(create=True)
        # New files, not the old ones rewritten: a reader still holding a dead fetch's files
        # keeps reading what they held. The map appears last, so a reader that finds it finds
        # the data file too.
        for old in (map_name, data_name):
            self._unlink(old)
        data_fd = self._open(data_name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            os.ftruncate(data_fd, info.size)
            map_tmp = os.fspath(temporary_path(map_name))
            map_fd = self._open(map_tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            header = _HEADER.pack(_MAGIC, os.getpid(), piece, info.size)
            os.pwrite(map_fd, header + bytes(_pieces(info.size, piece)), 0)
            os.replace(map_tmp, map_name, src_dir_fd=at, dst_dir_fd=at)
        except BaseException:
            os.close(data_fd)
            with contextlib.suppress(OSError):
                self._unlink(data_name)
            raise
        return _FileArrival(info, piece, self.dir / data_name, data_fd, map_fd, os.getpid())

    def find(self, info: ChunkInfo) -> Arrival | None:
        data_name, map_name = self._names(info)
        try:
            map_fd = self._open(map_name, os.O_RDWR)
        except OSError:
            return None
        try:
            data_fd = self._open(data_name, os.O_RDONLY)
        except OSError:
            os.close(map_fd)
            return None
        arrival: Arrival | None = None
        try:
            header = os.pread(map_fd, _HEADER.size, 0)
            if len(header) == _HEADER.size:
                magic, owner, piece, size = _HEADER.unpack(header)
                # Anything else is not ours to serve: a damaged or foreign map is ignored.
                if magic == _MAGIC and size == info.size and piece > 0:
                    where = self.dir / data_name
                    arrival = _FileArrival(info, piece, where, data_fd, map_fd, owner)
        finally:
            if arrival is None:
                os.close(data_fd)
                os.close(map_fd)
        return arrival

    def in_flight(self) -> set[tuple[int, int]]:
        # The published maps (a map appears last, and goes first when a fetch ends) whose
        # fetcher lives: a killed fetcher's map, left until a sweep, lands nothing.
        out = set()
        with contextlib.suppress(OSError):
            at = self._at()
            for name in list_names(at):
                m = _MAP_NAME.fullmatch(name)
                if m is None:
                    continue
                try:
                    found = _map_header(name, at)
                except OSError:
                    continue
                if found is not None and found[0] == _MAGIC and _pid_alive(found[1]):
                    out.add((int(m.group(1)), int(m.group(2), 16)))
        return out

    def end(self, arrival: Arrival) -> None:
        for name in reversed(self._names(arrival.info)):
            self._unlink(name)
        arrival.close()

    def sweep(self) -> int:
        removed = 0
        try:
            at = self._at()
        except OSError:
            return 0  # no arrivals yet (or none of ours to sweep)
        for name in list_names(at):
            writer = writer_pid(name)
            if writer is not None and not _pid_alive(writer):  # a map never published
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=at)
            if writer is not None or not name.endswith(".map"):
                continue
            try:
                found = _map_header(name, at)
            except OSError:
                continue
            owner = found[1] if found is not None else 0
            if owner and _pid_alive(owner):
                continue
            for gone in (name, name[: -len(".map")]):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(gone, dir_fd=at)
            removed += 1
        return removed


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def landing_for(root: Path | None, file_mode: int = 0o600) -> Landing:
    """Arrivals shared by the host in a disk tier's directory, else in this process."""
    return MemoryLanding() if root is None else FileLanding(root, file_mode)
