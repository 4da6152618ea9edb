"""The index file layout (the metadata snapshot): magic, version, a JSON header, aligned arrays.

```
offset 0   b"TIERFEED"                 magic, 8 bytes
       8   uint32 LE                   format version
      12   uint32 LE                   header length H
      16   H bytes of JSON             counts, classes, extensions, section table, checksum
      ...  sections, each 64-byte aligned, raw little-endian numpy arrays
```
Per sample 24 bytes and per member 34 bytes (plus the key bytes), or 16 and 26 where the
writer narrows offsets to 32 bits (format version 2: `NARROW`, where the values fit; a
one-file sample then takes 42-46 bytes): an index opens by memory-mapping these arrays. A
store packed from a tree also holds the optional tree sections (`TREE_SECTIONS`: modes and
mtimes of its files, and every directory); indexes without them (`tierfeed index`, `Writer`,
older packs) open unchanged. An index of shards kept outside its store names their directory
in the header (``chunk_root``, format 4: `tierfeed.format.chunkroot`); every other index is
written as format 3, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = [
    "ALIGN",
    "CHUNK_ROOT_SINCE",
    "INDEX_NAME",
    "MAGIC",
    "NARROW",
    "READS",
    "ROW_CHECKS_SINCE",
    "ROW_CHECK_SECTIONS",
    "SECTIONS",
    "TREE_SECTIONS",
    "VERSION",
    "aligned",
    "as_dtype",
    "expected_length",
    "present_sections",
    "version_of",
]

MAGIC = b"TIERFEED"
# 4: the header may name a chunk root ("chunk_root", `chunkroot`); 3: row checks
# (`ROW_CHECK_SECTIONS`); 2: "dtypes" narrows NARROW sections to <u4.
VERSION = 4
READS = (1, 2, 3, 4)  # versions read (1: every NARROW section <u8; 1, 2: no row checks)
ROW_CHECKS_SINCE = 3  # an index of this version or later must hold the row checks
CHUNK_ROOT_SINCE = 4  # only an index of this version or later may name a chunk root
ALIGN = 64
INDEX_NAME = "index.tfi"

# name -> (dtype, length kind): "s" samples, "s+1" samples + 1, "m" members, "c" chunks,
# "c+1" chunks + 1, "blob" raw bytes. path_order's dtype is widened when members >= 2**32.
SECTIONS: dict[str, tuple[str, str]] = {
    "sample_member_start": ("<u8", "s+1"),  # members of sample i: [start[i], start[i+1])
    "sample_key_offset": ("<u8", "s+1"),  # key of sample i: keys[off[i]:off[i+1]]
    "sample_label": ("<i4", "s"),  # class index, -1 when unlabelled
    "sample_chunk": ("<u4", "s"),  # chunk holding every member of the sample
    "member_chunk": ("<u4", "m"),
    "member_offset": ("<u8", "m"),  # offset of the member's data in its chunk
    "member_length": ("<u8", "m"),
    "member_checksum": ("<u8", "m"),  # xxh3_64 of the member data: reads check it
    "member_ext": ("<u2", "m"),  # index into the header's extension table
    "path_order": ("<u4", "m"),  # member ids sorted by path bytes (path lookup, listdir)
    "keys": ("u1", "blob"),
    "chunk_name_offset": ("<u8", "c+1"),
    "chunk_names": ("u1", "blob"),
    "chunk_size": ("<u8", "c"),
    "chunk_checksum": ("<u8", "c"),
}

# Row checks (format 3, `tierfeed.format.rowcheck`): what a lazily opened index verifies of
# each row it reads. Older indexes lack them and are opened checked in full.
ROW_CHECK_SECTIONS: dict[str, tuple[str, str]] = {
    "sample_check": ("<u8", "s"),  # low 32 bits: the row and its members; high: the key
    "chunk_check": ("<u8", "c"),  # low 32 bits: the chunk's row; high: its name
}

# The tree: present all together (with the header count "dirs") or not at all. "d" is the
# number of directories of the tree, the root excluded, sorted bytewise by path.
TREE_SECTIONS: dict[str, tuple[str, str]] = {
    "member_mode": ("<u2", "m"),  # permission bits (S_IMODE) of the packed file
    "member_mtime": ("<i8", "m"),  # mtime of the packed file, nanoseconds since the epoch
    "dir_path_offset": ("<u8", "d+1"),  # path of directory i: dir_paths[off[i]:off[i+1]]
    "dir_paths": ("u1", "blob"),
    "dir_mode": ("<u2", "d"),
    "dir_mtime": ("<i8", "d"),
}


# Sections written as <u4 where every value fits (the header's "dtypes" names them): offsets
# into the members and keys, and member offsets and lengths when every chunk is < 4 GiB (so
# offset + length fits too).
NARROW = ("sample_member_start", "sample_key_offset", "member_offset", "member_length")


def present_sections(names: object) -> dict[str, tuple[str, str]]:
    """The sections an index with this section table holds, in file and checksum order:
    `SECTIONS`, then `ROW_CHECK_SECTIONS` and `TREE_SECTIONS`, each when the table names any
    of its sections."""
    present = dict(SECTIONS)
    for optional in (ROW_CHECK_SECTIONS, TREE_SECTIONS):
        if isinstance(names, dict) and any(name in names for name in optional):
            present |= optional
    return present


def version_of(header: Mapping[str, object]) -> int:
    """The format version an index with this header is written as: the oldest that holds it
    (an index naming no chunk root stays format 3, which readers older than 4 open)."""
    return CHUNK_ROOT_SINCE if "chunk_root" in header else ROW_CHECKS_SINCE


def aligned(n: int) -> int:
    """Round ``n`` up to the section alignment."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def expected_length(
    kind: str, samples: int, members: int, chunks: int, dirs: int = 0
) -> int | None:
    """Number of elements a section of this length kind must have (None for blobs)."""
    return {
        "s": samples,
        "s+1": samples + 1,
        "m": members,
        "c": chunks,
        "c+1": chunks + 1,
        "d": dirs,
        "d+1": dirs + 1,
    }.get(kind)


def as_dtype(spec: str) -> np.dtype[np.generic]:
    """The numpy dtype of a section spec."""
    return np.dtype(spec)
