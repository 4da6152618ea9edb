"""Indexing shards in parts (`index --part I/N`, issue 49) and `merge`: the merged index is the
one a single `tierfeed index` makes, sample by sample, and what cannot be merged is refused
in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.format.test_pack_parts import _samples
from tests.format.wds_shards import make_shards, write_shard
from tests.hostile.test_cli_errors import assert_user_error, tierfeed
from tierfeed.errors import PackError
from tierfeed.format.index import Index
from tierfeed.format.indexparts import index_part
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.merge import merge_parts
from tierfeed.format.parts import part_directory, part_shares
from tierfeed.format.shards import index_shards

SHARDS = 12


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    make_shards(tmp_path / "shards", shards=SHARDS, per_shard=4)
    return sorted((tmp_path / "shards").glob("*.tar"))


def _index_in_parts(shards: list[Path], dst: Path, count: int, **kw: object) -> None:
    for i in range(count):
        index_part(shards, dst, (i, count), progress=False, **kw)  # type: ignore[arg-type]


def _same_as_single(single: Path, parted: Path) -> None:
    assert _samples(parted) == _samples(single)
    with Index(single) as a, Index(parted, recheck=True) as b:
        assert b.classes == a.classes
        assert b.chunk_root == a.chunk_root
        assert [b.chunk_name(c) for c in range(b.num_chunks)] == [
            a.chunk_name(c) for c in range(a.num_chunks)
        ]
        assert b.chunk_size.tolist() == a.chunk_size.tolist()
        assert b.chunk_checksum.tolist() == a.chunk_checksum.tolist()


@pytest.mark.parametrize("count", [1, 2, 3])
def test_merged_parts_are_the_single_index(tmp_path: Path, shards: list[Path], count: int) -> None:
    single, parted = tmp_path / "single", tmp_path / "parted"
    index_shards(shards, single, progress=False)
    _index_in_parts(shards, parted, count)
    shares = part_shares([p.stat().st_size for p in shards], count)
    for i in range(count):
        with Index(part_directory(parted, i, count)) as ix:
            assert ix.num_chunks == len(shares[i])
    report = merge_parts(parted, progress=False)
    assert (report.parts, report.chunks, report.samples) == (count, SHARDS, SHARDS * 4)
    _same_as_single(single, parted)
    with Index(parted) as ix:
        assert ix.classes == ["0", "1", "2"]


def test_parts_hold_about_equal_bytes(tmp_path: Path) -> None:
    """Two large shards and ten small ones in 2 parts: each part holds about half the bytes
    (within one shard's size, the cut at the shard end nearest half), not half the shards."""
    where = tmp_path / "shards"
    for s in range(12):
        size = 40_000 if s in (0, 1) else 2_000
        samples = {f"k{s:02d}_{i}": {"bin": b"x" * size} for i in range(4)}
        write_shard(where / f"s{s:02d}.tar", samples)
    shards = sorted(where.glob("*.tar"))
    sizes = [p.stat().st_size for p in shards]
    _index_in_parts(shards, tmp_path / "parted", 2)
    held = []
    for i in range(2):
        with Index(part_directory(tmp_path / "parted", i, 2)) as ix:
            held.append(int(ix.chunk_size.sum()))
    assert held == [sum(sizes[:2]), sum(sizes[2:])]  # by count, 6 shards each: 430 KB, 123 KB
    assert abs(held[0] - held[1]) <= max(sizes)
    merge_parts(tmp_path / "parted", progress=False)
    index_shards(shards, tmp_path / "single", progress=False)
    _same_as_single(tmp_path / "single", tmp_path / "parted")


def test_folder_labels_are_the_whole_lists(tmp_path: Path) -> None:
    """No .cls: ImageFolder classes over every part's keys, not each part's own."""
    where = tmp_path / "shards"
    for s, cls in enumerate(["cat", "cat", "dog", "owl"]):
        write_shard(
            where / f"s{s}.tar", {f"{cls}/k{s}_{i}": {"jpg": b"x" * (50 + i)} for i in range(3)}
        )
    shards = sorted(where.glob("*.tar"))
    index_shards(shards, tmp_path / "single", progress=False)
    _index_in_parts(shards, tmp_path / "parted", 2)
    merge_parts(tmp_path / "parted", progress=False)
    _same_as_single(tmp_path / "single", tmp_path / "parted")
    with Index(tmp_path / "parted") as ix:
        assert ix.classes == ["cat", "dog", "owl"]


def test_shards_in_the_store_directory(tmp_path: Path) -> None:
    """Shards inside DST: no chunk root, names relative to DST, from the parts too."""
    make_shards(tmp_path / "single", shards=5, per_shard=2)
    make_shards(tmp_path / "parted", shards=5, per_shard=2)
    index_shards(sorted((tmp_path / "single").glob("*.tar")), tmp_path / "single", progress=False)
    _index_in_parts(sorted((tmp_path / "parted").glob("*.tar")), tmp_path / "parted", 2)
    merge_parts(tmp_path / "parted", progress=False)
    with Index(tmp_path / "parted") as ix:
        assert ix.chunk_root == tmp_path / "parted"
        assert ix.chunk_name(0) == "shard-000000.tar"
    assert len(_samples(tmp_path / "parted")) == 10


@pytest.mark.hostile
def test_a_missing_part_is_named(tmp_path: Path, shards: list[Path]) -> None:
    dst = tmp_path / "dst"
    index_part(shards, dst, (0, 3), progress=False)
    index_part(shards, dst, (2, 3), progress=False)
    with pytest.raises(PackError, match=r"part 1 of 3 is missing: run `tierfeed index SHARDS"):
        merge_parts(dst, progress=False)
    assert not (dst / INDEX_NAME).exists()


@pytest.mark.hostile
def test_a_part_of_another_shard_list_is_refused(tmp_path: Path, shards: list[Path]) -> None:
    dst = tmp_path / "dst"
    index_part(shards, dst, (0, 2), progress=False)
    index_part(shards[:-1], dst, (1, 2), progress=False)
    with pytest.raises(PackError, match="another source"):
        merge_parts(dst, progress=False)
    assert not (dst / INDEX_NAME).exists()


@pytest.mark.hostile
def test_a_shard_changed_after_its_part_is_refused(tmp_path: Path, shards: list[Path]) -> None:
    dst = tmp_path / "dst"
    _index_in_parts(shards, dst, 2)
    with shards[-1].open("ab") as fh:
        fh.write(b"\0" * 512)
    with pytest.raises(PackError, match="the shard changed after it was indexed"):
        merge_parts(dst, progress=False)


def test_a_finished_part_run_again_is_left_as_it_is(tmp_path: Path, shards: list[Path]) -> None:
    dst = tmp_path / "dst"
    index_part(shards, dst, (1, 2), progress=False)
    index = part_directory(dst, 1, 2) / INDEX_NAME
    written = index.stat().st_mtime_ns
    again = index_part(shards, dst, (1, 2), progress=False)
    assert again.chunks == SHARDS // 2
    assert index.stat().st_mtime_ns == written


def test_the_cli_indexes_parts_and_merges(tmp_path: Path, shards: list[Path]) -> None:
    pattern = str(tmp_path / "shards" / f"shard-{{000000..{SHARDS - 1:06d}}}.tar")
    single, dst = tmp_path / "single", tmp_path / "dst"
    assert tierfeed("index", pattern, "--out", single, "-q").returncode == 0
    for i in (0, 2):
        done = tierfeed("index", pattern, "--out", dst, "--part", f"{i}/3", "-q")
        assert done.returncode == 0, done.stderr
        assert f"tierfeed merge {dst}" in done.stdout
    assert_user_error(tierfeed("merge", dst, "-q"), "merge", "part 1 of 3 is missing")
    assert tierfeed("index", pattern, "--out", dst, "--part", "1/3", "-q").returncode == 0
    done = tierfeed("merge", dst, "-q")
    assert done.returncode == 0, done.stderr
    _same_as_single(single, dst)
