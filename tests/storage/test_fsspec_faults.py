"""The fsspec driver against an S3 server that misbehaves on purpose (tests/s3proxy.py in front
of moto): throttling, refusals, stalls and a bucket that vanishes each end in a counted retry
or one clear error, within a time bound, never a hang."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.objectstore import object_behind_proxy, root_driver
from tests.s3proxy import Fault, S3Proxy
from tierfeed.errors import NotFoundError, StorageError
from tierfeed.storage.fsspec_driver import FsspecDriver, RetryPolicy

pytestmark = pytest.mark.timeout(60)

DATA = bytes(range(256)) * 64  # 16 KiB


@pytest.fixture
def proxy(s3_endpoint: str, bucket: str) -> Iterator[S3Proxy]:
    with object_behind_proxy(s3_endpoint, bucket, DATA) as running:
        yield running


def test_throttling_is_retried_and_counted(proxy: S3Proxy, bucket: str) -> None:
    d = root_driver(proxy.url, bucket)
    assert d.read_range("obj.bin", 0, 10) == DATA[:10]
    proxy.inject(Fault(method="GET", key_contains="obj.bin", status=503, code="SlowDown", times=2))
    assert d.read_range("obj.bin", 100, 50) == DATA[100:150]
    assert d.counters.retries == 2
    assert proxy.count("GET", "obj.bin", ranged=True) == 4  # one, then three for the second


def test_endless_throttling_gives_up_in_bounded_time(proxy: S3Proxy, bucket: str) -> None:
    d = root_driver(proxy.url, bucket)
    d.retry = RetryPolicy(attempts=4, base_s=0.05, cap_s=0.2)
    d.size("obj.bin")
    proxy.inject(Fault(method="GET", status=503, code="SlowDown", times=-1))
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"gave up after 4 tries .*SlowDown.*throttling"):
        d.read_range("obj.bin", 0, 10)
    assert time.monotonic() - started < 5 and d.counters.retries == 3


def test_access_denied_is_one_clear_error_and_not_retried(proxy: S3Proxy, bucket: str) -> None:
    proxy.inject(Fault(key_contains="obj.bin", status=403, code="AccessDenied", times=-1))
    d = root_driver(proxy.url, bucket)
    with pytest.raises(StorageError, match=r"obj.bin: access denied .*check the credentials"):
        d.read_range("obj.bin", 0, 10)
    assert d.counters.retries == 0


def test_a_stalled_request_times_out_and_is_tried_again(proxy: S3Proxy, bucket: str) -> None:
    d = root_driver(proxy.url, bucket, read_timeout=0.5, connect_timeout=0.5)
    d.size("obj.bin")
    proxy.inject(Fault(method="GET", key_contains="obj.bin", delay_s=5.0, times=1))
    started = time.monotonic()
    assert d.read_range("obj.bin", 0, 100) == DATA[:100]
    assert time.monotonic() - started < 3 and d.counters.retries == 1


def test_a_store_that_never_answers_is_an_error_not_a_hang(proxy: S3Proxy, bucket: str) -> None:
    d = root_driver(proxy.url, bucket, read_timeout=0.3, connect_timeout=0.3)
    d.retry = RetryPolicy(attempts=3, base_s=0.05, cap_s=0.1)
    d.size("obj.bin")
    proxy.inject(Fault(method="GET", delay_s=30.0, times=-1))
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"gave up after 3 tries .*timed out"):
        d.read_range("obj.bin", 0, 100)
    assert time.monotonic() - started < 5


def test_an_unreachable_endpoint_is_an_error_not_a_hang(bucket: str) -> None:
    from tests.objectstore import free_port

    d = root_driver(
        f"http://127.0.0.1:{free_port()}", bucket, connect_timeout=0.3, read_timeout=0.3
    )
    d.retry = RetryPolicy(attempts=2, base_s=0.01, cap_s=0.02)
    with pytest.raises(StorageError, match="gave up after 2 tries"):
        d.size("obj.bin")


def test_a_missing_object_and_a_vanished_bucket(proxy: S3Proxy, bucket: str) -> None:
    d = root_driver(proxy.url, bucket)
    with pytest.raises(NotFoundError, match=r"root/nope.bin: no such object"):
        d.read_range("nope.bin", 0, 1)
    proxy.inject(Fault(status=404, code="NoSuchBucket", times=-1))
    with pytest.raises(NotFoundError, match="no such bucket"):
        root_driver(proxy.url, bucket).size("obj.bin")


def test_endless_cut_bodies_give_up_naming_the_object_and_tries(
    proxy: S3Proxy, bucket: str
) -> None:
    d = root_driver(proxy.url, bucket)
    d.retry = RetryPolicy(attempts=3, base_s=0.01, cap_s=0.05)
    d.size("obj.bin")
    proxy.inject(Fault(method="GET", key_contains="obj.bin", cut_after=10, times=-1))
    with pytest.raises(StorageError, match=r"obj.bin: gave up after 3 tries .*connection cut"):
        d.read_range("obj.bin", 0, len(DATA))
    assert d.counters.retries == 2


def test_a_stall_costs_the_policy_deadline_not_tries_times_the_read_timeout(
    proxy: S3Proxy, bucket: str
) -> None:
    d = root_driver(proxy.url, bucket)  # botocore's read timeout: 60 s
    d.retry = RetryPolicy(attempts=6, deadline_s=1.0)
    d.size("obj.bin")
    proxy.inject(Fault(method="GET", delay_s=30.0, times=-1))
    started = time.monotonic()
    with pytest.raises(
        StorageError, match=r"obj.bin: gave up after 1 tries .*bound 1 s.*timed out"
    ):
        d.read_range("obj.bin", 0, 100)
    assert time.monotonic() - started < 2.5


def test_a_reset_then_a_412_is_the_changed_error_and_not_retried(
    proxy: S3Proxy, bucket: str
) -> None:
    d = root_driver(proxy.url, bucket)
    d.size("obj.bin")
    proxy.inject(Fault(method="GET", key_contains="obj.bin", cut_after=100))
    proxy.inject(Fault(method="GET", key_contains="obj.bin", status=412, code="PreconditionFailed"))
    with pytest.raises(StorageError, match=r"obj.bin: the object changed while this job read it"):
        d.read_range("obj.bin", 0, len(DATA))
    assert d.counters.retries == 1
    assert proxy.count("GET", "obj.bin") == 2  # the cut, then the refused rest: no third try


@pytest.mark.hostile
def test_an_answer_longer_than_the_range_is_refused_not_read_on(
    proxy: S3Proxy, bucket: str
) -> None:
    d = root_driver(proxy.url, bucket)
    d.size("obj.bin")
    proxy.inject(Fault(method="GET", key_contains="obj.bin", pad=2 * 2**20))
    with pytest.raises(StorageError, match=r"obj.bin: answered more than bytes 0-99"):
        d.read_range("obj.bin", 0, 100)
    assert d.counters.retries == 0
    assert d.read_range("obj.bin", 0, 100) == DATA[:100]  # the next, plain answer reads


def test_requests_in_flight_are_not_capped_by_the_connection_pool(
    proxy: S3Proxy, bucket: str
) -> None:
    """botocore's pool holds 10 connections by default and queues a request past them
    silently; the driver's pool has room for what the fetch keeps in flight."""
    from concurrent.futures import ThreadPoolExecutor

    d = root_driver(proxy.url, bucket)
    d.size("obj.bin")
    width = 2 * FsspecDriver.parallel_requests
    proxy.inject(Fault(method="GET", key_contains="obj.bin", delay_s=2.0, times=-1))
    with ThreadPoolExecutor(width) as pool:
        reads = [pool.submit(d.read_range, "obj.bin", i, 10) for i in range(width)]
        arrived, deadline = 0, time.monotonic() + 1.5  # before the first answer comes
        while arrived < width and time.monotonic() < deadline:
            arrived = proxy.count("GET", "obj.bin")  # logged as each request arrives
            time.sleep(0.01)
        assert arrived == width  # every request reached the store while the first waited
        assert [r.result() for r in reads] == [DATA[i : i + 10] for i in range(width)]
    d.close()


def test_reads_that_start_together_make_one_head(proxy: S3Proxy, bucket: str) -> None:
    """The pieces of a copy start at once; the object is looked at (pinned) once for all."""
    from concurrent.futures import ThreadPoolExecutor

    d = root_driver(proxy.url, bucket)
    proxy.inject(Fault(method="HEAD", key_contains="obj.bin", delay_s=0.3, times=-1))
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda i: d.read_range("obj.bin", i, 10), range(16)))
    assert got == [DATA[i : i + 10] for i in range(16)]
    assert proxy.count("HEAD", "obj.bin") == 1 and d.counters.stats == 1
    d.close()
