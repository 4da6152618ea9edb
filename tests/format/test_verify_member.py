"""`verify` on a chunk that fails its checksum names the damaged member, or the bytes outside
every member (tar headers, padding, end of archive) when no member fails."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tierfeed import verify_store
from tierfeed.format.index import Index

FILES = {b"a/x.jpg": b"x" * 3000, b"a/y.jpg": b"y" * 2000, b"b/z.jpg": b"z" * 1000}


def members(store: Path) -> dict[str, tuple[int, int]]:
    """Member path -> (offset, length) in chunk 0."""
    with Index(store) as ix:
        return {
            os.fsdecode(ix.member_path_bytes(m)): (
                int(ix.member_offset[m]),
                int(ix.member_length[m]),
            )
            for m in range(ix.num_members)
            if int(ix.member_chunk[m]) == 0
        }


def flip(store: Path, *offsets: int) -> None:
    chunk = store / "chunks" / "000000.tar"
    raw = bytearray(chunk.read_bytes())
    for at in offsets:
        raw[at] ^= 0xFF
    chunk.write_bytes(bytes(raw))


def test_the_damaged_member_is_named(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    offset, length = members(store)["a/y.jpg"]
    flip(store, offset + length // 2)
    (problem,) = verify_store(store, progress=False)
    assert "000000.tar" in problem and "checksum mismatch" in problem
    assert "1 member fails its checksum: 'a/y.jpg'" in problem
    assert f"bytes {offset}+{length}" in problem
    assert "a/x.jpg" not in problem and "b/z.jpg" not in problem
    assert "re-pack" in problem  # says what to do


def test_many_damaged_members_are_named_up_to_ten(packed: Callable[..., Path]) -> None:
    files = {f"c/s{i:02d}.bin".encode(): bytes([i]) * 700 for i in range(14)}
    store = packed(files)
    where = members(store)
    flip(store, *(offset for offset, _ in where.values()))
    (problem,) = verify_store(store, progress=False)
    assert "14 members fail their checksum" in problem
    named = re.findall(r"'c/s(\d\d)\.bin'", problem)
    assert named == [f"{i:02d}" for i in range(10)]  # the first ten, in chunk order
    assert "and 4 more" in problem


def test_a_damaged_tar_header_is_outside_every_member(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    offset, _ = members(store)["b/z.jpg"]
    flip(store, offset - 512 + 3)  # a byte of the member's name field in its header
    (problem,) = verify_store(store, progress=False)
    assert "every member passes its own checksum" in problem
    assert "outside the members" in problem and "samples still read correctly" in problem
    # The strict tar scan points at the header block: no list of where it might be.
    assert f"the block at byte {offset - 512} is not a tar header" in problem
    assert "ranges" not in problem


@pytest.mark.parametrize("place", ["padding", "archive end"])
def test_damaged_padding_or_archive_end_is_outside_every_member(
    packed: Callable[..., Path], place: str
) -> None:
    store = packed(FILES)
    offset, length = members(store)["a/x.jpg"]
    size = (store / "chunks" / "000000.tar").stat().st_size
    # The zero padding after a member's data, or the last zero block of the archive.
    flip(store, offset + length if place == "padding" else size - 1)
    (problem,) = verify_store(store, progress=False)
    assert "every member passes its own checksum" in problem
    assert "outside the members" in problem and "tar scan says" in problem


def test_a_header_rewritten_whole_is_located_by_the_bytes_outside_the_members(
    packed: Callable[..., Path],
) -> None:
    store = packed(FILES)
    offset, _ = members(store)["a/y.jpg"]
    chunk = store / "chunks" / "000000.tar"
    raw = bytearray(chunk.read_bytes())
    header = offset - 512
    raw[header + 136 : header + 147] = b"%011o" % 1234567  # another mtime, a valid header still
    raw[header + 148 : header + 156] = b" " * 8
    raw[header + 148 : header + 156] = b"%06o\0 " % sum(raw[header : header + 512])
    chunk.write_bytes(bytes(raw))
    (problem,) = verify_store(store, progress=False)
    # The tar scan finds nothing wrong: the message says where the bytes outside lie.
    assert "every member passes its own checksum" in problem and "tar scan" not in problem
    assert "in tar headers, padding or the end-of-archive blocks" in problem
    assert re.search(r"\d+ bytes in \d+ ranges: 0\+512, ", problem)


def test_a_crafted_index_of_overlapping_members_is_bounded(packed: Callable[..., Path]) -> None:
    from tests.hostile.indexedit import edit_array
    from tierfeed.format.layout import INDEX_NAME

    files = {f"c/s{i:02d}.bin".encode(): bytes([i]) * 700 for i in range(12)}
    store = packed(files)
    size = (store / "chunks" / "000000.tar").stat().st_size
    index = store / INDEX_NAME
    # Every member claims the whole chunk: hashing them all would read it twelve times.
    index.write_bytes(edit_array(index.read_bytes(), "member_offset", lambda a: a * 0))
    index.write_bytes(edit_array(index.read_bytes(), "member_length", lambda a: a * 0 + size))
    flip(store, 600)
    problems = verify_store(store, progress=False)
    overlap = [p for p in problems if "members in the index overlap" in p]
    assert overlap and "000000.tar" in overlap[0], problems
