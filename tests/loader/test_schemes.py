"""Every kind of store a URL names, end to end: S3 (moto), GCS (gcp-storage-emulator), Azure
Blob (Azurite), and plain http(s) (read-only; files served with ranges and ETags), each behind
a proxy that counts requests and injects faults (`tests/objectstore.py:Remote`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest
import torch

from tests.format.conftest import QUIET, write_tree
from tests.objectstore import Remote
from tests.s3proxy import Fault
from tierfeed.errors import ChunkCorruptError, NotFoundError, ReadOnlyError, StorageError
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import PackOptions
from tierfeed.loader.compose import open_store
from tierfeed.loader.upload import pack
from tierfeed.storage.fsspec_driver import FsspecDriver
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, TierConfig

pytestmark = pytest.mark.timeout(120)

N = 90
FILES = {f"c{i % 3}/f{i:03d}.bin".encode(): b"%d:" % i + os.urandom(700 + 37 * i) for i in range(N)}


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store, packed locally: 90 samples in several chunks."""
    from tierfeed.format.pack import pack as local_pack

    root = tmp_path_factory.mktemp("schemes")
    write_tree(root / "src", FILES)
    local_pack(root / "src", root / "store", PackOptions(chunk_size=16384, progress=False))
    return root / "store"


def put(remote: Remote, local: Path, prefix: str, tmp_path: Path) -> str:
    """The store at ``prefix``: packed there by tierfeed, or (http, read-only) put by hand."""
    if remote.scheme == "http":
        with pytest.raises(ReadOnlyError, match="read-only"):  # refused before any work
            pack(local.parent / "src", remote.url(prefix), QUIET)
        assert not (staging := tmp_path / "cache" / "upload").exists() or not any(staging.iterdir())
        return remote.put_tree(local, prefix)
    url = remote.url(prefix)
    pack(local.parent / "src", url, PackOptions(chunk_size=16384, progress=False),
         storage_options=remote.options)  # fmt: skip
    return url


def cli(remote: Remote, *args: str) -> subprocess.CompletedProcess[str]:
    """``tierfeed ARGS`` with the store's credentials and endpoint in the environment only."""
    return subprocess.run(
        [sys.executable, "-m", "tierfeed", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **remote.env},
    )  # fmt: skip


def number(sample: Sample) -> torch.Tensor:
    return torch.tensor(int(sample.fields["bin"].split(b":")[0]))


def test_pack_read_inspect_and_verify(remote: Remote, local: Path, tmp_path: Path) -> None:
    url = put(remote, local, "data/small", tmp_path)
    with open_store(url, storage_options=remote.options) as store, open_store(local) as mine:
        assert store.location == url and len(store) == len(mine) == N
        assert [store.read_sample(i) for i in range(N)] == [mine.read_sample(i) for i in range(N)]
    shown = cli(remote, "inspect", url)
    assert shown.returncode == 0, shown.stderr
    assert f"{N}" in shown.stdout
    checked = cli(remote, "verify", url)
    assert checked.returncode == 0, checked.stderr


def chunk_range(target: str, header: str) -> tuple[str, tuple[int, int | None]]:
    """A GET's chunk (``chunks/NNNNNN.tar``) and its byte range (first, last); a GET without a
    Range header (or one open at its end) reads to the object's end: last None."""
    found = re.search(r"chunks/[0-9]+\.tar", unquote(target))
    assert found, target
    if not header:
        return found.group(), (0, None)
    first, last = header.removeprefix("bytes=").split("-")
    return found.group(), (int(first), int(last) if last else None)


def test_two_epochs_with_a_disk_tier_get_each_chunk_once(
    remote: Remote, local: Path, tmp_path: Path
) -> None:
    url = put(remote, local, "data/epochs", tmp_path)
    remote.proxy.reset_log()
    tiers = TierConfig(disk_dir=str(tmp_path / "tier"), disk_bytes=10**9)
    ds = Dataset(url, "global", batch_size=16, decode=number, tiers=tiers,
                 storage_options=remote.options)  # fmt: skip
    ranges, gets = [], []
    with Loader(ds, num_workers=2) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(int(v) for batch in loader for v in batch) == list(range(N))
            ds.store().source.drain(30)  # type: ignore[attr-defined]
            time.sleep(0.2)  # the workers' last copies land too
            # A GET that runs late may be hedged by a second of the same range (a loaded
            # machine): each chunk's bytes once is one range a chunk, none in epoch 2.
            ranges.append({chunk_range(t, r) for t, r in remote.data_ranges("/chunks/")})
            gets.append(len(remote.data_gets("/chunks/")))
            remote.proxy.reset_log()
    with open_store(local) as mine:
        sizes = {c.name: c.size for c in mine.chunks}
    whole = {(name, (0, size - 1)) for name, size in sizes.items()}
    got = {(name, (first, sizes[name] - 1 if last is None else last))
           for name, (first, last) in ranges[0]}  # fmt: skip
    assert whole <= got and ranges[1] == set() and gets[1] == 0, ranges
    # A read that waited out its landing wait for its chunk's copy (a loaded machine, as CI's
    # once) reads its own range apart, inside its chunk: that is the hedge, a few at most.
    apart = got - whole
    assert len(apart) <= 3, apart
    assert all(0 <= first <= last < sizes[name] for name, (first, last) in apart), apart


def test_a_missing_object_and_a_missing_bucket_are_one_clear_error(remote: Remote) -> None:
    with pytest.raises(NotFoundError, match="no such object"):
        FsspecDriver(remote.url("nowhere"), read_only=True, **remote.options).size("x.bin")
    if remote.scheme != "http":  # an http server has no buckets
        gone = remote.url("x").replace(remote.bucket, remote.bucket + "-none", 1)
        with pytest.raises(NotFoundError, match="no such bucket"):
            FsspecDriver(gone, read_only=True, **remote.options).size("x.bin")
    shown = cli(remote, "inspect", remote.url("nowhere"))
    assert shown.returncode != 0
    assert shown.stderr.startswith("tierfeed inspect: error:") and shown.stderr.count("\n") == 1
    assert "Traceback" not in shown.stderr


def test_an_object_rewritten_under_a_running_job_is_an_error_not_mixed_bytes(
    remote: Remote, local: Path, tmp_path: Path
) -> None:
    url = put(remote, local, "data/rewritten", tmp_path)
    with open_store(url, storage_options=remote.options) as store:
        first = store.chunks[0].name
        assert store.read_sample(0).fields["bin"] == FILES[b"c0/f000.bin"]  # pins the version
        size = (local / first).stat().st_size
        remote.rewrite("data/rewritten", first, os.urandom(size))
        if remote.scheme == "gs":
            # The GCS emulator serves the newest bytes whatever generation is asked (real GCS
            # answers 404 for a generation replaced, which is the error below): shown here is
            # that every read asks for the pinned one, and that the new bytes are not served.
            remote.proxy.reset_log()
            with pytest.raises(ChunkCorruptError, match="fails its checksum"):
                store.read_sample(3)  # the new bytes: caught by the member's checksum
            asked = remote.data_gets("/chunks/")
            assert asked and all("generation=" in t for t in asked)
            return
        with pytest.raises(StorageError, match="changed while this job read it"):
            store.read_sample(3)


def test_throttling_and_server_errors_are_retried(
    remote: Remote, local: Path, tmp_path: Path
) -> None:
    url = put(remote, local, "data/throttled", tmp_path)
    driver = FsspecDriver(url, read_only=True, **remote.options)
    with driver:
        driver.size(INDEX_NAME)
        remote.proxy.inject(Fault(method="GET", key_contains=INDEX_NAME, status=503,
                                  code="SlowDown", times=2))  # fmt: skip
        remote.proxy.inject(Fault(method="GET", key_contains=INDEX_NAME, status=429,
                                  code="TooManyRequests", times=1))  # fmt: skip
        assert driver.read_range(INDEX_NAME, 0, 16) == (local / INDEX_NAME).read_bytes()[:16]
        # Retried here and counted; GCS's own library retries its requests itself (uncounted).
        assert driver.counters.retries == (0 if remote.scheme == "gs" else 3)
        gets = len(remote.data_gets(INDEX_NAME))
        # gcsfs may ask for the object's metadata again (not a data GET): a fault then falls
        # on that request (seen once in a CI run: 3 data GETs).
        assert gets in (3, 4) if remote.scheme == "gs" else gets == 4
