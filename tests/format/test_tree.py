"""The store is faithful to the packed tree: modes, mtimes and every directory, empty or not."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from tests.format.conftest import MESSY, QUIET, write_messy_tree, write_tree
from tests.hostile.indexedit import content_without_tree
from tierfeed import Writer
from tierfeed.errors import NotFoundError
from tierfeed.format.index import Index, write_index
from tierfeed.format.layout import INDEX_NAME, TREE_SECTIONS
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.compose import open_store
from tierfeed.storage.store import Store

pytestmark = pytest.mark.timeout(60)


def source_walk(root: Path) -> dict[str, tuple[bool, int, int, int]]:
    """{relative path: (is_dir, size of files, permission bits, mtime ns)} of a tree."""
    out: dict[str, tuple[bool, int, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            st = full.stat()
            is_dir = stat.S_ISDIR(st.st_mode)
            rel = str(full.relative_to(root))
            out[rel] = (
                is_dir,
                0 if is_dir else st.st_size,
                stat.S_IMODE(st.st_mode),
                st.st_mtime_ns,
            )
    return out


def store_walk(store: Store, top: str = "") -> dict[str, tuple[bool, int, int, int]]:
    """The same, through `Store.listdir` and `Store.stat` only."""
    out: dict[str, tuple[bool, int, int, int]] = {}
    for name in store.listdir(top):
        rel = f"{top}/{name}" if top else name
        found = store.stat(rel)
        out[rel] = (found.is_dir, found.size, found.mode, found.mtime_ns)
        if found.is_dir:
            out |= store_walk(store, rel)
    return out


@pytest.fixture
def messy(tmp_path: Path) -> tuple[Path, Path]:
    write_messy_tree(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    return tmp_path / "src", tmp_path / "store"


def test_modes_mtimes_and_empty_directories_round_trip(messy: tuple[Path, Path]) -> None:
    src, dst = messy
    with open_store(dst) as store:
        assert store.index.has_tree
        assert store_walk(store) == source_walk(src)
        assert store.listdir("empty_class") == []
        assert store.listdir("valid/deeper/deepest") == []
        assert store.listdir("valid") == ["deeper"]
        assert store.listdir("cat") == ["a.jpg", "b.jpg", "empty", "sub"]
        assert store.listdir("") == ["cat", "dog", "empty_class", "top.txt", "valid"]
        with pytest.raises(NotFoundError):
            store.listdir("cat/a.jpg")
        with pytest.raises(NotFoundError):
            store.stat("valid/deeper/none")
    want = sorted(rel for rel, _, data in MESSY if data is None)
    with Index(dst) as ix:
        assert ix.dir_paths == want
        assert ix.num_dirs == len(want)


def test_file_list_packs_only_listed_files(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {b"a/x.jpg": b"x" * 3000, b"a/y.jpg": b"y", b"b/z.jpg": b"z"})
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"b/z.jpg\na/x.jpg\n")
    pack(tmp_path / "src", tmp_path / "store", QUIET, files=listing)
    with open_store(tmp_path / "store") as store:
        assert [store.index.key(i) for i in range(len(store))] == ["a/x", "b/z"]


def test_files_listing_records_only_their_directories(tmp_path: Path) -> None:
    write_messy_tree(tmp_path / "src")
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"cat/sub/c.jpg\ntop.txt\ndog/d.png\n")
    pack(tmp_path / "src", tmp_path / "store", QUIET, files=listing)
    src = source_walk(tmp_path / "src")
    with open_store(tmp_path / "store") as store:
        assert store.index.dir_paths == [b"cat", b"cat/sub", b"dog"]
        got = store_walk(store)
    assert got == {
        rel: src[rel] for rel in ("cat", "cat/sub", "cat/sub/c.jpg", "dog", "dog/d.png", "top.txt")
    }


def test_flat_tree_has_an_empty_table(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {b"a.bin": b"a", b"b.bin": b"bb"})
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    with open_store(tmp_path / "store") as store:
        assert store.index.has_tree and store.index.dir_paths == []
        assert store.listdir("") == ["a.bin", "b.bin"]


def without_tree(index_path: Path) -> None:
    """Re-write an index with everything but its tree (as `tierfeed index` and Writer do)."""
    with Index(index_path) as ix:
        content = content_without_tree(ix)
    write_index(index_path, content)


def test_an_index_without_the_tree_reads_as_before(messy: tuple[Path, Path]) -> None:
    _, dst = messy
    without_tree(dst / INDEX_NAME)
    with Index(dst) as ix:
        assert not ix.has_tree and ix.dir_paths == [] and ix.member_mode is None
        assert not set(TREE_SECTIONS) & set(ix.header["sections"]) and "dirs" not in ix.header
    index_ns = (dst / INDEX_NAME).stat().st_mtime_ns
    with open_store(dst) as store:
        assert store.listdir("") == ["cat", "dog", "top.txt"]  # no empty directory
        assert store.listdir("cat") == ["a.jpg", "b.jpg", "sub"]
        with pytest.raises(NotFoundError):
            store.stat("empty_class")
        f, d = store.stat("cat/a.jpg"), store.stat("cat")
        assert (f.is_dir, f.size, f.mode, f.mtime_ns) == (False, 1500, 0o444, index_ns)
        assert (d.is_dir, d.mode, d.mtime_ns) == (True, 0o555, index_ns)


def test_tree_arrays_are_written_as_given(messy: tuple[Path, Path]) -> None:
    src, dst = messy
    with Index(dst) as ix:
        assert ix.member_mode is not None and ix.member_mtime is not None
        paths = [ix.member_path_bytes(m).decode() for m in range(ix.num_members)]
        modes = {p: int(m) for p, m in zip(paths, ix.member_mode, strict=True)}
        assert modes == {p: v[2] for p, v in source_walk(src).items() if not v[0]}
        assert ix.member_mtime.dtype == np.dtype("<i8")


def test_the_root_is_recorded(messy: tuple[Path, Path]) -> None:
    src, dst = messy
    os.chmod(src, 0o751)
    os.utime(src, ns=(1_234_567_890_123_456_789, 1_234_567_890_123_456_789))
    pack(src, dst, dataclasses.replace(QUIET, overwrite=True))
    with open_store(dst) as store:
        root = store.stat("")
    assert (root.is_dir, root.mode, root.mtime_ns) == (True, 0o751, 1_234_567_890_123_456_789)


def test_skipped_directories_are_not_recorded(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {b"a/x.bin": b"x", b"b/y.bin": b"y"})
    os.mkdir(tmp_path / "src" / "a" / "empty")
    os.symlink("..", tmp_path / "src" / "a" / "loop")  # leads back up: skipped, not walked
    pack(tmp_path / "src", tmp_path / "store", dataclasses.replace(QUIET, skip_unreadable=True))
    with open_store(tmp_path / "store") as store:
        assert store.index.dir_paths == [b"a", b"a/empty", b"b"]
        assert store.listdir("a") == ["empty", "x.bin"]


def test_a_writer_store_has_no_tree(tmp_path: Path) -> None:
    with Writer(tmp_path / "st", chunk_size=8192) as w:
        w.write({"__key__": "cat/x", "jpg": b"x"})
    with open_store(tmp_path / "st") as store:
        assert not store.index.has_tree and store.index.root is None
        assert store.listdir("") == ["cat"] and store.stat("cat").mode == 0o555


def test_an_empty_top_level_directory_is_a_class_as_for_torchvision(tmp_path: Path) -> None:
    """Labels number every top-level directory, empty ones included, so that the Dataset's
    labels and ImageFolder's (torchvision's) agree."""
    from tierfeed.torch import ImageFolder

    write_tree(tmp_path / "src", {b"b_cat/x.jpg": b"1", b"d_dog/y.jpg": b"2"})
    (tmp_path / "src" / "a_empty").mkdir()
    (tmp_path / "src" / "c_empty").mkdir()
    pack(tmp_path / "src", tmp_path / "store", PackOptions(progress=False))
    folder = ImageFolder(tmp_path / "store", allow_empty=True)
    with open_store(tmp_path / "store") as store:
        assert store.classes == folder.classes == ["a_empty", "b_cat", "c_empty", "d_dog"]
        labels = {store.read_sample(i).key: store.read_sample(i).label for i in range(len(store))}
    assert labels == {"b_cat/x": 1, "d_dog/y": 3}
    assert folder.samples == [("b_cat/x.jpg", 1), ("d_dog/y.jpg", 3)]
