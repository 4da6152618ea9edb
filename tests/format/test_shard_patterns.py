"""Shard lists and WebDataset's brace patterns (issue 46): `tierfeed index` and the URL
indexer expand them as WebDataset does, and `tierfeed.torch.Dataset` takes a list of .tar
paths or a pattern, indexed once into the user's cache and reused while they are unchanged."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.format.wds_shards import (
    Samples,
    make_read_only,
    make_shards,
    make_writable,
    read_back,
    snapshot,
)
from tests.hostile.test_cli_errors import assert_user_error, tierfeed
from tierfeed.errors import ConfigError
from tierfeed.format.braces import expand_braces
from tierfeed.loader.location import StoreLocation
from tierfeed.loader.urlshards import _names_under, index_shards
from tierfeed.torch import Dataset, Loader

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("shard-{000000..000003}.tar", [f"shard-{i:06d}.tar" for i in range(4)]),
        ("s-{8..11}.tar", ["s-8.tar", "s-9.tar", "s-10.tar", "s-11.tar"]),
        ("s-{08..11}.tar", ["s-08.tar", "s-09.tar", "s-10.tar", "s-11.tar"]),
        ("s-{3..1}", ["s-3", "s-2", "s-1"]),
        ("s-{0..10..5}", ["s-0", "s-5", "s-10"]),
        ("{a,b}/{1,2}", ["a/1", "a/2", "b/1", "b/2"]),
        ("{train,val{0,1}}.tar", ["train.tar", "val0.tar", "val1.tar"]),
        ("{a..c}", ["a", "b", "c"]),
        ("{,x}y", ["y", "xy"]),
        ("plain.tar", ["plain.tar"]),
        ("odd{name}.tar", ["odd{name}.tar"]),  # no comma, no range: literal, as in bash
        ("half{0..2.tar", ["half{0..2.tar"]),
        ("{x}-{1,2}", ["{x}-1", "{x}-2"]),
    ],
)
def test_brace_patterns_expand_as_webdataset_does(pattern: str, names: list[str]) -> None:
    assert expand_braces(pattern) == names


def test_a_pattern_naming_too_many_shards_is_refused() -> None:
    with pytest.raises(ConfigError, match="more than 1,000,000"):
        expand_braces("{0..9999}{0..9999}")
    with pytest.raises(ConfigError, match="more than 1,000,000"):
        expand_braces("{0..99999999999}")  # refused before a name is made


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[tuple[Path, Samples]]:
    samples = make_shards(tmp_path / "ro")
    make_read_only(tmp_path / "ro")
    yield tmp_path / "ro", samples
    make_writable(tmp_path / "ro")


def test_the_cli_expands_a_quoted_pattern(tmp_path: Path, shards: tuple[Path, Samples]) -> None:
    ro, samples = shards
    before = snapshot(ro)
    pattern = f"{ro}/shard-{{000000..000003}}.tar"  # quoted: the shell leaves it
    done = tierfeed("index", pattern, "--out", tmp_path / "store", "-q")
    assert done.returncode == 0, done.stderr
    assert "in 4 shards" in done.stdout
    assert read_back(Dataset(tmp_path / "store", plan="sequential", batch_size=7)) == samples
    assert tierfeed("verify", tmp_path / "store", "-q").returncode == 0
    missing = f"{ro}/shard-{{000000..000004}}.tar"  # one too many: nothing is written
    line = assert_user_error(
        tierfeed("index", missing, "--out", tmp_path / "other", "-q"), "index", "shard-000004"
    )
    assert "does not exist" in line and not (tmp_path / "other").exists()
    assert snapshot(ro) == before


def test_url_patterns_expand_before_globs(tmp_path: Path) -> None:
    root = "s3://bucket/shards"
    names = _names_under(None, root, [f"{root}/shard-{{000000..000002}}.tar"])  # type: ignore[arg-type]
    assert names == [f"shard-{i:06d}.tar" for i in range(3)]
    for out in (root, tmp_path / "store"):  # refused before any request
        with pytest.raises(ConfigError, match="gzipped shard"):
            index_shards([f"{root}/s-{{0,1}}.tar.gz"], out)


def test_url_shards_a_local_store_cannot_hold_are_one_line(tmp_path: Path) -> None:
    local = tmp_path / "s-0.tar"
    done = tierfeed("index", "s3://bucket/s-0.tar", local, "--out", tmp_path / "store", "-q")
    assert "all local files or all at URLs" in assert_user_error(done, "index", local)
    done = tierfeed("index", "s3://a/s-0.tar", "s3://b/s-0.tar", "--out", tmp_path / "store")
    assert "in one bucket" in assert_user_error(done, "index", "s3://a/s-0.tar", "s3://b/")
    assert not (tmp_path / "store").exists()


def test_dataset_takes_a_list_and_a_pattern_indexed_once(
    tmp_path: Path,
    shards: tuple[Path, Samples],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    ro, samples = shards
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    before = snapshot(ro)
    listed = [str(p) for p in sorted(ro.glob("*.tar"))]
    assert read_back(Dataset(listed, plan="sequential", batch_size=5)) == samples
    said = capfd.readouterr().err.splitlines()
    assert len(said) == 1 and "indexing 4 shard(s)" in said[0], said
    stores = list((tmp_path / "cache" / "shards").iterdir())
    assert len(stores) == 1 and (stores[0] / "index.tfi").exists()
    # The same shards again, as a pattern: the same store, reused without a word.
    pattern = str(ro / "shard-{000000..000003}.tar")
    with Loader(Dataset(pattern, plan="global", batch_size=4), num_workers=2) as loader:
        assert read_back(loader) == samples
    assert capfd.readouterr().err == ""
    assert list((tmp_path / "cache" / "shards").iterdir()) == stores
    assert snapshot(ro) == before  # the index went to the cache, not beside the shards


def test_a_changed_shard_is_indexed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    make_shards(tmp_path / "shards", shards=2)
    listed = [tmp_path / "shards" / f"shard-00000{s}.tar" for s in range(2)]
    first = StoreLocation.of(listed)
    assert "indexing 2 shard(s)" in capfd.readouterr().err
    assert StoreLocation.of(listed) == first and capfd.readouterr().err == ""
    samples = make_shards(tmp_path / "shards", shards=2, per_shard=3)  # rewritten in place
    os.utime(listed[1], ns=(1, 1))  # (a distinct mtime even on a coarse clock)
    assert StoreLocation.of(listed) == first
    assert "indexing 2 shard(s)" in capfd.readouterr().err
    assert read_back(Dataset(first, plan="sequential", batch_size=2)) == samples


@pytest.mark.parametrize(
    ("store", "match"),
    [
        ([], "empty list"),
        (["s3://bucket/shard-000000.tar"], "indexed once where they lie"),
        ("s3://bucket/shard-{000000..000001}.tar", "indexed once where they lie"),
        ([1, 2], "paths"),
    ],
)
def test_shard_lists_a_store_cannot_be_made_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: Any, match: str
) -> None:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=match):
        Dataset(store)
