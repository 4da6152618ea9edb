"""Member paths sorted and checked vectorised (`tierfeed.format.pathsort`): the same order as
Python's bytes sort on any keys and extensions, and the same refusals of a broken order."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.errors import IndexFormatError
from tierfeed.format import rowcheck
from tierfeed.format.index import Index, IndexContent, write_index
from tierfeed.format.indexwrite import KeyBlob
from tierfeed.format.pathsort import padded_paths, sorted_order, strictly_increasing
from tierfeed.format.treecheck import check_path_order

# Keys of bytes that sort around '.', '/' and '-': where one key is a prefix of another, the
# order of the paths is not the order of the keys.
_KEY = st.lists(st.sampled_from(list(b"-./0a\x01\xff")), min_size=1, max_size=6).map(bytes)


def _layout(keys: list[bytes], members: list[list[int]]) -> tuple[np.ndarray, ...]:
    blob = np.frombuffer(b"".join(keys), dtype=np.uint8)
    key_offset = np.cumsum([0] + [len(k) for k in keys]).astype(np.uint64)
    start = np.cumsum([0] + [len(m) for m in members]).astype(np.uint64)
    ext = np.asarray([e for m in members for e in m], dtype=np.uint16)
    return blob, key_offset, start, ext


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(_KEY, min_size=0, max_size=40, unique=True),
    exts=st.lists(st.sampled_from([b"", b".a", b".jpg", b"-x", b".json"]), min_size=1, max_size=3),
    data=st.data(),
)
def test_the_order_is_pythons_bytes_order(
    keys: list[bytes], exts: list[bytes], data: st.DataObject
) -> None:
    exts = sorted(set(exts))
    members = [sorted(data.draw(st.sets(st.integers(0, len(exts) - 1), min_size=1))) for _ in keys]
    blob, key_offset, start, ext = _layout(keys, members)
    paths = [k + exts[e] for k, m in zip(keys, members, strict=True) for e in m]
    padded = padded_paths(blob, key_offset, start, ext, exts)
    assert padded is not None
    assert [bytes(p) for p in padded] == paths
    assert sorted_order(padded).tolist() == sorted(range(len(paths)), key=paths.__getitem__)
    in_order = padded[sorted_order(padded)]
    python = next((i for i, (a, b) in enumerate(itertools.pairwise(sorted(paths))) if b <= a), None)
    assert strictly_increasing(in_order) == (-1 if python is None else python + 1)


def test_too_wide_or_a_nul_falls_back() -> None:
    blob, key_offset, start, ext = _layout([b"a", b"b" * 50], [[0], [0]])
    assert padded_paths(blob, key_offset, start, ext, [b".x"], limit=100) is None
    assert padded_paths(blob, key_offset, start, ext, [b".x"]) is not None
    assert padded_paths(blob, key_offset, start, ext, [b".\0"]) is None


def test_a_duplicate_is_not_increasing() -> None:
    paths = np.asarray([b"a", b"b", b"b", b"c"], dtype="S1")
    assert strictly_increasing(paths) == 2
    assert strictly_increasing(paths[:2]) == -1


def _content(keys: list[bytes]) -> IndexContent:
    n = len(keys)
    return IndexContent(
        keys=keys,
        labels=np.full(n, -1, dtype=np.int32),
        member_start=np.arange(n + 1, dtype=np.uint64),
        member_chunk=np.zeros(n, dtype=np.uint32),
        member_offset=(np.arange(n, dtype=np.uint64) * np.uint64(1024) + np.uint64(512)),
        member_length=np.ones(n, dtype=np.uint64),
        member_checksum=np.zeros(n, dtype=np.uint64),
        member_ext=np.zeros(n, dtype=np.uint16),
        exts=[b".bin"],
        chunk_names=["chunks/000000.tar"],
        chunk_size=np.asarray([n * 1024 + 1024], dtype=np.uint64),
        chunk_checksum=np.zeros(1, dtype=np.uint64),
    )


def test_keys_as_a_blob_write_the_same_index(tmp_path: Path) -> None:
    keys = [b"x", b"x-1", b"x.2", b"y/z"]
    write_index(tmp_path / "list.tfi", _content(keys))
    blob = KeyBlob(np.cumsum([0] + [len(k) for k in keys]).astype(np.uint64), (b"".join(keys),))
    assert list(blob) == keys and blob[1] == b"x-1" and len(blob) == 4
    write_index(tmp_path / "blob.tfi", _content(blob))  # type: ignore[arg-type]
    assert (tmp_path / "list.tfi").read_bytes() == (tmp_path / "blob.tfi").read_bytes()
    with Index(tmp_path / "blob.tfi", recheck=True) as ix:
        ix.check_path_order()  # "x-1.bin" sorts before "x.2.bin" and "x.bin"
        assert [ix.sorted_path(i) for i in range(4)] == sorted(k + b".bin" for k in keys)


def test_keys_in_pieces_write_the_same_index(tmp_path: Path) -> None:
    """A merge's keys come as its parts' key sections, views of their mappings: written as
    they lie, they make the index the keys as a list make."""
    keys = [b"a/%03d" % i for i in range(20)]
    write_index(tmp_path / "list.tfi", _content(keys))
    cut = [0, 7, 7, 15, 20]  # an empty piece too
    pieces = tuple(memoryview(b"".join(keys[lo:hi])) for lo, hi in itertools.pairwise(cut))
    blob = KeyBlob(np.cumsum([0] + [len(k) for k in keys]).astype(np.uint64), pieces)
    assert list(blob) == keys and blob[19] == b"a/019"
    write_index(tmp_path / "pieces.tfi", _content(blob))  # type: ignore[arg-type]
    assert (tmp_path / "list.tfi").read_bytes() == (tmp_path / "pieces.tfi").read_bytes()


@pytest.mark.parametrize("threads", [1, 4])
def test_checks_made_a_block_at_a_time_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Row checks computed in blocks of a few samples, members crossing the blocks' ends, on
    one thread or several, are the ones a full check of the index recomputes."""
    monkeypatch.setattr(rowcheck, "_BLOCK", 3)
    monkeypatch.setattr(rowcheck, "THREADS", threads)
    content = _content([b"k%02d" % i for i in range(10)])
    content.member_start = np.asarray([0, 2, 3, 6, 7, 8, 9, 10], dtype=np.uint64)
    content.keys = content.keys[:7]
    content.labels = content.labels[:7]
    content.member_ext = np.asarray([0, 1, 0, 0, 1, 2, 0, 0, 0, 0], dtype=np.uint16)
    content.exts = [b".a", b".b", b".c"]
    write_index(tmp_path / "blocks.tfi", content)
    with Index(tmp_path / "blocks.tfi", recheck=True) as ix:
        ix.check_all()
        assert ix.num_samples == 7
    monkeypatch.setattr(rowcheck, "_BLOCK", 1 << 16)  # one block: the same bytes
    write_index(tmp_path / "one.tfi", content)
    assert (tmp_path / "one.tfi").read_bytes() == (tmp_path / "blocks.tfi").read_bytes()


@pytest.mark.hostile
def test_a_broken_path_order_is_named(tmp_path: Path) -> None:
    write_index(tmp_path / "i.tfi", _content([b"a", b"b", b"c"]))
    with Index(tmp_path / "i.tfi") as ix:
        arrays, exts = dict(ix._arrays), list(ix.exts)
        for order, said in (
            ([0, 2, 1], r"path order broken .* at 'b\.bin'"),
            ([0, 1, 1], "path order broken or duplicate path at 'b.bin'"),
            ([0, 1, 3], "members that are not there"),
        ):
            arrays["path_order"] = np.asarray(order, dtype=np.uint32)
            with pytest.raises(IndexFormatError, match=said):
                check_path_order(arrays, exts, tmp_path / "i.tfi")
