"""`tierfeed index`: existing shards indexed in place; untrusted member names refused."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tierfeed import index_shards, open_store, verify_store
from tierfeed.errors import BadMemberError, DuplicateKeyError


def make_shard(path: Path, members: list[tuple[str, bytes]], kind: bytes = tarfile.REGTYPE) -> None:
    """Write a tar with the given (name, data) members, as WebDataset's writers do."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname, info.size = "/etc/passwd", 0
                tar.addfile(info)
            else:
                tar.addfile(info, io.BytesIO(data))


def test_webdataset_shards_indexed_in_place(tmp_path: Path) -> None:
    make_shard(
        tmp_path / "shards" / "s-000.tar",
        [("000001.jpg", b"j1"), ("000001.cls", b"3"), ("000002.jpg", b"j2"), ("000002.cls", b"5")],
    )
    make_shard(tmp_path / "shards" / "s-001.tar", [("./000003.jpg", b"j3"), ("000003.cls", b"1")])
    report = index_shards(
        sorted((tmp_path / "shards").iterdir()), tmp_path / "shards", progress=False
    )
    assert (report.samples, report.members, report.chunks) == (3, 6, 2)
    with open_store(tmp_path / "shards") as store:
        samples = [store.read_sample(i) for i in range(len(store))]
        assert [s.key for s in samples] == ["000001", "000002", "000003"]
        assert samples[2].fields == {"jpg": b"j3", "cls": b"1"}
        assert store.chunks[1].name == "s-001.tar"
        assert store.listdir("") == [f"00000{i}.{e}" for i in (1, 2, 3) for e in ("cls", "jpg")]
    assert verify_store(tmp_path / "shards", progress=False) == []


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("name", "why"),
    [("/etc/passwd", "absolute"), ("../../escape.jpg", "'..'"), ("a/../../b.jpg", "'..'")],
)
def test_tar_slip_names_are_refused(tmp_path: Path, name: str, why: str) -> None:
    shard = tmp_path / "s.tar"
    make_shard(shard, [("ok.jpg", b"1"), (name, b"evil")])
    with pytest.raises(BadMemberError, match=rf"s\.tar.*{why}.*--skip-bad-names"):
        index_shards([shard], tmp_path, progress=False)


@pytest.mark.hostile
def test_nul_in_a_pax_name_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    # A ustar name field stops at NUL; a pax path record (long name) carries it through.
    make_shard(shard, [("ok.jpg", b"1"), ("bad\0" + "n" * 120 + ".jpg", b"2")])
    with pytest.raises(BadMemberError, match="NUL"):
        index_shards([shard], tmp_path, progress=False)


@pytest.mark.hostile
def test_repeated_member_and_links_are_refused_or_skipped(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    make_shard(shard, [("a.jpg", b"1"), ("a.jpg", b"2"), ("/abs.jpg", b"3"), ("b.jpg", b"4")])
    with pytest.raises(BadMemberError, match="repeats"):
        index_shards([shard], tmp_path, progress=False)
    report = index_shards([shard], tmp_path, skip_bad_names=True, progress=False)
    assert len(report.skipped) == 2 and report.samples == 2
    with open_store(tmp_path) as store:
        assert store.read_sample(0).fields == {"jpg": b"1"}
    link = tmp_path / "l" / "link.tar"
    make_shard(link, [("x.jpg", b"")], kind=tarfile.SYMTYPE)
    with pytest.raises(BadMemberError, match="link or device"):
        index_shards([link], tmp_path / "l", progress=False)


def test_split_sample_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    make_shard(shard, [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    with pytest.raises(DuplicateKeyError, match="'a' appears again"):
        index_shards([shard], tmp_path, progress=False)


def test_shard_outside_the_store_is_read_where_it_lies(tmp_path: Path) -> None:
    # Issue 46: the store records the shards' directory; tests/format/test_shards_elsewhere.py.
    make_shard(tmp_path / "elsewhere" / "s.tar", [("a.jpg", b"1")])
    report = index_shards([tmp_path / "elsewhere" / "s.tar"], tmp_path / "store", progress=False)
    assert report.shard_root == tmp_path / "elsewhere"
    with open_store(tmp_path / "store") as store:
        assert store.read_sample(0).fields == {"jpg": b"1"}


def test_compressed_shard_is_a_clear_error(tmp_path: Path) -> None:
    # Named .tar but gzipped: refused (a .tar.gz is decompressed: test_gzip_shards.py).
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w:gz") as tar:
        info = tarfile.TarInfo("a.jpg")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(Exception, match=r"s\.tar.*uncompressed"):
        index_shards([shard], tmp_path, progress=False)
