"""The index: lookups on a large synthetic index, opening without reading it all."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.format.index import Index
from tierfeed.format.names import normalize_member_name, split_key
from tierfeed.format.synthindex import synthetic_index


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_large_index_lookups(tmp_path: Path) -> None:
    n = 300_000
    synthetic_index(tmp_path / "index.tfi", n, classes=100)
    with Index(tmp_path) as ix:
        assert (ix.num_samples, ix.num_members, ix.num_chunks) == (n, n, n // 500)
        rng = np.random.default_rng(0)
        for i in rng.integers(0, n, size=200).tolist():
            label = int(ix.sample_label[i])
            key = f"c{label:04d}/{i:09d}"
            assert ix.key(i) == key
            assert ix.find_sample(key) == i
            assert ix.find_member(os.fsencode(key) + b".jpg") == i
        assert ix.find_sample("c0000/999999999") is None
        assert ix.sample_bytes().sum() == ix.member_length.sum()
        # Bytes per sample of the whole file, names included.
        assert (tmp_path / "index.tfi").stat().st_size / n < 64 + 16


@settings(max_examples=300)
@given(st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b))
def test_split_key_round_trips(path: bytes) -> None:
    key, ext = split_key(path)
    assert key + ext == path
    assert b"." not in key.rsplit(b"/", 1)[-1]
    assert ext == b"" or ext.startswith(b".")


@settings(max_examples=300)
@given(st.text(min_size=1, max_size=30))
def test_normalized_member_names_stay_inside(name: str) -> None:
    try:
        safe = normalize_member_name(name, "shard.tar")
    except Exception as exc:
        assert type(exc).__name__ == "BadMemberError"
        return
    parts = safe.split(b"/")
    assert not safe.startswith(b"/") and b".." not in parts and b"" not in parts
    assert b"\0" not in safe


def test_find_sample_with_prefix_neighbours(tmp_path: Path) -> None:
    from tests.format.conftest import QUIET, write_tree
    from tierfeed import open_store
    from tierfeed.format.pack import pack

    files = {b"d/a.jpg": b"1", b"d/a-b.jpg": b"2", b"d/a": b"3x", b"d/a/x.jpg": b"4"}
    files.pop(b"d/a")  # a file and a directory cannot share a name
    write_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "st", QUIET)
    with open_store(tmp_path / "st") as store:
        ix = store.index
        for key in ("d/a", "d/a-b", "d/a/x"):
            i = ix.find_sample(key)
            assert i is not None and ix.key(i) == key
        assert ix.find_sample("d/b") is None
        assert store.listdir("d") == ["a", "a-b.jpg", "a.jpg"]


@settings(max_examples=300)
@given(
    st.binary(min_size=1, max_size=130).filter(lambda b: b"\0" not in b),
    st.integers(0, 2**40),
    st.integers(-(2**33), 2**36),
)
def test_header_length_shortcut_matches_tarfile(path: bytes, size: int, mtime: int) -> None:
    from tierfeed.format.tarchunk import header_length, member_header

    assert header_length(path, size, mtime) == len(member_header(path, size, mtime))


def test_index_opens_where_files_cannot_be_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Direct-I/O FUSE mounts and some network file systems refuse mmap (ENODEV)."""
    import errno
    import mmap

    synthetic_index(tmp_path / "index.tfi", 2000, classes=10)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(mmap, "mmap", refuse)
    with Index(tmp_path) as ix:
        assert ix.num_samples == 2000 and ix.find_sample(ix.key(1234)) == 1234
        assert ix.sections_checksum() == ix.header["sections_checksum"]


def test_sample_bytes_of_some_samples(tmp_path: Path) -> None:
    """A loader's worker sizes only its own samples (several members each here)."""
    from tests.format.conftest import write_tree
    from tierfeed.format.pack import PackOptions, pack

    files = {
        b"x/a.jpg": b"A" * 100,
        b"x/a.txt": b"t" * 7,
        b"x/b.jpg": b"B" * 50,
        b"y/c.png": b"C" * 3,
        b"y/c.json": b"{}",
    }
    write_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "store", PackOptions(workers=1, progress=False))
    with Index(tmp_path / "store") as ix:
        every = ix.sample_bytes()
        assert sorted(every.tolist()) == [5, 50, 107]
        ids = np.array([2, 0, 0, 1])
        assert ix.sample_bytes(ids).tolist() == every[ids].tolist()
        assert ix.sample_bytes(np.zeros(0, dtype=np.int64)).tolist() == []
