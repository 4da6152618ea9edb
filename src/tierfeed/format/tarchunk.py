"""Chunks are plain POSIX tar: build member headers, write a chunk atomically, scan a shard.

Headers come from the standard library's tarfile (ustar, with pax records only where a name
needs them); data is written here so that every member's data offset is known exactly and the
chunk checksum is computed while writing, without a second pass.
"""

from __future__ import annotations

import errno
import os
import tarfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tierfeed.errors import WriteError
from tierfeed.format.chunkref import new_hasher
from tierfeed.format.tarscan import BLOCK, TarMember, scan_tar  # the strict scanner, re-exported
from tierfeed.publish import publishing

__all__ = [
    "BLOCK",
    "ChunkWriter",
    "TarMember",
    "cannot_write",
    "fsync_path",
    "header_length",
    "member_header",
    "padding",
    "scan_tar",
    "sync_files",
]

_END = b"\0" * (2 * BLOCK)  # end-of-archive marker: two zero blocks
_ZEROS = memoryview(bytes(BLOCK))  # padding, sliced
_BATCH_BYTES = 4 * 2**20  # member bytes gathered before one write
_BATCH_PARTS = 1000  # buffers in one writev: under IOV_MAX (1024 on Linux)
_IN_FLIGHT = 4  # batches queued for the chunk's thread: memory stays bounded


def padding(size: int) -> int:
    """Bytes of zero padding after a member of ``size`` bytes."""
    return -size % BLOCK


def _plain_ustar(path: bytes, size: int, mtime: int) -> bool:
    """Whether a member's header is one ustar block (no pax record needed)."""
    return len(path) <= 100 and path.isascii() and 0 <= size < 8**11 and 0 <= mtime < 8**11


def header_length(path: bytes, size: int, mtime: int) -> int:
    """Length of `member_header`'s result, without building it in the common ustar case."""
    return BLOCK if _plain_ustar(path, size, mtime) else len(member_header(path, size, mtime))


def sync_files(paths: list[Path]) -> list[int]:
    """fsync ``paths`` and their directories, so what is published later is on disk first;
    the files' mtimes (ns) as synced."""
    for path in [*paths, *{p.parent for p in paths}]:
        fsync_path(path)
    return [path.stat().st_mtime_ns for path in paths]


def fsync_path(path: Path) -> None:
    """fsync the file or directory at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tarfile_header(path: bytes, size: int, mtime: int, mode: int) -> bytes:
    info = tarfile.TarInfo(os.fsdecode(path))
    info.size = size
    info.mtime = mtime
    info.mode = mode & 0o7777
    info.type = tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


# tarfile's plain ustar header of a regular file; `member_header` puts name, mode, size, mtime
# and checksum between its unchanging parts, far faster than tarfile (which took half of a
# Writer's time per sample: docs/BENCHMARKS.md): the checksum is the sum of the unchanging
# bytes (the checksum field counted as spaces), kept, plus the sum of the fields put in.
_TEMPLATE = _tarfile_header(b"a", 0, 0, 0)
_IDS = _TEMPLATE[108:124]  # uid and gid
_TAIL = _TEMPLATE[156:]  # type, link name, magic, owner names, device numbers, prefix
_FIXED_SUM = sum(_IDS) + sum(_TAIL) + 8 * ord(" ")


def member_header(path: bytes, size: int, mtime: int = 0, mode: int = 0o644) -> bytes:
    """The tar header block(s) of a regular file member (pax records when the name needs them),
    byte for byte what tarfile writes."""
    if not _plain_ustar(path, size, mtime):
        return _tarfile_header(path, size, mtime, mode)
    mode_field = b"%07o\0" % (mode & 0o7777)
    size_field = b"%011o\0" % size
    mtime_field = b"%011o\0" % mtime
    checksum = _FIXED_SUM + sum(path) + sum(mode_field) + sum(size_field) + sum(mtime_field)
    return b"".join(
        (
            path.ljust(100, b"\0"),
            mode_field,
            _IDS,
            size_field,
            mtime_field,
            b"%06o\0 " % checksum,
            _TAIL,
        )
    )


_WRITE_ADVICE = {
    errno.ENOSPC: "free some space there or choose a DST on another file system",
    errno.EDQUOT: "your disk quota is used up; free some space or choose another DST",
    errno.EROFS: "the file system is read-only; choose a writable DST",
    errno.EACCES: "no permission to write there; choose a DST you can write",
    errno.EPERM: "no permission to write there; choose a DST you can write",
}


def cannot_write(path: Path, exc: OSError) -> WriteError:
    """The error for a failed write of a store file: names it and says what to do."""
    advice = _WRITE_ADVICE.get(exc.errno or 0, "check the destination and try again")
    return WriteError(str(path), str(exc.strerror or exc), advice)


class ChunkWriter:
    """Writes one chunk under a temporary name, hashing as it goes; `commit` publishes it.

    Members are gathered into batches of a few MiB (at most ``_BATCH_PARTS`` buffers, under
    the system's ``IOV_MAX``) and each batch is hashed and written with one ``writev`` on a
    thread of the chunk's own, so the caller encodes or reads the next members meanwhile. The
    buffers are not copied: the bytes given to `add` must not change until `commit` returns
    (``bytes`` cannot). A failed write (disk full, quota, read-only, permissions) removes the
    partial chunk and raises `PackError` naming the chunk, at the `add` or `commit` that
    finds it; nothing half-written stays behind.
    """

    def __init__(self, path: Path, mode: int = 0o644) -> None:
        self.path = path
        try:
            # No fsync at commit: the writer syncs every chunk before it publishes the index
            # (`tierfeed.format.chunksync`), which lets the next chunk fill meanwhile. pack
            # passes its members' mode (`PackPlan.file_mode`); a Writer's samples have none.
            self._file = publishing(path, mode=mode, fsync=False)
        except OSError as exc:
            raise cannot_write(path, exc) from None
        self._hasher = new_hasher()
        self.size = 0
        self._batch: list[bytes | memoryview] = []
        self._batch_bytes = 0
        self._pool: ThreadPoolExecutor | None = None  # started by the first full batch
        self._sent: deque[Future[None]] = deque()

    def add(self, header: bytes, data: bytes | memoryview) -> int:
        """Append one member; returns the offset of its data in the chunk."""
        if type(data) is not bytes:
            data = memoryview(data).cast("B")  # len() is then its byte count
        length = len(data)
        offset = self.size + len(header)
        pad = -length % BLOCK
        batch = self._batch
        batch.append(header)
        batch.append(data)
        if pad:
            batch.append(_ZEROS[:pad])
        self.size = offset + length + pad
        self._batch_bytes += len(header) + length
        if self._batch_bytes >= _BATCH_BYTES or len(batch) >= _BATCH_PARTS:
            self._send()
        return offset

    def add_block(self, block: memoryview) -> int:
        """Append members already laid out as the chunk holds them (headers, data, padding),
        written now on the caller's thread with one write, since ``block`` may be reused once
        this returns; returns the offset of ``block`` in the chunk."""
        if self._batch or self._sent:  # what `add` gathered goes first
            self._send()
            while self._sent:
                self._wait_one()
        offset = self.size
        self._hasher.update(block)
        try:
            done = os.writev(self._file.fd, [block])
            while done < len(block):  # a short write (a signal): the rest
                done += os.writev(self._file.fd, [block[done:]])
        except OSError as exc:
            self.abort()
            raise cannot_write(self.path, exc) from None
        self.size += len(block)
        return offset

    def _send(self) -> None:
        """Hand the gathered batch to the chunk's thread (at most ``_IN_FLIGHT`` queued)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tierfeed-chunk-write")
        while len(self._sent) >= _IN_FLIGHT:
            self._wait_one()
        self._sent.append(self._pool.submit(self._write_batch, self._batch))
        self._batch, self._batch_bytes = [], 0

    def _write_batch(self, parts: list[bytes | memoryview]) -> None:
        """On the chunk's thread: hash ``parts`` in order, then write them in one go."""
        update = self._hasher.update
        total = 0
        for part in parts:
            update(part)
            total += len(part)
        done = os.writev(self._file.fd, parts)
        if done != total:  # a short write (a signal): the rest, copied once, in a loop
            self._file.write(memoryview(b"".join(parts))[done:])

    def _wait_one(self) -> None:
        """Wait for the oldest batch sent; on its error drop the chunk and say so.

        The wait is as long as that batch's write: local, as the write was before it moved to
        a thread."""
        try:
            self._sent.popleft().result()
        except OSError as exc:
            self.abort()
            raise cannot_write(self.path, exc) from None

    def commit(self) -> tuple[int, int]:
        """Finish the archive and rename it to the final name; returns (size, checksum)."""
        self._batch.append(_END)
        self.size += len(_END)
        self._send()
        while self._sent:
            self._wait_one()
        self._stop()
        try:
            self._file.commit()  # removes the temporary file when it fails
        except OSError as exc:
            raise cannot_write(self.path, exc) from None
        return self.size, self._hasher.intdigest()

    def _stop(self) -> None:
        """Join the chunk's thread, dropping batches not yet begun."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._sent.clear()

    def abort(self) -> None:
        """Drop the partial chunk (idempotent): no batch writes after this returns."""
        self._stop()
        self._batch, self._batch_bytes = [], 0
        self._file.abort()
