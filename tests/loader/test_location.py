"""Stores by URL: `open_store` on a real S3 protocol server (moto, on loopback)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.format.conftest import QUIET, write_tree
from tests.objectstore import client, s3_options, upload
from tierfeed.errors import ConfigError, IndexFormatError, StorageError
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import pack
from tierfeed.loader.compose import TierConfig, open_store
from tierfeed.loader.location import StoreLocation, fetch_index
from tierfeed.storage.fsspec_driver import FsspecDriver

pytestmark = pytest.mark.timeout(120)

FILES = {f"c{i % 3}/f{i:03d}.bin".encode(): os.urandom(1500 + 61 * i) for i in range(90)}


@pytest.fixture
def local_store(packed: Callable[..., Path]) -> Path:
    return packed(FILES)


@pytest.fixture
def url(local_store: Path, s3_endpoint: str, bucket: str) -> str:
    return upload(s3_endpoint, local_store, bucket, "datasets/small")


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_store_at_a_url_reads_as_its_directory_does(
    url: str, local_store: Path, s3_endpoint: str
) -> None:
    remote, local = (
        open_store(url, storage_options=s3_options(s3_endpoint)),
        open_store(local_store),
    )
    with remote, local:
        assert remote.location == url and len(remote) == len(local) == len(FILES)
        for i in range(len(local)):
            assert remote.read_sample(i) == local.read_sample(i)
        assert remote.chunk_location(0) == f"{url}/{remote.chunks[0].name}"


@pytest.mark.parametrize("suffix", ["/", f"/{INDEX_NAME}"])
def test_a_url_may_end_in_a_slash_or_name_the_index(
    url: str, s3_endpoint: str, suffix: str
) -> None:
    with open_store(url + suffix, storage_options=s3_options(s3_endpoint)) as store:
        assert store.location == url and len(store) == len(FILES)


def test_the_index_is_fetched_once_per_host_and_anew_when_rewritten(
    url: str, s3_endpoint: str, bucket: str, tmp_path: Path, own_cache: Path
) -> None:
    options, cache = s3_options(s3_endpoint), own_cache / "index"  # open_store's default
    first = FsspecDriver(url, read_only=True, **options)
    with fetch_index(first, url, cache) as index:  # open from the copy it checked
        cached = index.path
    assert first.counters.reads >= 1
    again = FsspecDriver(url, read_only=True, **options)
    with fetch_index(again, url, cache) as index:
        assert index.path == cached
    assert again.counters.reads == 0  # a HEAD of the index, no GET
    # The store is re-packed in place with fewer samples: its new index is fetched, the old
    # copy goes.
    fewer = dict(list(FILES.items())[:30])
    write_tree(tmp_path / "src2", fewer)
    pack(tmp_path / "src2", tmp_path / "store2", QUIET)
    upload(s3_endpoint, tmp_path / "store2", bucket, "datasets/small")
    with open_store(url, storage_options=options) as store:
        assert len(store) == 30
    assert not cached.exists()
    assert len(list(cached.parent.glob(f"*-{INDEX_NAME}"))) == 1


def test_a_disk_tier_over_a_url_reads_each_chunk_once(
    url: str, s3_endpoint: str, tmp_path: Path
) -> None:
    tiers = TierConfig(disk_dir=str(tmp_path / "disk"), disk_bytes=2**30, policy="fill-top")
    with open_store(url, tiers, storage_options=s3_options(s3_endpoint)) as store:
        for i in range(len(store)):
            store.read_sample(i)
        store.source.drain(30)
        origin = store.source.origin  # type: ignore[attr-defined]
        gets = origin.counters.reads
        assert gets <= len(store.chunks) + len(store)  # pieces, and reads before a copy began
        for i in range(len(store)):
            store.read_sample(i)
        assert origin.counters.reads == gets  # the second pass: no GET of chunk data
    # The index was cached beside the disk tier's chunks (node-local), not in the user's cache.
    assert list((tmp_path / "disk" / ".index").rglob(f"*-{INDEX_NAME}"))


def test_a_chunk_rewritten_under_a_running_job_is_an_error_not_mixed_bytes(
    url: str, s3_endpoint: str, bucket: str
) -> None:
    with open_store(url, storage_options=s3_options(s3_endpoint)) as store:
        sample = int(np.flatnonzero(store.index.sample_chunk == 1)[0])
        store.read_sample(sample)  # the chunk's ETag is pinned
        key = f"datasets/small/{store.chunks[1].name}"
        s3 = client(s3_endpoint)
        body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        body[700] ^= 0xFF
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
        with pytest.raises(StorageError, match="changed while this job read it"):
            store.read_sample(sample)


def test_missing_bucket_and_missing_store_name_what_is_missing(
    s3_endpoint: str, bucket: str
) -> None:
    options = s3_options(s3_endpoint)
    with pytest.raises(
        IndexFormatError, match=r"s3://no-such-bucket-x/ds/index.tfi: no such bucket"
    ):
        open_store("s3://no-such-bucket-x/ds", storage_options=options)
    with pytest.raises(IndexFormatError, match=rf"s3://{bucket}/nothing/index.tfi: no such object"):
        open_store(f"s3://{bucket}/nothing", storage_options=options)


def test_locations_parse() -> None:
    assert StoreLocation.of("s3://b/ds/").text == "s3://b/ds"
    assert StoreLocation.of("s3://b/ds/").remote
    local = StoreLocation.of("file:///data/ds")
    assert not local.remote and local.text == "/data/ds"
    assert StoreLocation.of(f"/data/ds/{INDEX_NAME}").root == "/data/ds"
    with pytest.raises(ConfigError, match="storage_options apply to URLs"):
        StoreLocation.of("/data/ds", {"key": "k"})
