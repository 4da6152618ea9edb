"""The pieces of a copy from S3 (`FsspecDriver.read_block`), on the calling thread through
botocore's blocking client (`S3Ranges`), keep every promise the event loop's reads keep: the
right bytes, the pinned version, a cut answer resumed where it broke, errors translated, waits
bounded, and no client shared across a fork (tests/s3proxy.py in front of moto). The tests of
those promises run again against obstore's client (tests/storage/test_nativeranges.py)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.objectstore import client, env, object_behind_proxy, root_driver, s3_options
from tests.s3proxy import Fault, S3Proxy
from tierfeed.errors import NotFoundError, StorageError
from tierfeed.storage.fsspec_driver import FsspecDriver, RetryPolicy
from tierfeed.storage.s3ranges import S3Ranges

pytestmark = pytest.mark.timeout(60)

DATA = os.urandom(3 * 2**20 + 12345)  # more than one block of a body


@pytest.fixture(autouse=True)
def receiver(monkeypatch: pytest.MonkeyPatch) -> str:
    """Whose client receives: botocore's, the default."""
    monkeypatch.delenv("TIERFEED_S3_CLIENT", raising=False)
    return "botocore"


@pytest.fixture
def proxy(s3_endpoint: str, bucket: str) -> Iterator[S3Proxy]:
    with object_behind_proxy(s3_endpoint, bucket, DATA) as running:
        yield running


def threaded(proxy: S3Proxy, bucket: str, **config: float) -> FsspecDriver:
    """A driver whose pieces cannot be read on the event loop (an S3 call there fails)."""
    d = root_driver(proxy.url, bucket, **config)

    on_loop = d.fs._call_s3

    async def no_loop(method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "get_object":
            raise AssertionError("a piece was read on the event loop")
        return await on_loop(method, *args, **kwargs)

    d.size("obj.bin")  # the pin: a HEAD, on the event loop
    d.fs._call_s3 = no_loop
    return d


def test_pieces_read_the_right_bytes_on_the_calling_thread(proxy: S3Proxy, bucket: str) -> None:
    d = threaded(proxy, bucket)
    for offset, length in [(0, len(DATA)), (5, 100), (2**20 - 3, 2**20 + 7), (len(DATA) - 9, 50)]:
        assert d.read_block("obj.bin", offset, length) == DATA[offset : offset + length]
    assert d.read_block("obj.bin", len(DATA), 10) == b""  # past the end: no request
    assert proxy.count("GET", "obj.bin", ranged=True) == 4
    assert d.counters.reads == 4 and d.counters.bytes_read == len(DATA) + 100 + 2**20 + 7 + 9
    d.close()


def test_pieces_in_parallel_share_one_client(proxy: S3Proxy, bucket: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    d = threaded(proxy, bucket)
    spans = [(o, 2**18) for o in range(0, len(DATA), 2**18)]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda s: d.read_block("obj.bin", *s), spans))
    assert b"".join(got) == DATA
    ranges = d._threaded()
    assert ranges is not None and len(ranges._clients) == 1
    d.close()


def test_an_object_replaced_mid_job_is_an_error_naming_it(proxy: S3Proxy, bucket: str) -> None:
    d = threaded(proxy, bucket)
    assert d.read_block("obj.bin", 0, 10) == DATA[:10]
    client(proxy.url).put_object(Bucket=bucket, Key="root/obj.bin", Body=b"other" * 1000)
    with pytest.raises(StorageError, match=r"root/obj.bin: the object changed while this job"):
        d.read_block("obj.bin", 0, 10)
    assert d.counters.retries == 0


def test_an_object_deleted_mid_job_is_the_changed_error(proxy: S3Proxy, bucket: str) -> None:
    d = threaded(proxy, bucket)
    client(proxy.url).delete_object(Bucket=bucket, Key="root/obj.bin")
    with pytest.raises(StorageError, match=r"obj.bin: the object changed while this job"):
        d.read_block("obj.bin", 0, 10)


@pytest.mark.parametrize("reset", [False, True], ids=["short-body", "reset"])
def test_a_cut_answer_is_retried_asking_only_for_the_rest(
    proxy: S3Proxy, bucket: str, reset: bool, receiver: str
) -> None:
    d = threaded(proxy, bucket)
    proxy.reset_log()
    proxy.inject(Fault(method="GET", key_contains="obj.bin", cut_after=2**20 + 5, reset=reset))
    assert d.read_block("obj.bin", 100, len(DATA)) == DATA[100:]
    assert d.counters.retries == 1
    asked = [rng for m, _, rng in proxy.requests if m == "GET"]
    assert asked[0] == f"bytes=100-{len(DATA) - 1}" and len(asked) == 2
    start = int(asked[1].split("=")[1].split("-")[0])
    assert asked[1].endswith(f"-{len(DATA) - 1}") and 100 <= start <= 100 + 2**20 + 5
    if not reset:  # every byte sent before the end was received: the rest starts there
        assert start == 100 + 2**20 + 5
    elif receiver == "botocore":  # a reset discards what the socket held unread: the rest
        assert (start - 100) % 2**20 == 0  # starts after the last block botocore read whole


def test_a_missing_object_is_not_found(proxy: S3Proxy, bucket: str) -> None:
    d = threaded(proxy, bucket)
    with pytest.raises(NotFoundError, match=r"root/nope.bin: no such object"):
        d.read_block("nope.bin", 0, 1)


def test_throttling_is_retried_and_a_refusal_names_the_credentials(
    proxy: S3Proxy, bucket: str
) -> None:
    d = threaded(proxy, bucket)
    proxy.inject(Fault(method="GET", key_contains="obj.bin", status=503, code="SlowDown", times=2))
    assert d.read_block("obj.bin", 7, 70) == DATA[7:77]
    assert d.counters.retries == 2
    proxy.inject(Fault(method="GET", key_contains="obj.bin", status=403, code="AccessDenied"))
    with pytest.raises(StorageError, match=r"obj.bin: access denied .*check the credentials"):
        d.read_block("obj.bin", 0, 10)
    assert d.counters.retries == 2


def test_a_stall_costs_the_policy_deadline_not_the_read_timeout(
    proxy: S3Proxy, bucket: str
) -> None:
    d = threaded(proxy, bucket)  # botocore's read timeout: 60 s
    d.retry = RetryPolicy(attempts=6, deadline_s=1.0)
    proxy.inject(Fault(method="GET", delay_s=30.0, times=-1))
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"obj.bin: gave up after 1 tries .*timed out"):
        d.read_block("obj.bin", 0, 100)
    assert time.monotonic() - started < 3.5


@pytest.mark.hostile
def test_an_answer_longer_than_the_range_is_refused(proxy: S3Proxy, bucket: str) -> None:
    d = threaded(proxy, bucket)
    proxy.inject(Fault(method="GET", key_contains="obj.bin", pad=2 * 2**20))
    with pytest.raises(StorageError, match=r"obj.bin: answered more than bytes 0-99"):
        d.read_block("obj.bin", 0, 100)
    assert d.read_block("obj.bin", 0, 100) == DATA[:100]


def _child_reads(d: FsspecDriver, inherited: Any, answer: Any) -> None:
    data = d.read_block("obj.bin", 10, 20)
    ranges = d._threaded()
    assert ranges is not None
    answer.put((data == DATA[10:30], ranges._clients[0] is not inherited, ranges._pid))


def test_a_forked_child_makes_its_own_client(proxy: S3Proxy, bucket: str) -> None:
    d = threaded(proxy, bucket)
    assert d.read_block("obj.bin", 0, 10) == DATA[:10]
    ranges = d._threaded()
    assert ranges is not None
    inherited = ranges._clients[0]
    fork = multiprocessing.get_context("fork")
    answer = fork.Queue()
    child = fork.Process(target=_child_reads, args=(d, inherited, answer))
    child.start()
    right, own, pid = answer.get(timeout=30)
    child.join(timeout=30)
    assert right and own and pid == child.pid != os.getpid()
    assert ranges._clients[0] is inherited  # the parent's own, still in use here
    assert d.read_block("obj.bin", 0, 10) == DATA[:10]
    d.close()


def _child_opens_a_driver(endpoint: str, bucket: str, parent: Any, answer: Any) -> None:
    import botocore.loaders

    from tierfeed.storage import fsspec_connection

    parsed: list[str] = []
    load = botocore.loaders.JSONFileLoader.load_file

    def counted(self: Any, file_path: str, *args: Any, **kwargs: Any) -> Any:
        parsed.append(file_path)
        return load(self, file_path, *args, **kwargs)

    botocore.loaders.JSONFileLoader.load_file = counted  # type: ignore[method-assign]
    d = root_driver(endpoint, bucket)  # as a DataLoader worker opens its store
    right = d.read_range("obj.bin", 7, 9) == DATA[7:16]
    right = right and d.read_block("obj.bin", 0, 5) == DATA[:5]
    d.close()
    answer.put((right, parsed, fsspec_connection._session() is not parent))


def test_a_forked_childs_clients_parse_no_service_model_again(proxy: S3Proxy, bucket: str) -> None:
    # A DataLoader worker makes its own session (its credentials' lock is its own), with the
    # models its parent parsed: ~66 ms of CPU a worker otherwise, at every start.
    from tierfeed.storage import fsspec_connection

    d = root_driver(proxy.url, bucket)
    assert d.read_range("obj.bin", 0, 10) == DATA[:10] == d.read_block("obj.bin", 0, 10)
    parent = fsspec_connection._session()
    fork = multiprocessing.get_context("fork")
    answer = fork.Queue()
    child = fork.Process(target=_child_opens_a_driver, args=(proxy.url, bucket, parent, answer))
    child.start()
    right, parsed, own_session = answer.get(timeout=30)
    child.join(timeout=30)
    assert right and own_session
    assert parsed == []  # no JSON model read again in the child
    d.close()


def test_the_environment_sets_the_endpoint_as_for_the_event_loop(
    proxy: S3Proxy, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env(proxy.url).items():
        monkeypatch.setenv(name, value)
    d = FsspecDriver(f"s3://{bucket}/root", True)
    assert d.read_block("obj.bin", 3, 30) == DATA[3:33]
    assert isinstance(d._threaded(), S3Ranges)
    assert proxy.count("GET", "obj.bin", ranged=True) == 1
    d.close()


def test_a_session_of_the_callers_own_is_read_through_by_the_event_loop(
    proxy: S3Proxy, bucket: str
) -> None:
    from aiobotocore.session import AioSession

    options = s3_options(proxy.url)
    d = FsspecDriver(f"s3://{bucket}/root", True, session=AioSession(), **options)
    assert d.read_block("obj.bin", 3, 30) == DATA[3:33]
    assert d._threaded() is None
    d.close()


def test_copies_announced_ahead_have_their_client_made_in_the_background(
    proxy: S3Proxy, bucket: str
) -> None:
    d = threaded(proxy, bucket)
    d.open_ahead(["obj.bin"])  # sample reads only: no client
    assert d._ranges is False
    d.open_ahead(["obj.bin"], blocks=True)
    ranges = d._threaded()
    assert ranges is not None and ranges._ahead.name == "tierfeed-s3"
    ranges._ahead.join(timeout=30)
    made = ranges._clients[0]
    assert d.read_block("obj.bin", 0, 10) == DATA[:10] and ranges._clients[0] is made
    d.close()
    assert not ranges._ahead.is_alive()


def _child_reads_alone(d: FsspecDriver, answer: Any) -> None:
    answer.put(d.read_block("obj.bin", 10, 20) == DATA[10:30])


def test_a_fork_while_a_client_is_made_leaves_the_child_a_free_lock(
    proxy: S3Proxy, bucket: str
) -> None:
    """A thread of the parent making a client (`ahead`) holds the lock at the fork: the
    child, which has no such thread, must not wait for it."""
    d = threaded(proxy, bucket)
    ranges = d._threaded()
    assert ranges is not None
    fork = multiprocessing.get_context("fork")
    answer = fork.Queue()
    with ranges._lock:  # as the thread making a client holds it
        child = fork.Process(target=_child_reads_alone, args=(d, answer))
        child.start()
    try:
        assert answer.get(timeout=20) is True
        child.join(timeout=30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
        d.close()
