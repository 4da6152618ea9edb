"""A strict streaming scanner of uncompressed tar shards: every byte is accounted for.

Python's tarfile is lenient by design: it stops silently at a damaged header, so a shard cut
inside its second header reads as a one-member archive. This scanner refuses instead. It walks
ustar, POSIX pax (``x`` and ``g`` records) and GNU (``L``/``K`` long names, base-256 numbers,
old sparse) headers block by block and raises a tierfeed error, naming the shard and the byte
offset, for a header checksum mismatch, a truncated header or data, a size field that is not a
number or runs past the end of the file, an extended header beyond the file or the 1 MiB cap,
a malformed pax record, and any byte after the end-of-archive marker that is not zero.

The end-of-archive marker (two zero blocks) is required: a shard that ends right after its last
member's padding is refused as truncated, because a copy cut at a block boundary looks exactly
like that. Zero bytes after the marker (tar's record padding, 10 KiB by default) are accepted.

Nothing is allocated by a claimed size: data is never read, and an extended header is read
only after its size was checked against the file and the cap.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tierfeed.errors import ChunkCorruptError, FormatError
from tierfeed.format.tarheader import (
    DAMAGED,
    PendingHeaders,
    check_header,
    header_size,
    member_name,
    member_size,
    nul_terminated,
    pax_records,
)

__all__ = ["MAX_EXTENDED", "TarMember", "open_shard", "scan_tar", "scan_tar_fd"]

BLOCK = 512
MAX_EXTENDED = 2**20  # bytes of pax / GNU long-name records read for one member (and globals)
_WINDOW = 2**20  # headers are read through a window of this many bytes
_ZERO = bytes(BLOCK)
_KINDS = {
    b"0": "file",
    b"\0": "file",
    b"7": "file",  # contiguous file: a regular file to every reader
    b"1": "hardlink",
    b"2": "symlink",
    b"3": "char",
    b"4": "block",
    b"5": "dir",
    b"6": "fifo",
    b"S": "sparse",
}
_EXTENDED = frozenset({b"x", b"g", b"L", b"K"})  # records about the next member (or all)
_NO_DATA = frozenset({b"1", b"2", b"3", b"4", b"5", b"6"})  # their size field is not data
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


@dataclass(frozen=True, slots=True)
class TarMember:
    """A member of a tar as its headers describe it.

    Attributes:
        name: the member name (pax ``path``, GNU long name or ustar prefix/name), decoded as
            UTF-8 with surrogateescape so that any bytes round-trip.
        offset: byte offset of its data in the shard.
        size: bytes of data stored after its header (0 for kinds that carry none).
        kind: ``file``, ``dir``, ``symlink``, ``hardlink``, ``char``, ``block``, ``fifo``,
            ``sparse`` or ``other``; callers refuse or skip what is not ``file`` or ``dir``.
        header_offset: byte offset of its first header block (extended headers included).
    """

    name: str
    offset: int
    size: int
    kind: str
    header_offset: int = 0

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def end(self) -> int:
        """Offset just past its data's padding: where the next header starts."""
        return self.offset + self.size + (-self.size % BLOCK)


def open_shard(path: Path) -> int:
    """Open a shard for reading without blocking; refuse anything but a regular file.

    ``O_NONBLOCK`` keeps a FIFO from hanging the open; the type is checked on the open
    descriptor, so a path swapped after a stat cannot slip through.

    Raises:
        FormatError: missing, unreadable, or not a regular file (names the path).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FormatError(f"{path}: no such shard (does not exist); check the path") from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot open shard: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = (
            "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
        )
        raise FormatError(f"{path}: is {what}; a shard must be a plain uncompressed .tar file")
    return fd


def scan_tar(path: Path) -> Iterator[TarMember]:
    """Yield the members of the uncompressed tar at ``path`` without reading their data.

    Raises:
        ChunkCorruptError: the shard is not a well-formed tar (names the byte offset).
        FormatError: the shard is missing, not a regular file, or cannot be read.
    """
    fd = open_shard(path)
    try:
        yield from scan_tar_fd(fd, str(path))
    finally:
        os.close(fd)


class _Window:
    """Reads of at most ``_WINDOW`` bytes served from one cached ``pread`` window."""

    def __init__(self, fd: int, where: str) -> None:
        self.fd, self.where = fd, where
        self.start, self.buf = 0, b""

    def read(self, offset: int, n: int) -> bytes:
        rel = offset - self.start
        if rel < 0 or rel + n > len(self.buf):
            try:
                self.buf = os.pread(self.fd, max(n, _WINDOW), offset)
            except OSError as exc:
                raise FormatError(
                    f"{self.where}: cannot read at byte {offset}: {exc.strerror or exc}"
                ) from None
            self.start, rel = offset, 0
        got = self.buf[rel : rel + n]
        if len(got) != n:
            raise ChunkCorruptError(
                f"{self.where}: the file ended at byte {offset + len(got)} while tierfeed read "
                f"it (it shrank or is being written); index it once it is complete"
            )
        return got


def _extended(reader: _Window, block: bytes, pos: int, size: int, state: PendingHeaders) -> None:
    """Read one ``x``/``g``/``L``/``K`` header's data into ``state`` (size already in file)."""
    where = reader.where
    kind = block[156:157]
    state.first = pos if state.first < 0 else state.first
    state.dangling = pos if state.dangling < 0 else state.dangling
    total = (state.global_bytes if kind == b"g" else state.bytes) + size
    if total > MAX_EXTENDED:
        raise ChunkCorruptError(
            f"{where}: the extended header at byte {pos} brings its records to {total} bytes; "
            f"tierfeed reads at most {MAX_EXTENDED // 2**20} MiB of pax/GNU name records per "
            f"member: {DAMAGED}"
        )
    data = reader.read(pos + BLOCK, size)
    _check_padding(reader, pos, pos + BLOCK + size)
    if kind == b"g":
        state.global_bytes = total
        for key, value in pax_records(data, pos + BLOCK, pos, where).items():
            if value:
                state.globals[key] = value
            else:
                state.globals.pop(key, None)
        return
    state.bytes = total
    if kind in state.seen or (kind in (b"x", b"L") and {b"x", b"L"} & state.seen):
        # Readers disagree on which of two name sources wins (tarfile: the first; GNU tar:
        # pax): an archive that gives a member two names is refused, not guessed at.
        raise ChunkCorruptError(
            f"{where}: the extended header at byte {pos} is the second {kind.decode()!r} or "
            f"name header for one member (the first is at byte {state.dangling}); {DAMAGED}"
        )
    state.seen.add(kind)
    if kind == b"x":
        state.pax.update(pax_records(data, pos + BLOCK, pos, where))
    elif kind == b"L":
        state.long_name = nul_terminated(data)


def _check_padding(reader: _Window, pos: int, end: int) -> None:
    """The padding from ``end`` to the next block boundary must be zero: tar writers zero it,
    and garbage there means the size field of the header at ``pos`` understates its data."""
    pad = -end % BLOCK
    if pad and reader.read(end, pad).count(0) != pad:
        raise ChunkCorruptError(
            f"{reader.where}: non-zero padding at bytes {end}+{pad} after the data of the header "
            f"at byte {pos}: its size field understates the data, or {DAMAGED}"
        )


def _past_end(where: str, pos: int, what: str, size: int, file_size: int) -> ChunkCorruptError:
    return ChunkCorruptError(
        f"{where}: the {what} at byte {pos} claims {size} bytes, which runs past the end of the "
        f"file ({file_size} bytes): the shard is truncated or its header is damaged; copy it "
        "again"
    )


def _check_end(reader: _Window, pos: int, file_size: int) -> None:
    """After the first zero block at ``pos``: only zeros to the end, at least two blocks."""
    at = pos + BLOCK
    while at < file_size:
        chunk = reader.read(at, min(_WINDOW, file_size - at))
        if chunk.count(0) != len(chunk):
            bad = at + len(chunk) - len(chunk.lstrip(b"\0"))
            raise ChunkCorruptError(
                f"{reader.where}: byte {bad} is not zero, after the end-of-archive marker at "
                f"byte {pos}: trailing garbage, a concatenated archive or a damaged header; "
                "tierfeed indexes one archive per shard"
            )
        at += len(chunk)
    if file_size < pos + 2 * BLOCK:
        raise ChunkCorruptError(
            f"{reader.where}: ends at byte {file_size} inside the end-of-archive marker (two "
            f"zero blocks from byte {pos}): the shard is truncated; copy it again"
        )


def _check_start(reader: _Window, file_size: int) -> None:
    """Refuse an empty file and a compressed one before reading any header."""
    where = reader.where
    if file_size == 0:
        raise ChunkCorruptError(f"{where}: is empty, not a tar; {DAMAGED}")
    head = reader.read(0, min(8, file_size))
    packed = next((k for m, k in _COMPRESSED.items() if head.startswith(m)), None)
    if packed:
        raise ChunkCorruptError(
            f"{where}: is {packed}-compressed; tierfeed indexes plain uncompressed .tar shards "
            "in place: decompress it first"
        )


def _no_header(where: str, pos: int, file_size: int) -> ChunkCorruptError:
    """The error for a file that ends where a header block should start, at ``pos``."""
    if pos < file_size:
        return ChunkCorruptError(
            f"{where}: truncated tar header at byte {pos} ({file_size - pos} of "
            f"{BLOCK} bytes): the shard was cut short; copy it again"
        )
    return ChunkCorruptError(
        f"{where}: ends at byte {pos} without the end-of-archive marker (two zero "
        "blocks): the shard is truncated; copy it again"
    )


def _check_archive_end(reader: _Window, state: PendingHeaders, pos: int, file_size: int) -> None:
    """At the first zero block, ``pos``: no extended header waits for a member, and the
    end-of-archive marker is whole and followed by zeros only."""
    if state.dangling >= 0:
        raise ChunkCorruptError(
            f"{reader.where}: the extended header at byte {state.dangling} is followed by the "
            f"end of the archive, not by a member; {DAMAGED}"
        )
    _check_end(reader, pos, file_size)


def _sparse_data_start(reader: _Window, block: bytes, pos: int, file_size: int) -> int:
    """Where the data of the old GNU sparse member at ``pos`` starts: after its sparse map's
    extension blocks."""
    data = pos + BLOCK
    more = block[482]
    while more:
        if data + BLOCK > file_size:
            raise _past_end(reader.where, pos, "sparse map", data + BLOCK - pos, file_size)
        more = reader.read(data, BLOCK)[504]
        data += BLOCK
    return data


def scan_tar_fd(fd: int, where: str) -> Iterator[TarMember]:
    """Yield the members of the tar open on ``fd`` (a regular file); ``where`` names it."""
    file_size = os.fstat(fd).st_size
    reader = _Window(fd, where)
    state = PendingHeaders()
    pos = 0
    _check_start(reader, file_size)
    while True:
        if pos + BLOCK > file_size:
            raise _no_header(where, pos, file_size)
        block = reader.read(pos, BLOCK)
        if block == _ZERO:
            _check_archive_end(reader, state, pos, file_size)
            return
        check_header(block, pos, where)
        flag = block[156:157]
        if flag in _EXTENDED:
            size = header_size(block, pos, where)
            if pos + BLOCK + size + (-size % BLOCK) > file_size:
                raise _past_end(where, pos, "extended header", size, file_size)
            _extended(reader, block, pos, size, state)
            pos += BLOCK + size + (-size % BLOCK)
            continue
        size = member_size(block, pos, state, where)
        data = pos + BLOCK
        if flag == b"S":  # old GNU sparse: the map continues in extension blocks
            data = _sparse_data_start(reader, block, pos, file_size)
        kind = _KINDS.get(flag, "other")
        if flag in _NO_DATA:
            size = 0
        elif any(k.startswith(b"GNU.sparse.") for k in (*state.pax, *state.globals)):
            kind = "sparse"
        if data + size + (-size % BLOCK) > file_size:
            raise _past_end(where, pos, "member", size, file_size)
        _check_padding(reader, pos, data + size)
        name = member_name(block, state)
        if kind == "file" and flag == b"\0" and name.endswith("/"):
            kind = "dir"  # old V7 tar: a directory is a regular file with a trailing slash
        if kind == "dir":
            name = name.rstrip("/") or name
        first = state.first if state.first >= 0 else pos
        state.reset()
        yield TarMember(name, data, size, kind, first)
        pos = data + size + (-size % BLOCK)
