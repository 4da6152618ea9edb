"""Parsing one tar header block and the pax records that amend it: pure, no I/O.

Used by the strict scanner (`tierfeed.format.tarscan`); every error names the shard and the
byte offset of the header it concerns.
"""

from __future__ import annotations

import re

from tierfeed.errors import ChunkCorruptError

__all__ = [
    "DAMAGED",
    "PendingHeaders",
    "check_header",
    "decode_name",
    "header_number",
    "header_size",
    "member_name",
    "member_size",
    "nul_terminated",
    "pax_records",
]

DAMAGED = "the shard is damaged or crafted; re-create or copy it again"
_OCTAL = re.compile(rb" *([0-7]+)[ \0]*")


def header_number(field: bytes) -> int | None:
    """A numeric header field: octal digits, or GNU base-256 (positive only); None if neither."""
    if field[0] == 0x80:
        return int.from_bytes(field[1:], "big")
    match = _OCTAL.fullmatch(field)
    return int(match[1], 8) if match else None


def decode_name(raw: bytes) -> str:
    """Name bytes as text; undecodable bytes round-trip (surrogateescape)."""
    return raw.decode("utf-8", "surrogateescape")


def nul_terminated(field: bytes) -> bytes:
    """A header string field up to its first NUL."""
    nul = field.find(b"\0")
    return field if nul < 0 else field[:nul]


def check_header(block: bytes, pos: int, where: str) -> None:
    """Checksum (unsigned or historic signed) and magic of one header block."""
    stored = header_number(block[148:156]) if block[148] != 0x80 else None
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    if stored is None or (
        stored != unsigned
        and stored != unsigned - 256 * sum(b >= 128 for b in block[:148] + block[156:])
    ):
        raise ChunkCorruptError(
            f"{where}: the block at byte {pos} is not a tar header (header checksum mismatch)"
            f": the previous member's size is wrong or {DAMAGED}; tierfeed indexes "
            "plain uncompressed .tar shards only"
        )
    magic = block[257:265]
    if not (magic[:6] == b"ustar\0" or magic == b"ustar  \0" or magic == bytes(8)):
        raise ChunkCorruptError(
            f"{where}: the header at byte {pos} has an unknown magic {magic!r}; {DAMAGED}"
        )


def pax_records(data: bytes, at: int, header: int, where: str) -> dict[bytes, bytes]:
    """Parse ``"<len> <key>=<value>\\n"`` records that must tile ``data`` exactly."""
    out: dict[bytes, bytes] = {}
    i = 0
    while i < len(data):
        space = data.find(b" ", i, i + 21)
        digits = data[i:space]
        length = int(digits) if space > i and digits.isdigit() else -1
        end = i + length
        eq = data.find(b"=", space + 1, end)
        if length < 5 or end > len(data) or data[end - 1] != 0x0A or eq <= space + 1:
            raise ChunkCorruptError(
                f"{where}: malformed pax record at byte {at + i} (the extended header at byte "
                f"{header} holds {len(data)} bytes of records); {DAMAGED}"
            )
        out[data[space + 1 : eq]] = data[eq + 1 : end - 1]
        i = end
    return out


class PendingHeaders:
    """Extended header state that applies to the next member (and pax globals)."""

    def __init__(self) -> None:
        self.globals: dict[bytes, bytes] = {}
        self.global_bytes = 0
        self.reset()

    def reset(self) -> None:
        """Forget what applied to the member just read (the pax globals stay)."""
        self.pax: dict[bytes, bytes] = {}
        self.long_name: bytes | None = None
        self.first = -1  # offset of the first extended header (pax globals too) before it
        self.dangling = -1  # offset of an extended header that still waits for its member
        self.seen: set[bytes] = set()  # x/L/K kinds already read for the next member
        self.bytes = 0

    def value(self, key: bytes) -> bytes | None:
        """The pax record ``key`` for the next member: its own, else the global one."""
        # An empty 'x' value deletes the header field too (POSIX): an empty path is no name,
        # an empty size is not a number. (Empty 'g' values were deleted when read.)
        return self.pax[key] if key in self.pax else self.globals.get(key)


def header_size(block: bytes, pos: int, where: str) -> int:
    """The size field of the header at ``pos``."""
    size = header_number(block[124:136])
    if size is None:
        raise ChunkCorruptError(
            f"{where}: the header at byte {pos} has a size field that is not a number "
            f"({block[124:136]!r}); {DAMAGED}"
        )
    return size


def member_size(block: bytes, pos: int, state: PendingHeaders, where: str) -> int:
    """The header's size, or the pax ``size`` record that replaces it."""
    override = state.value(b"size")
    if override is None:
        return header_size(block, pos, where)
    if override.isdigit() and len(override) <= 20:
        return int(override)
    raise ChunkCorruptError(
        f"{where}: the pax size record of the member at byte {pos} is not a number "
        f"({override[:40]!r}); {DAMAGED}"
    )


def member_name(block: bytes, state: PendingHeaders) -> str:
    """The member's name: a GNU long name, else a pax ``path``, else ustar prefix/name."""
    if state.long_name is not None:
        return decode_name(state.long_name)
    path = state.value(b"path")
    if path is not None:
        return decode_name(path)
    name = nul_terminated(block[0:100])
    prefix = nul_terminated(block[345:500]) if block[257:263] == b"ustar\0" else b""
    return decode_name(prefix + b"/" + name if prefix else name)
