"""Transient faults of an S3 origin (tests/s3proxy.py in front of moto): a connection reset in
the middle of a body, a body shorter than its Content-Length, an endpoint that stops answering.
Each face (the loader with no cache tier, stage-in, verify, the mount) gets the same retry
policy: a counted retry of the bytes still missing, and an error only when its bound is spent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.objectstore import env, s3_options, upload
from tests.s3proxy import Fault, S3Proxy
from tierfeed.format.index import Index
from tierfeed.storage.store import Sample

pytestmark = pytest.mark.timeout(90)

# 60 samples in a few chunks: the store (one reset ended the epoch at 0 of 60).
FILES = {f"c{i % 2}/f{i:03d}.bin".encode(): os.urandom(3000 + 7 * i) for i in range(60)}
CUTS = [
    Fault(method="GET", key_contains="/chunks/", cut_after=1000, reset=True),  # a reset
    Fault(method="GET", key_contains="/chunks/", cut_after=2500),  # a short body
]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[S3Proxy]:
    with S3Proxy(s3_endpoint) as running:
        yield running


@pytest.fixture
def url(packed: Callable[..., Path], s3_endpoint: str, bucket: str) -> str:
    return upload(s3_endpoint, packed(FILES), bucket, "faulty")


def _key(sample: Sample) -> tuple[str, bytes]:
    return sample.key, sample.fields["bin"]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_without_tiers_survives_a_reset_and_a_short_body(
    url: str, proxy: S3Proxy, workers: int
) -> None:
    from tierfeed.torch import Dataset, Loader

    ds = Dataset(url, "global", batch_size=7, decode=_key, collate=list,
                 storage_options=s3_options(proxy.url))  # fmt: skip
    for fault in CUTS:
        proxy.inject(fault)
    with Loader(ds, num_workers=workers) as loader:
        got = [item for batch in loader for item in batch]
        assert loader.last_epoch is not None
        origin = loader.last_epoch["tiers"]["origin"]
    keys = [k for k, _ in got]
    assert sorted(keys) == sorted({k for k, _ in got}) and len(keys) == len(FILES)  # once each
    assert {f"{k}.bin".encode(): v for k, v in got} == FILES
    assert proxy.count("GET", "/chunks/") >= 2 + 2  # the two cut GETs, and their retries
    assert origin["retries"] == 2  # summed over the workers


def test_a_retry_asks_only_for_the_bytes_not_received(url: str, proxy: S3Proxy) -> None:
    from tierfeed.storage import driver_for

    with driver_for(f"{url}", **s3_options(proxy.url)) as origin:
        name = "chunks/" + sorted(p for p in origin.list("chunks/"))[0].split("/", 1)[1]
        size = origin.size(name)
        proxy.reset_log()
        proxy.inject(CUTS[1])  # a short body: what arrived is kept (a reset may drop it)
        data = origin.read_range(name, 100, size - 100)
        assert len(data) == size - 100 and origin.counters.retries == 1
    ranges = [r for m, t, r in proxy.requests if m == "GET" and "/chunks/" in t]
    assert ranges == [f"bytes=100-{size - 1}", f"bytes=2600-{size - 1}"]


def test_stage_in_survives_a_reset(url: str, proxy: S3Proxy, tmp_path: Path) -> None:
    from tierfeed.distributed.staging import stage
    from tierfeed.format.verify import verify_store

    proxy.inject(CUTS[0])
    report = stage(url, tmp_path / "local", progress=False, storage_options=s3_options(proxy.url))
    with Index(report.local_dir) as ix:
        assert report.chunks_copied + report.parts_copied >= ix.num_chunks
    assert verify_store(report.local_dir, progress=False) == []
    assert report.origin_retries == 1 and "1 retries" in report.summary()


def test_verify_over_s3_survives_a_reset(url: str, proxy: S3Proxy) -> None:
    from tierfeed.loader.commands import verify_location
    from tierfeed.loader.location import StoreLocation

    proxy.inject(CUTS[0])
    proxy.inject(CUTS[1])
    assert verify_location(StoreLocation.of(url, s3_options(proxy.url)), progress=False) == []


@pytest.mark.fuse
@pytest.mark.parametrize("tiered", [False, True])
def test_the_mount_answers_eio_within_its_timeout_when_the_endpoint_stalls(
    url: str, proxy: S3Proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiered: bool
) -> None:
    from tierfeed.fuse.process import FuseProcess

    for name, value in env(proxy.url).items():
        monkeypatch.setenv(name, value)  # the mount process takes the SDK's own settings
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = [sys.executable, "-m", "tierfeed", "mount", url, str(mnt), "--foreground"]
    if tiered:  # a read waits for a copy in flight too: the mount's bound holds over that wait
        argv += ["--disk", str(tmp_path / "disk"), "--disk-size", "1GiB"]
    with FuseProcess([*argv, "--timeout", "3"], mnt) as server:
        # The last chunk (read ahead: with tiers it is copied before the stall, not the others).
        assert (mnt / "c1" / "f059.bin").read_bytes() == FILES[b"c1/f059.bin"]
        proxy.inject(Fault(method="GET", key_contains="/chunks/", delay_s=60.0, times=-1))
        # Two files at once: the second is not stuck behind the first.
        started = time.monotonic()
        cats = {rel: subprocess.Popen(["cat", str(mnt / rel)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
                for rel in ("c0/f000.bin", "c0/f030.bin")}  # fmt: skip
        for rel, cat in cats.items():
            _, err = cat.communicate(timeout=20)
            took = time.monotonic() - started
            assert cat.returncode != 0 and "Input/output error" in err, (rel, err)
            # 3 s and the kernel's round trip; without the mount's own bound, a tiered read
            # waited for the failed copy, then for its own read of the origin: 5.4 s.
            assert took < 4.5, (rel, took)
        proxy.clear()
        time.sleep(1.2)  # a failed member answers EIO at once for a second (the kernel's retry)
        assert (mnt / "c0" / "f000.bin").read_bytes() == FILES[b"c0/f000.bin"]  # no EIO kept
        log = server.output()
    lines = [line for line in log.splitlines() if "answered EIO" in line]
    assert len(lines) == 2, log  # one line per failed read, naming the file
    assert set(cats) == {rel for rel in cats for line in lines if rel in line}


# --- a file-system origin (NFS, Lustre): the same policy, through a FUSE mount that fails reads


def _faulty_mount(tmp_path: Path, *faults: str) -> Any:
    from tierfeed.fuse.process import FuseProcess

    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir(exist_ok=True)
    (src / "obj.bin").write_bytes(BLOB)
    mnt.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "tests.storage.faultyfs", str(src), str(mnt)]
    return FuseProcess([*argv, *(f"--fault={fault}" for fault in faults)], mnt)


BLOB = os.urandom(300_000)


@pytest.mark.fuse
@pytest.mark.parametrize(
    ("fault", "retries"),
    [
        ("EAGAIN:obj.bin:1", 1), ("ETIMEDOUT:obj.bin:1", 1), ("ESTALE:obj.bin:1", 1),
        ("empty:obj.bin:2", 1),  # read on once at once, then again after a backoff
        ("half:obj.bin:3", 0),  # a short read is read on: no fault
    ],
)  # fmt: skip
def test_a_file_system_origin_retries_transient_faults_and_short_reads(
    tmp_path: Path, fault: str, retries: int
) -> None:
    from tierfeed.storage.posix import PosixDriver

    with (
        _faulty_mount(tmp_path, fault),
        PosixDriver(tmp_path / "mnt", read_only=True) as origin,
    ):
        # One request of the kernel's (under 128 KiB): the fault hits this read.
        assert origin.read_range("obj.bin", 1000, 50_000) == BLOB[1000:51_000]
        assert origin.read_range("obj.bin", 0, 300_000) == BLOB
        assert origin.read_range("obj.bin", 299_000, 5000) == BLOB[299_000:]  # the end
        assert origin.counters.retries == retries


@pytest.mark.fuse
def test_a_file_system_origin_gives_up_or_fails_at_once(tmp_path: Path) -> None:
    from tierfeed.errors import StorageError
    from tierfeed.storage.posix import PosixDriver
    from tierfeed.storage.retry import RetryPolicy

    with _faulty_mount(tmp_path, "EAGAIN:obj.bin:100", "EIO:other:1"):
        (tmp_path / "src" / "other.bin").write_bytes(b"x" * 100)
        with PosixDriver(tmp_path / "mnt", True, retry=RetryPolicy(3, 0.01, 0.05)) as origin:
            with pytest.raises(StorageError, match=r"obj.bin: gave up after 3 tries .*EAGAIN"):
                origin.read_range("obj.bin", 0, 100)
            assert origin.counters.retries == 2
            with pytest.raises(StorageError, match=r"other.bin: Input/output error"):
                origin.read_range("other.bin", 0, 100)  # not transient: no retry
            assert origin.counters.retries == 2


@pytest.mark.parametrize("value", ["0", "-1", "nan", "1e9"])
def test_a_bad_mount_timeout_is_one_error_line(tmp_path: Path, value: str) -> None:
    (tmp_path / "mnt").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tierfeed", "mount", "s3://b/ds", str(tmp_path / "mnt"),
         "--timeout", value],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("tierfeed mount: error: --timeout must be between 0 and 3600")


@pytest.mark.fuse
def test_one_fault_under_several_ranges_is_one_retry(tmp_path: Path) -> None:
    from tierfeed.storage.posix import PosixDriver

    with (
        _faulty_mount(tmp_path, "EAGAIN:obj.bin:1"),
        PosixDriver(tmp_path / "mnt", read_only=True) as origin,
    ):
        got = origin.read_ranges("obj.bin", [0, 7000, 200_000], [100, 5000, 100])
        assert got == [BLOB[:100], BLOB[7000:12_000], BLOB[200_000:200_100]]
        assert origin.counters.retries == 1


def test_head_reads_from_s3_survive_a_reset_and_a_short_body(
    packed: Callable[..., Path], s3_endpoint: str, bucket: str, proxy: S3Proxy
) -> None:
    """A worker's first batch read at once from an object store (`HeadReads`, on a store whose
    chunks' pieces are many times the head): its first GETs cut, by a reset and by a short
    body, are retried for the bytes missing and every sample served is the store's."""
    from tierfeed.loader.clairvoyance import tell_head
    from tierfeed.loader.compose import open_store
    from tierfeed.storage import MemoryDriver, Tier, TierStack, driver_for
    from tierfeed.storage.tiers import TierOptions

    local = packed(FILES)
    url = upload(s3_endpoint, local, bucket, "heads")
    head = list(range(0, len(FILES), 4))  # 15 samples, before any copy: the first GETs
    options = TierOptions(threads=1, urgent_copies=1, piece_bytes=256, landing_wait_s=5)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    for fault in CUTS:
        proxy.inject(fault)
    with (
        driver_for(url, **s3_options(proxy.url)) as origin,
        TierStack(Index(local).chunks(), origin, [ram], options=options) as stack,
        open_store(local, source=stack) as store,
        open_store(local) as expected,
    ):
        assert tell_head(store, np.asarray(head, dtype=np.int64)) == len(head)
        for i in head:
            assert _key(store.read_sample(i)) == _key(expected.read_sample(i))
        assert stack.head.pending == 0
        # The first GETs of chunks are the heads' (no copy has begun): each cut one was tried
        # again, once, for the bytes it had not received.
        assert origin.counters.retries == len(CUTS)
    assert proxy.count("GET", "/chunks/") >= len(head) + len(CUTS)
