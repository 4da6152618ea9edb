"""Gzipped shards (issue 46): `tierfeed index shards/*.tar.gz --out STORE` decompresses each
once into the store directory, after one line saying what it writes and what is free, and
indexes the plain tars; the gzipped shards are only read."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.wds_shards import (
    Samples,
    gzip_copy,
    make_read_only,
    make_shards,
    make_writable,
    read_back,
    snapshot,
)
from tests.hostile.test_cli_errors import tierfeed
from tierfeed import index_shards, verify_store
from tierfeed.errors import PackError
from tierfeed.format import gunzip
from tierfeed.torch import Dataset

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def gzipped(tmp_path: Path) -> Iterator[tuple[Path, Samples]]:
    """Three shards, gzipped (``.tar.gz`` and ``.tgz``), in a read-only directory ``gz``."""
    samples = make_shards(tmp_path / "plain", shards=3)
    for s, suffix in enumerate((".tar.gz", ".tgz", ".tar.gz")):
        gzip_copy(tmp_path / "plain" / f"shard-{s:06d}.tar", tmp_path / "gz" / f"shard-{s}{suffix}")
    make_read_only(tmp_path / "gz")
    yield tmp_path / "gz", samples
    make_writable(tmp_path / "gz")


def test_gzipped_shards_are_decompressed_once_and_indexed(
    tmp_path: Path, gzipped: tuple[Path, Samples]
) -> None:
    gz, samples = gzipped
    before = snapshot(gz)
    store = tmp_path / "store"
    done = tierfeed("index", *sorted(gz.iterdir()), "--out", store, "-q")
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    plain = sum((tmp_path / "plain" / f"shard-{s:06d}.tar").stat().st_size for s in range(3))
    assert len(said) == 1 and "decompressing 3 gzipped shard(s) once into" in said[0], said
    assert f"{plain / 1024:.1f} KiB to write" in said[0] and "free" in said[0]
    assert sorted(p.name for p in store.iterdir()) == [
        "index.tfi", "shard-0.tar", "shard-1.tar", "shard-2.tar",
    ]  # fmt: skip
    for s in range(3):  # byte for byte the tar that was gzipped
        want = (tmp_path / "plain" / f"shard-{s:06d}.tar").read_bytes()
        assert (store / f"shard-{s}.tar").read_bytes() == want
    assert read_back(Dataset(store, plan="sequential", batch_size=4)) == samples
    assert tierfeed("verify", store, "-q").returncode == 0
    again = tierfeed("index", *sorted(gz.iterdir()), "--out", store, "-q", "--overwrite")
    assert again.returncode == 0, again.stderr
    assert "3 gzipped shard(s) decompressed into" in again.stderr and "kept" in again.stderr
    assert snapshot(gz) == before  # only read


def test_plain_and_gzipped_shards_together(tmp_path: Path, gzipped: tuple[Path, Samples]) -> None:
    gz, samples = gzipped
    extra = make_shards(tmp_path / "more", shards=1, prefix="m")
    report = index_shards(
        [*sorted(gz.iterdir()), tmp_path / "more" / "shard-000000.tar"],
        tmp_path / "store",
        progress=False,
    )
    assert report.chunks == 4 and report.shard_root == tmp_path  # the plain one stays there
    assert read_back(Dataset(tmp_path / "store", plan="sequential", batch_size=4)) == {
        **samples,
        **extra,
    }
    assert verify_store(tmp_path / "store", progress=False) == []


def test_a_damaged_gzip_stream_is_one_line(tmp_path: Path) -> None:
    make_shards(tmp_path / "plain", shards=1)
    tar = tmp_path / "plain" / "shard-000000.tar"
    raw = bytearray(gzip_copy(tar, tmp_path / "gz" / "a.tar.gz").read_bytes())
    (tmp_path / "gz" / "cut.tar.gz").write_bytes(bytes(raw[: len(raw) // 2]) + raw[-8:])
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "gz" / "flipped.tgz").write_bytes(bytes(raw))
    (tmp_path / "gz" / "plain.tar.gz").write_bytes(tar.read_bytes())
    for name in ("cut.tar.gz", "flipped.tgz", "plain.tar.gz"):
        store = tmp_path / f"store-{name}"
        done = tierfeed("index", tmp_path / "gz" / name, "--out", store, "-q")
        # The line saying what decompressing costs may come first; the error is one line.
        lines = [line for line in done.stderr.splitlines() if "decompressing" not in line]
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith("tierfeed index: error: ") and name in lines[0], done.stderr
        assert "Traceback" not in done.stderr
        assert not list(store.glob("*.tar")) if store.exists() else True  # no half tar


def test_too_little_space_is_refused_before_writing(
    tmp_path: Path, gzipped: tuple[Path, Samples], monkeypatch: pytest.MonkeyPatch
) -> None:
    gz, _ = gzipped

    def full(path: object) -> shutil._ntuple_diskusage:
        return shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20)  # 1 MiB free

    monkeypatch.setattr(gunzip.shutil, "disk_usage", full)
    with pytest.raises(PackError, match=r"decompress to .* and 1\.0 MiB is free"):
        index_shards(sorted(gz.iterdir()), tmp_path / "store", progress=False)
    assert list((tmp_path / "store").iterdir()) == []


def test_the_trailer_size_past_4_gib_is_the_least_the_stream_allows(tmp_path: Path) -> None:
    # A gzip trailer holds the length modulo 4 GiB: a 5 GiB stream (sparse here: only its
    # first and last bytes are read) whose trailer says 100 holds at least 8 GiB + 100,
    # the least length that is 100 modulo 4 GiB and not below what deflate can shrink to.
    fake = tmp_path / "big.tar.gz"
    with fake.open("wb") as f:
        f.write(b"\x1f\x8b")
        f.truncate(5 << 30)
        f.seek((5 << 30) - 4)
        f.write((100).to_bytes(4, "little"))
    assert gunzip._trailer(fake)[1] == (2 << 32) + 100
    small = gzip_copy(Path(gunzip.__file__), tmp_path / "small.tgz")  # below 4 GiB: exact
    assert gunzip._trailer(small)[1] == Path(gunzip.__file__).stat().st_size
    assert [gunzip._plain_name(n) for n in ("a.tgz", "a.tar.gz")] == ["a.tar", "a.tar"]
