"""Arrivals in a disk tier's directory, shared by every process of the host (see
`tierfeed.storage.landing` for what an arrival is and the files it keeps)."""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading
import weakref
from pathlib import Path
from typing import Any

from tierfeed.cachedir import list_names, open_cache_dir, open_subdir
from tierfeed.format.chunkref import ChunkInfo, checksum_range
from tierfeed.publish import temporary_path, writer_pid
from tierfeed.storage.landing import Arrival, Landing, MemoryLanding, pieces_of, views_of

__all__ = ["FileLanding", "landing_for"]

_DIR = ".landing"
_HEADER = struct.Struct("<4sIQQ")  # magic, owner pid, piece size, chunk size
_MAGIC = b"TFL1"
_IOV_MAX = 1024  # buffers one pwritev takes (Linux's IOV_MAX)
_MAP_NAME = re.compile(r"([0-9]{8,})-([0-9a-f]{16})\.map")  # `FileLanding._names`


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

    def put(self, index: int, data: bytes | list[Any]) -> None:
        start, length = self.span(index)
        views, done = views_of(data, length), 0
        while views:  # the buffers as they came, in one call, none joined first
            wrote = os.pwritev(self._data_fd, views[:_IOV_MAX], start + done)
            done += wrote
            while views and wrote >= len(views[0]):
                wrote -= len(views.pop(0))
            if views and wrote:
                views[0] = views[0][wrote:]
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
        map_tmp, map_fd = os.fspath(temporary_path(map_name)), -1
        try:
            os.ftruncate(data_fd, info.size)
            map_fd = self._open(map_tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            header = _HEADER.pack(_MAGIC, os.getpid(), piece, info.size)
            os.pwrite(map_fd, header + bytes(pieces_of(info.size, piece)), 0)
            os.replace(map_tmp, map_name, src_dir_fd=at, dst_dir_fd=at)
        except BaseException:
            # A full disk, most likely: nothing of it is left behind, nor held open (this
            # process lives on, so `sweep` would not take its temporary map).
            _close_all([data_fd, map_fd] if map_fd >= 0 else [data_fd])
            for name in (map_tmp, data_name):
                with contextlib.suppress(OSError):
                    self._unlink(name)
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
