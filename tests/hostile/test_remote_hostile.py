"""A store at a URL, attacked: a damaged index at the URL, a cached index damaged in place, a
fetch killed midway, a full cache disk while the index is cached or a pack is staged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.objectstore import client, env, s3_options, upload
from tests.s3proxy import Fault, S3Proxy
from tierfeed.errors import IndexFormatError, StorageError, TierfeedError
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.compose import open_store

pytestmark = pytest.mark.timeout(120)

FILES = {f"c{i % 2}/f{i:03d}.bin".encode(): os.urandom(3000 + 7 * i) for i in range(60)}


@pytest.fixture
def local(packed: Callable[..., Path]) -> Path:
    return packed(FILES)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def cli(endpoint: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierfeed", *args], capture_output=True, text=True, timeout=90,
        env={**os.environ, **env(endpoint), **extra},
    )  # fmt: skip


@pytest.mark.parametrize("damage", ["flipped", "truncated", "garbage"])
def test_a_damaged_index_at_a_url_is_one_error_naming_the_url(
    local: Path, s3_endpoint: str, bucket: str, damage: str
) -> None:
    data = bytearray((local / INDEX_NAME).read_bytes())
    if damage == "flipped":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncated":
        del data[len(data) * 2 // 3 :]
    else:
        data[:] = os.urandom(len(data))
    (local / INDEX_NAME).write_bytes(bytes(data))
    url = upload(s3_endpoint, local, bucket, "damaged")
    with pytest.raises(IndexFormatError) as caught:
        open_store(url, storage_options=s3_options(s3_endpoint))
    assert f"{url}/{INDEX_NAME}" in str(caught.value)
    shown = cli(s3_endpoint, "inspect", url)
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    assert shown.stderr.startswith("tierfeed inspect: error:") and shown.stderr.count("\n") == 1
    assert url in shown.stderr


def test_a_cached_index_damaged_in_place_is_fetched_again(
    local: Path, s3_endpoint: str, bucket: str, cache: Path
) -> None:
    url = upload(s3_endpoint, local, bucket, "rotted")
    options = s3_options(s3_endpoint)
    with open_store(url, storage_options=options) as store:
        first = store.read_sample(5)
    (cached,) = (cache / "index").rglob(f"*-{INDEX_NAME}")
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot, or another hand: same size, other bytes
    cached.write_bytes(bytes(data))
    with open_store(url, storage_options=options) as store:
        assert store.read_sample(5) == first
    assert cached.read_bytes() == (local / INDEX_NAME).read_bytes()


def test_an_index_fetch_killed_midway_leaves_nothing_used(
    local: Path, s3_endpoint: str, bucket: str, cache: Path
) -> None:
    url = upload(s3_endpoint, local, bucket, "killed")
    with S3Proxy(s3_endpoint) as proxy:
        proxy.inject(Fault(method="GET", key_contains=INDEX_NAME, delay_s=60.0))
        fetcher = subprocess.Popen(
            [sys.executable, "-m", "tierfeed", "inspect", url],
            env={**os.environ, **env(proxy.url)}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not list((cache / "index").rglob(".tmp.*")):  # its copy has begun
                assert time.monotonic() < deadline and fetcher.poll() is None
                time.sleep(0.05)
        finally:
            fetcher.send_signal(signal.SIGKILL)
            fetcher.wait(10)
        proxy.clear()
        assert list((cache / "index").rglob(".tmp.*"))  # what the killed fetch left
        with open_store(url, storage_options=s3_options(proxy.url)) as store:
            assert len(store) == len(FILES)  # the lock died with it; the fetch starts over
    assert not list((cache / "index").rglob(".tmp.*"))  # swept


def test_a_full_cache_disk_while_caching_the_index_is_one_clear_error(
    local: Path, s3_endpoint: str, bucket: str, tmpfs: Callable[..., Path]
) -> None:
    url = upload(s3_endpoint, local, bucket, "nospace")
    tiny = tmpfs("tiny", "size=4k", "mode=0700")  # smaller than the index; private
    assert (local / INDEX_NAME).stat().st_size > 4096
    shown = cli(s3_endpoint, "inspect", url, TIERFEED_CACHE=str(tiny))
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    assert shown.stderr.count("\n") == 1 and "cannot cache the index" in shown.stderr
    assert "TIERFEED_CACHE" in shown.stderr
    assert not [p for p in tiny.rglob("*") if p.is_file() and p.name.endswith(INDEX_NAME)]


def test_a_full_disk_while_staging_a_pack_uploads_nothing(
    local: Path, s3_endpoint: str, bucket: str, tmpfs: Callable[..., Path]
) -> None:
    tiny = tmpfs("tiny", "size=64k", "mode=0700")  # the store is ~200 KB; private
    url = f"s3://{bucket}/staged"
    shown = cli(s3_endpoint, "pack", str(local.parent / "src"), url, TIERFEED_CACHE=str(tiny))
    assert shown.returncode != 0 and "Traceback" not in shown.stderr
    error = shown.stderr.strip().splitlines()[-1]  # after the progress bar
    assert error.startswith("tierfeed pack: error:") and "No space left" in error
    assert "TIERFEED_CACHE" in error and "choose a DST" not in error  # the staging's advice
    listed = client(s3_endpoint).list_objects_v2(Bucket=bucket, Prefix="staged/")
    assert listed.get("KeyCount", 0) == 0  # no store announced, no chunk left behind
    with pytest.raises(TierfeedError):
        open_store(url, storage_options=s3_options(s3_endpoint))


def test_a_stalled_index_fetch_is_bounded(local: Path, s3_endpoint: str, bucket: str) -> None:
    url = upload(s3_endpoint, local, bucket, "stalled")
    with S3Proxy(s3_endpoint) as proxy:
        proxy.inject(Fault(method="GET", key_contains=INDEX_NAME, delay_s=30.0, times=-1))
        started = time.monotonic()
        with pytest.raises(StorageError, match="gave up"):
            open_store(url, storage_options=s3_options(proxy.url, read_timeout=0.5))
        assert time.monotonic() - started < 25
