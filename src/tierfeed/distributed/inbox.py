"""A rank's inbox: samples received from peers, kept on local storage in published segments.

A segment is the bytes of one window's received members (``NAME.bin``) and its table
(``NAME.idx``: member ids and offsets). The table is renamed into place after the bytes,
so a reader that sees a table finds its bytes whole. Readers in other processes (DataLoader
workers) look members up in the tables they have loaded and load new ones on a miss.
A failed exchange leaves a ``FAILED`` note that readers turn into an error at once.
Stage-in keeps a rank's parts of split chunks in the same form, a segment per part, in the
rank's parts directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.cachedir import private_dir
from tierfeed.publish import publish

__all__ = [
    "Inbox",
    "InboxView",
    "is_punched",
    "mark_punched",
    "part_name",
    "parts_dir",
    "punch_holes",
    "punched_dir",
]

IntArray = npt.NDArray[np.int64]
_FAILED = "FAILED"
_IDX = ".idx"  # member ids, then their offsets: int64, little-endian


def parts_dir(local_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` keeps the parts of split chunks it staged (one segment each)."""
    return Path(local_dir) / "parts" / f"rank{rank}"


def punched_dir(local_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` marks the staged chunks it punched samples out of."""
    return Path(local_dir) / "punched" / f"rank{rank}"


def mark_punched(root: Path, chunk: int) -> None:
    """Mark chunk ``chunk`` punched (before the punch: a reader that sees no mark may take
    a piece of the file for whole; the tier's check of its whole copy is the last word)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    (root / part_name(chunk)).touch()


def is_punched(root: Path, chunk: int) -> bool:
    """Whether `mark_punched` marked chunk ``chunk`` in ``root``."""
    return (root / part_name(chunk)).exists()


def part_name(chunk: int) -> str:
    """The segment name of a staged part of chunk ``chunk``."""
    return f"chunk{chunk}"


class Inbox:
    """The writer side, owned by the rank's exchanger (one process).

    Args:
        root: the rank's inbox directory (created 0700; an existing one must not be a link,
            another user's, or writable by others: `tierfeed.cachedir`).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = private_dir(root)
        self.view = InboxView(self.root)
        # segment -> members not yet sent on or deleted (segments published before: all)
        self._live: dict[str, int] = self.view.sizes()

    def clear(self) -> None:
        """Remove every segment and note (a fresh start)."""
        for path in self.root.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
        self._live.clear()
        self.view = InboxView(self.root)

    def write(self, name: str, members: IntArray, lengths: IntArray, data: memoryview) -> None:
        """Publish a segment of ``members`` whose bytes lie back to back in ``data``."""
        publish(self.bin_path(name), data, fsync=False)
        self.add(name, members, lengths)

    def add(self, name: str, members: IntArray, lengths: IntArray, fsync: bool = False) -> None:
        """Publish the table of segment ``name``, whose bytes (``members`` back to back) are
        published already as ``bin_path(name)``."""
        offsets = np.zeros(len(members), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        table = np.stack([members, offsets]).astype(np.int64)
        publish(self.root / f"{name}{_IDX}", table.astype("<i8").tobytes(), fsync=fsync)
        self._live[name] = len(members)
        self.view.refresh()

    def bin_path(self, name: str) -> Path:
        """Where the bytes of segment ``name`` are published."""
        return self.root / f"{name}.bin"

    def discard(self, members: IntArray, lengths: IntArray | None = None) -> int:
        """Forget ``members`` (sent on to a peer); delete segments left empty, and with
        ``lengths`` free the bytes of the others' forgotten members. Returns how many of
        ``members`` the inbox held."""
        found = 0
        freed: dict[str, list[tuple[int, int]]] = {}
        for k, member in enumerate(members.tolist()):
            where = self.view.locate(member)
            if where is None:
                continue
            found += 1
            self.view.forget(member)
            name = where[0]
            if lengths is not None:
                freed.setdefault(name, []).append((where[1], int(lengths[k])))
            self._live[name] = self._live.get(name, 1) - 1
            if self._live[name] <= 0:
                self.delete(name)
                freed.pop(name, None)
        for name, ranges in freed.items():
            with contextlib.suppress(FileNotFoundError):
                punch_holes(self.bin_path(name), ranges, gap=0)
        return found

    def delete(self, name: str) -> None:
        """Remove a segment (its table first, so no reader finds a table without bytes)."""
        for suffix in (_IDX, ".bin"):
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{name}{suffix}").unlink()
        self._live.pop(name, None)
        self.view.drop(name)

    def segments(self) -> list[str]:
        """Published segment names."""
        return sorted(
            p.name[: -len(_IDX)] for p in self.root.glob(f"*{_IDX}") if not p.name.startswith(".")
        )

    def fail(self, message: str) -> None:
        """Leave a note that makes every reader of this inbox fail with ``message``."""
        publish(self.root / _FAILED, message.encode(), fsync=False)

    def close(self) -> None:
        """Close the view's files."""
        self.view.close()


class InboxView:
    """The reader side: member lookups over the published segments of an inbox."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._where: dict[int, tuple[str, int]] = {}
        self._members: dict[str, IntArray] = {}
        self._fds: dict[str, int] = {}
        self.refresh()

    def refresh(self) -> None:
        """Load the tables of segments published since the last look; drop deleted ones."""
        try:
            names = {
                p.name[: -len(_IDX)]
                for p in self.root.glob(f"*{_IDX}")
                if not p.name.startswith(".")
            }
        except OSError:
            names = set()
        for gone in set(self._members) - names:
            self.drop(gone)
        for name in sorted(names - set(self._members)):
            try:
                # Raw, not `np.load`: its header is parsed by `ast`, which CPython 3.11 may fail
                # on when another thread parses at once (python/cpython#106905).
                table = np.fromfile(self.root / f"{name}{_IDX}", dtype="<i8").reshape(2, -1)
            except (OSError, ValueError):
                continue  # deleted meanwhile (a table is published whole or not at all)
            self._members[name] = table[0]
            for member, offset in zip(table[0].tolist(), table[1].tolist(), strict=True):
                self._where[member] = (name, offset)

    def sizes(self) -> dict[str, int]:
        """Members of each loaded segment."""
        return {name: len(members) for name, members in self._members.items()}

    def locate(self, member: int) -> tuple[str, int] | None:
        """(segment, offset) of ``member``, or None."""
        return self._where.get(member)

    def forget(self, member: int) -> None:
        """Stop serving ``member`` from here."""
        self._where.pop(member, None)

    def drop(self, name: str) -> None:
        """Forget a deleted segment."""
        for member in self._members.pop(name, np.zeros(0, dtype=np.int64)).tolist():
            if self._where.get(member, ("",))[0] == name:
                del self._where[member]
        fd = self._fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def read(self, member: int, length: int) -> bytes | None:
        """The bytes of ``member`` if a loaded segment holds it."""
        where = self._where.get(member)
        if where is None:
            return None
        name, offset = where
        fd = self._fds.get(name)
        if fd is None:
            try:
                fd = os.open(self.root / f"{name}.bin", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self.drop(name)
                return None
            self._fds[name] = fd
        data = os.pread(fd, length, offset)
        return data if len(data) == length else None

    def failure(self) -> str | None:
        """The note of a failed exchange, if any."""
        try:
            return (self.root / _FAILED).read_text()
        except OSError:
            return None

    def close(self) -> None:
        """Close open segment files."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_GAP = 1536  # a ustar header plus a pax header block: what separates consecutive members


@functools.cache
def _fallocate() -> Any:
    return getattr(ctypes.CDLL(None, use_errno=True), "fallocate", None)


def punch_holes(path: Path, ranges: list[tuple[int, int]], gap: int = _GAP) -> int:
    """Free the blocks of byte ranges ``(offset, length)`` of a file (Linux fallocate).

    A partial-shuffling rank deletes each sample it sends away from its staged chunk this
    way: the chunk keeps its size and offsets, and the disk space is returned. Ranges closer
    than ``gap`` apart are freed as one: in a chunk, a tar header (the next member's own
    header); in a segment, whose members lie back to back, 0.

    Returns:
        Bytes freed; 0 where the file system cannot punch holes (the space stays in use).
    """
    fallocate = _fallocate()
    if fallocate is None or not ranges:
        return 0
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        if merged and offset - (merged[-1][0] + merged[-1][1]) <= gap:
            merged[-1][1] = offset + length - merged[-1][0]
        else:
            merged.append([offset, length])
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    freed = 0
    try:
        for offset, length in merged:
            if fallocate(fd, _PUNCH, ctypes.c_long(offset), ctypes.c_long(length)) != 0:
                err = ctypes.get_errno()
                if err in (errno.EOPNOTSUPP, errno.ENOSYS):
                    return 0
                raise OSError(err, f"fallocate(PUNCH_HOLE) on {path}")
            freed += length
    finally:
        os.close(fd)
    return freed
