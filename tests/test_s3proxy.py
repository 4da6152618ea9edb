"""The fault-injecting S3 proxy (tests/s3proxy.py) in front of moto's S3 server."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError, ReadTimeoutError  # noqa: E402

from tests.s3proxy import Fault, S3Proxy  # noqa: E402


def _client(endpoint: str, config: Config | None = None) -> Any:
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", config=config,
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


@pytest.fixture
def upstream(s3_endpoint: str) -> str:
    """moto's S3 server (tests/conftest.py), which the proxy stands in front of."""
    return s3_endpoint


@pytest.fixture
def proxy(upstream: str) -> Iterator[S3Proxy]:
    with S3Proxy(upstream) as p:
        yield p


def _code(err: ClientError) -> str:
    return str(err.response["Error"]["Code"])


def test_forwards_put_get_range_head(proxy: S3Proxy, bucket: str) -> None:
    s3 = _client(proxy.url)
    data = bytes(range(256)) * 40
    s3.put_object(Bucket=bucket, Key="dir/obj.bin", Body=data)
    assert s3.get_object(Bucket=bucket, Key="dir/obj.bin")["Body"].read() == data
    part = s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=10-19")
    assert part["Body"].read() == data[10:20]
    assert part["ContentRange"] == f"bytes 10-19/{len(data)}"
    head = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert head["ContentLength"] == len(data)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/obj.bin"]
    s3.delete_object(Bucket=bucket, Key="dir/obj.bin")

    assert proxy.count(method="PUT", key_contains="obj.bin") == 1
    assert proxy.count(method="GET", key_contains="obj.bin") == 2
    assert proxy.count(method="GET", ranged=True) == 1
    assert proxy.count(method="GET", key_contains="obj.bin", ranged=False) == 1
    assert proxy.count(method="HEAD") == 1
    assert proxy.count(method="DELETE") == 1
    assert ("GET", f"/{bucket}/dir/obj.bin", "bytes=10-19") in proxy.requests
    proxy.reset_log()
    assert proxy.count() == 0 and proxy.requests == []


def test_slowdown_fault_consumed_after_times(proxy: S3Proxy, bucket: str) -> None:
    # botocore's retries["max_attempts"] counts retries, not attempts: 1 would retry once.
    s3 = _client(proxy.url, Config(retries={"total_max_attempts": 1, "mode": "standard"}))
    s3.put_object(Bucket=bucket, Key="k", Body=b"payload")
    proxy.inject(Fault(method="GET", status=503, code="SlowDown", times=2))
    for _ in range(2):
        with pytest.raises(ClientError) as info:
            s3.get_object(Bucket=bucket, Key="k")
        assert _code(info.value) == "SlowDown"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"payload"
    assert proxy.count(method="GET") == 3


def test_fault_matches_only_its_key(proxy: S3Proxy, bucket: str) -> None:
    s3 = _client(proxy.url, Config(retries={"total_max_attempts": 1}))
    s3.put_object(Bucket=bucket, Key="public", Body=b"open")
    s3.put_object(Bucket=bucket, Key="secret", Body=b"closed")
    proxy.inject(Fault(key_contains="secret", status=403, code="AccessDenied", times=-1))
    for _ in range(2):
        with pytest.raises(ClientError) as info:
            s3.get_object(Bucket=bucket, Key="secret")
        assert _code(info.value) == "AccessDenied"
    with pytest.raises(ClientError) as info:  # HEAD: status only, no body
        s3.head_object(Bucket=bucket, Key="secret")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert s3.get_object(Bucket=bucket, Key="public")["Body"].read() == b"open"
    proxy.clear()
    assert s3.get_object(Bucket=bucket, Key="secret")["Body"].read() == b"closed"


def test_stall_times_out_and_stop_is_quick(upstream: str, bucket: str) -> None:
    proxy = S3Proxy(upstream).start()
    try:
        _client(proxy.url).put_object(Bucket=bucket, Key="k", Body=b"x")
        proxy.inject(Fault(method="GET", delay_s=3.0))
        config = Config(read_timeout=0.5, connect_timeout=0.5, retries={"total_max_attempts": 1})
        start = time.monotonic()
        with pytest.raises(ReadTimeoutError):
            _client(proxy.url, config).get_object(Bucket=bucket, Key="k")
        assert time.monotonic() - start < 2.0

        proxy.inject(Fault(method="GET", delay_s=30.0))  # a client still waiting when stop() runs
        outcome: list[object] = []
        patient = _client(proxy.url, Config(read_timeout=20, retries={"total_max_attempts": 1}))

        def get() -> None:
            try:
                outcome.append(patient.get_object(Bucket=bucket, Key="k"))
            except Exception as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=get, daemon=True)
        waiter.start()
        time.sleep(0.3)
    finally:
        start = time.monotonic()
        proxy.stop()
        assert time.monotonic() - start < 3.0
    waiter.join(timeout=5.0)
    assert len(outcome) == 1 and isinstance(outcome[0], Exception)  # dropped, not answered
    proxy.stop()  # idempotent


def test_chunked_and_aws_chunked_request_bodies(proxy: S3Proxy, bucket: str) -> None:
    host, port = proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    parts = [b"hello ", b"chunked ", b"world"]
    conn.request("PUT", f"/{bucket}/te", body=iter(parts), encode_chunked=True)
    assert conn.getresponse().read() == b""
    payload = b"hello aws-chunked"  # S3 streaming framing inside HTTP chunking: passed through
    framed = b"%x\r\n%s\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n" % (len(payload), payload)
    headers = {
        "Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(payload)),
        "X-Amz-Content-SHA256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "x-amz-trailer": "x-amz-checksum-crc32", "Transfer-Encoding": "chunked",
    }  # fmt: skip
    body = iter([framed[:7], framed[7:]])
    conn.request("PUT", f"/{bucket}/aws", body=body, headers=headers, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 200, response.read()
    response.read()
    conn.close()
    s3 = _client(proxy.url)
    assert s3.get_object(Bucket=bucket, Key="te")["Body"].read() == b"".join(parts)
    assert s3.get_object(Bucket=bucket, Key="aws")["Body"].read() == payload


def test_latency_and_delay_then_forward(upstream: str, bucket: str) -> None:
    with S3Proxy(upstream, latency_s=0.1) as proxy:
        s3 = _client(proxy.url)
        start = time.monotonic()
        s3.put_object(Bucket=bucket, Key="k", Body=b"abc")
        assert time.monotonic() - start >= 0.1
        proxy.inject(Fault(method="GET", delay_s=0.3))
        start = time.monotonic()
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"abc"
        assert time.monotonic() - start >= 0.4


def test_bandwidth_paces_body(upstream: str, bucket: str) -> None:
    data = os.urandom(1 << 20)
    _client(upstream).put_object(Bucket=bucket, Key="big", Body=data)
    with S3Proxy(upstream, bandwidth_bps=4 * (1 << 20)) as proxy:
        s3 = _client(proxy.url)
        start = time.monotonic()
        assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == data
        assert time.monotonic() - start >= 0.2


def test_s3fs_through_proxy(proxy: S3Proxy, bucket: str) -> None:
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", skip_instance_cache=True,
        client_kwargs={"endpoint_url": proxy.url, "region_name": "us-east-1"},
    )  # fmt: skip
    small = os.urandom(100)
    fs.pipe_file(f"{bucket}/small", small)
    assert fs.cat_file(f"{bucket}/small", start=5, end=15) == small[5:15]
    assert proxy.count(method="GET", key_contains="small", ranged=True) >= 1

    big = os.urandom(6 << 20)
    fs.pipe_file(f"{bucket}/big", big)
    assert fs.cat_file(f"{bucket}/big") == big
    with fs.open(f"{bucket}/multi", "wb", block_size=5 << 20) as f:  # two parts: 5 MiB + 1 MiB
        f.write(big[: 5 << 20])
        f.write(big[5 << 20 :])
    assert proxy.count(method="POST", key_contains="multi") >= 2  # create + complete
    assert proxy.count(method="PUT", key_contains="multi") == 2
    assert fs.cat_file(f"{bucket}/multi") == big
    assert fs.info(f"{bucket}/multi")["size"] == len(big)


def test_counters_over_http(proxy: S3Proxy, bucket: str) -> None:
    s3 = _client(proxy.url)
    s3.put_object(Bucket=bucket, Key="c.bin", Body=b"x" * 1000)
    s3.get_object(Bucket=bucket, Key="c.bin", Range="bytes=0-99")["Body"].read()
    s3.head_object(Bucket=bucket, Key="c.bin")
    conn = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=5)
    conn.request("GET", "/__proxy__/counters")
    counters = json.loads(conn.getresponse().read())
    conn.close()
    assert counters == {"requests": 3, "gets": 1, "heads": 1, "puts": 1, "bytes_out": 100}


def test_serves_objects_from_files_with_ranges_etags_and_if_match(
    upstream: str, bucket: str, tmp_path: Any
) -> None:
    data = os.urandom(100_000)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "obj.bin").write_bytes(data)
    with S3Proxy(upstream, serve={bucket: tmp_path}) as proxy:
        s3 = _client(proxy.url, Config(retries={"total_max_attempts": 1}))
        head = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
        assert head["ContentLength"] == len(data)
        part = s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=10-19")
        assert part["Body"].read() == data[10:20] and part["ETag"] == head["ETag"]
        tail = s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=-5")
        assert tail["Body"].read() == data[-5:]
        same = s3.get_object(Bucket=bucket, Key="dir/obj.bin", IfMatch=head["ETag"])
        assert same["Body"].read() == data
        with pytest.raises(ClientError) as err:
            s3.get_object(Bucket=bucket, Key="dir/obj.bin", IfMatch='"other"')
        assert _code(err.value) == "PreconditionFailed"
        with pytest.raises(ClientError):  # not a file there: forwarded, and moto has none
            s3.head_object(Bucket=bucket, Key="dir/missing.bin")
        assert proxy.counters()["bytes_out"] == 10 + 5 + len(data)


@pytest.mark.parametrize("keep_alive", [True, False])
def test_keep_alive_or_one_request_per_connection(upstream: str, keep_alive: bool) -> None:
    with S3Proxy(upstream, keep_alive=keep_alive) as proxy:
        conn = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=5)
        conn.request("GET", "/__proxy__/counters")
        answer = conn.getresponse()
        assert json.loads(answer.read())["requests"] == 0
        assert answer.will_close is not keep_alive
        assert (answer.getheader("Connection") == "close") is not keep_alive
        conn.close()


def _raw_get(proxy: S3Proxy, target: str, range_: str = "") -> tuple[int, int, bytes, str]:
    """A GET on a raw connection: status, Content-Length, the body bytes that arrived, and
    how the body ended ("whole", "short" or "reset")."""
    conn = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=5)
    conn.request("GET", target, headers={"Range": range_} if range_ else {})
    answer = conn.getresponse()
    length = int(answer.getheader("Content-Length") or -1)
    got, ended = b"", "whole"
    try:
        while block := answer.read1(4096):
            got += block
    except ConnectionResetError:
        ended = "reset"
    finally:
        conn.close()
    if ended == "whole" and len(got) < length:
        ended = "short"
    return answer.status, length, got, ended


@pytest.mark.parametrize("reset", [False, True])
def test_cut_body_short_or_reset_then_whole(proxy: S3Proxy, bucket: str, reset: bool) -> None:
    data = os.urandom(300_000)
    s3 = _client(proxy.url)
    s3.put_object(Bucket=bucket, Key="cut.bin", Body=data)
    proxy.inject(Fault(method="GET", key_contains="cut.bin", cut_after=1000, reset=reset))
    get = s3.get_object(Bucket=bucket, Key="cut.bin")  # forwarded from moto, then cut
    assert get["ContentLength"] == len(data)
    with pytest.raises(Exception) as info:  # urllib3: IncompleteRead / ProtocolError
        get["Body"].read()
    assert "IncompleteRead" in repr(info.value) or "reset" in repr(info.value).lower()
    got = s3.get_object(Bucket=bucket, Key="cut.bin", Range="bytes=1000-")["Body"].read()
    assert got == data[1000:]  # consumed: the next GET is whole


@pytest.mark.parametrize("reset", [False, True])
def test_cut_body_raw(upstream: str, bucket: str, tmp_path: Any, reset: bool) -> None:
    data = os.urandom(300_000)
    (tmp_path / "cut.bin").write_bytes(data)
    with S3Proxy(upstream, serve={bucket: tmp_path}) as proxy:
        proxy.inject(Fault(method="GET", key_contains="cut.bin", cut_after=1000, reset=reset))
        status, length, got, ended = _raw_get(proxy, f"/{bucket}/cut.bin")
        assert (status, length, got) == (200, len(data), data[:1000])
        assert ended == ("reset" if reset else "short")
        # Consumed: the next GET (a ranged one, for the bytes still missing) is whole.
        status, length, got, ended = _raw_get(proxy, f"/{bucket}/cut.bin", "bytes=1000-")
        assert (status, got, ended) == (206, data[1000:], "whole")


def test_cut_body_of_a_served_file(upstream: str, bucket: str, tmp_path: Any) -> None:
    data = os.urandom(50_000)
    (tmp_path / "f.bin").write_bytes(data)
    with S3Proxy(upstream, serve={bucket: tmp_path}) as proxy:
        proxy.inject(Fault(method="GET", cut_after=10, times=2))
        for _ in range(2):
            status, length, got, ended = _raw_get(proxy, f"/{bucket}/f.bin", "bytes=100-199")
            assert (status, length, got, ended) == (206, 100, data[100:110], "short")
        assert _raw_get(proxy, f"/{bucket}/f.bin", "bytes=100-199")[2:] == (data[100:200], "whole")
