"""Bad input gets a clear error naming the file, and nothing half-written: a damaged or
crafted store or source (a symlink loop, a truncated index, a file list leaving the source)
and clumsy arguments. Every test here is `hostile`."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.format.conftest import QUIET, write_tree
from tierfeed import open_store, verify_store
from tierfeed.errors import (
    ChunkCorruptError,
    DuplicateKeyError,
    EmptySourceError,
    IndexFormatError,
    PackError,
    UnreadableFileError,
)
from tierfeed.format.index import Index, write_index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import PackOptions, pack

pytestmark = pytest.mark.hostile

FILES = {b"a/x.jpg": b"x" * 3000, b"a/y.jpg": b"y" * 2000, b"b/z.jpg": b"z" * 1000}


def test_broken_symlink_is_named(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    (tmp_path / "src" / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnreadableFileError, match=r"gone\.jpg.*--skip-unreadable"):
        pack(tmp_path / "src", tmp_path / "store", QUIET)
    assert not (tmp_path / "store" / INDEX_NAME).exists()


def test_skip_unreadable_counts_and_lists(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    (tmp_path / "src" / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere")
    options = PackOptions(chunk_size=8192, skip_unreadable=True, progress=False)
    report = pack(tmp_path / "src", tmp_path / "store", options)
    assert [p for p, _ in report.skipped] == ["a/gone.jpg"]
    assert report.samples == 3
    with open_store(tmp_path / "store") as store:
        assert store.index.header["extra"]["skipped"] == 1


def test_file_vanishing_during_read_is_skipped_when_asked(tmp_path: Path) -> None:
    """A file that fails at read time (not at listing) is skipped and counted too."""
    from tierfeed.format import pack as pack_module

    write_tree(tmp_path / "src", FILES)
    real = pack_module.read_source_into

    def flaky(f: pack_module.SourceFile, view: memoryview) -> None:
        if f.rel == b"a/y.jpg":
            raise UnreadableFileError(f"{os.fsdecode(f.abs)}: Input/output error")
        real(f, view)

    pack_module.read_source_into = flaky  # type: ignore[assignment]
    try:
        with pytest.raises(UnreadableFileError, match=r"a/y\.jpg: Input/output error"):
            pack(tmp_path / "src", tmp_path / "s1", QUIET)
        options = PackOptions(chunk_size=8192, skip_unreadable=True, progress=False)
        report = pack(tmp_path / "src", tmp_path / "s2", options)
    finally:
        pack_module.read_source_into = real  # type: ignore[assignment]
    assert [p for p, _ in report.skipped] == ["a/y.jpg"]
    with open_store(tmp_path / "s2") as store:
        assert [store.index.key(i) for i in range(len(store))] == ["a/x", "b/z"]
    assert verify_store(tmp_path / "s2", progress=False) == []


def test_empty_source(tmp_path: Path) -> None:
    (tmp_path / "src" / "emptydir").mkdir(parents=True)
    with pytest.raises(EmptySourceError, match="src"):
        pack(tmp_path / "src", tmp_path / "store", QUIET)


def test_symlink_loop_is_refused(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    (tmp_path / "src" / "a" / "loop").symlink_to(tmp_path / "src")
    with pytest.raises(UnreadableFileError, match="symlink loop"):
        pack(tmp_path / "src", tmp_path / "store", QUIET)


def test_duplicate_paths_in_a_file_list(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"a/x.jpg\nb/z.jpg\na/x.jpg\n")
    with pytest.raises(DuplicateKeyError, match=r"a/x\.jpg"):
        pack(tmp_path / "src", tmp_path / "store", QUIET, files=listing)


def test_file_list_cannot_leave_the_source(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"../secret\n")
    with pytest.raises(UnreadableFileError, match="leaves the source"):
        pack(tmp_path / "src", tmp_path / "store", QUIET, files=listing)


def test_existing_store_needs_overwrite(packed: Callable[..., Path], tmp_path: Path) -> None:
    store = packed(FILES)
    with pytest.raises(PackError, match="--overwrite"):
        pack(tmp_path / "src", store, QUIET)
    pack(tmp_path / "src", store, PackOptions(chunk_size=4096, overwrite=True, progress=False))
    assert verify_store(store, progress=False) == []


def test_index_of_another_version(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    index = store / INDEX_NAME
    raw = bytearray(index.read_bytes())
    struct.pack_into("<I", raw, 8, 99)
    index.write_bytes(bytes(raw))
    with pytest.raises(IndexFormatError, match=r"version 99.*re-index"):
        open_store(store)


def test_not_an_index_and_missing_index(tmp_path: Path) -> None:
    with pytest.raises(IndexFormatError, match="no index here"):
        open_store(tmp_path)
    (tmp_path / INDEX_NAME).write_bytes(b"GARBAGE!" + b"\0" * 64)
    with pytest.raises(IndexFormatError, match="bad magic"):
        open_store(tmp_path)


def test_truncated_index(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    index = store / INDEX_NAME
    index.write_bytes(index.read_bytes()[:-40])
    with pytest.raises(IndexFormatError, match="truncated"):
        open_store(store)


def test_truncated_chunk_named_by_verify_and_read(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    chunk = store / "chunks" / "000000.tar"
    chunk.write_bytes(chunk.read_bytes()[:1500])
    problems = verify_store(store, progress=False)
    assert any("000000.tar" in p and "truncated" in p for p in problems)
    with open_store(store) as s, pytest.raises(ChunkCorruptError, match=r"000000\.tar"):
        for i in range(len(s)):
            s.read_sample(i)


def test_altered_chunk_named_by_verify_and_read(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    chunk = store / "chunks" / "000000.tar"
    raw = bytearray(chunk.read_bytes())
    raw[600] ^= 0xFF  # inside the first member's data
    chunk.write_bytes(bytes(raw))
    problems = verify_store(store, progress=False)
    assert problems and "000000.tar" in problems[0] and "checksum" in problems[0]
    with open_store(store) as s, pytest.raises(ChunkCorruptError, match=r"000000\.tar.*a/x\.jpg"):
        s.read_sample(0)


def test_index_pointing_past_chunk_end(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    with Index(store) as ix:
        from tierfeed.format.index import IndexContent

        content = IndexContent(
            keys=[ix.key_bytes(i) for i in range(ix.num_samples)],
            labels=np.array(ix.sample_label),
            member_start=np.array(ix.sample_member_start),
            member_chunk=np.array(ix.member_chunk),
            member_offset=np.array(ix.member_offset) + np.uint64(10_000),
            member_length=np.array(ix.member_length),
            member_checksum=np.array(ix.member_checksum),
            member_ext=np.array(ix.member_ext),
            exts=ix.exts,
            chunk_names=[ix.chunk_name(c) for c in range(ix.num_chunks)],
            chunk_size=np.array(ix.chunk_size),
            chunk_checksum=np.array(ix.chunk_checksum),
            classes=ix.classes,
        )
    write_index(store / INDEX_NAME, content)
    problems = verify_store(store, progress=False)
    assert any("points past the end of chunk chunks/000000.tar" in p for p in problems)
    with pytest.raises(IndexFormatError, match="past the end of chunk"):
        open_store(store)  # refused on open: no read follows an offset the chunk cannot hold


def test_missing_chunk(packed: Callable[..., Path]) -> None:
    store = packed(FILES)
    (store / "chunks" / "000000.tar").unlink()
    assert any("000000.tar" in p and "missing" in p for p in verify_store(store, progress=False))
    with open_store(store) as s, pytest.raises(ChunkCorruptError, match=r"000000\.tar is missing"):
        s.read_sample(0)


def test_destination_inside_source_is_refused(tmp_path: Path) -> None:
    """Pack never writes inside its source (the origin is read-only): DST inside SRC used to
    be excluded from the walk, but the chunks and the lock still landed in the source, and a
    later pack of SRC packed them. Now it is refused up front and a sibling is suggested."""
    write_tree(tmp_path / "src", FILES)
    with pytest.raises(
        PackError, match=r"inside the source.*sibling directory such as .*src-store"
    ):
        pack(tmp_path / "src", tmp_path / "src" / "store", QUIET)
    assert not (tmp_path / "src" / "store").exists()
    pack(tmp_path / "src", tmp_path / "src-store", QUIET)
    with open_store(tmp_path / "src-store") as s:
        assert len(s) == 3
