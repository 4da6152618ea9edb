"""The pieces of a copy from S3 received by obstore (`tierfeed.storage.nativeranges`), the
client a driver uses where the file system's settings carry over: the promises botocore's
client keeps (tests/storage/test_s3ranges.py, run here again against obstore's), and what is
obstore's own: a process forked after its parent's first request reads through botocore
instead of waiting forever, and settings that cannot be carried over keep botocore."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.objectstore import client, root_driver
from tests.storage.test_s3ranges import (  # noqa: F401 - collected here again, on obstore
    proxy,
    test_a_cut_answer_is_retried_asking_only_for_the_rest,
    test_a_missing_object_is_not_found,
    test_a_stall_costs_the_policy_deadline_not_the_read_timeout,
    test_an_answer_longer_than_the_range_is_refused,
    test_an_object_deleted_mid_job_is_the_changed_error,
    test_an_object_replaced_mid_job_is_an_error_naming_it,
    test_pieces_read_the_right_bytes_on_the_calling_thread,
    test_throttling_is_retried_and_a_refusal_names_the_credentials,
)
from tierfeed.storage.fsspec_driver import FsspecDriver
from tierfeed.storage.nativeranges import NativeRanges

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def receiver(monkeypatch: pytest.MonkeyPatch) -> str:
    """Whose client receives: obstore's, as asked."""
    monkeypatch.setenv("TIERFEED_S3_CLIENT", "obstore")
    return "obstore"


DATA = test_pieces_read_the_right_bytes_on_the_calling_thread.__globals__["DATA"]


def _driver(proxy: Any, bucket: str) -> FsspecDriver:  # noqa: F811
    """A driver whose reads cannot be made on the event loop (an S3 GET there fails)."""
    d = root_driver(proxy.url, bucket)
    on_loop = d.fs._call_s3

    async def no_loop(method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "get_object":
            raise AssertionError("a read was made on the event loop")
        return await on_loop(method, *args, **kwargs)

    d.fs._call_s3 = no_loop
    return d


def test_ranges_and_pieces_are_received_by_obstore(proxy: Any, bucket: str) -> None:  # noqa: F811
    d = _driver(proxy, bucket)
    assert isinstance(d._threaded(), NativeRanges)
    assert d.read_range("obj.bin", 11, 2**20) == DATA[11 : 11 + 2**20]
    assert d.read_block("obj.bin", 0, len(DATA)) == DATA
    assert proxy.count("GET", "obj.bin", ranged=True) == 2
    d.close()


def fork_case(endpoint: str, bucket: str, parent_reads_first: bool) -> None:
    """In a fresh process: read (or not), fork a child that opens its own driver (as a
    DataLoader worker opens its store) and reads; print what the child read through."""
    d = root_driver(endpoint, bucket)
    whole = client(endpoint).get_object(Bucket=bucket, Key="root/obj.bin")["Body"].read()
    if parent_reads_first:
        assert d.read_block("obj.bin", 0, 10) == whole[:10]
    fork = multiprocessing.get_context("fork")
    answer = fork.Queue()
    child = fork.Process(target=_child, args=(endpoint, bucket, whole, answer))
    child.start()
    right, kind = answer.get(timeout=30)
    child.join(timeout=30)
    assert right and child.exitcode == 0, child.exitcode
    assert d.read_block("obj.bin", 0, 10) == whole[:10]  # the parent's own, still in use
    d.close()
    print(kind)


def _child(endpoint: str, bucket: str, whole: bytes, answer: Any) -> None:
    d = root_driver(endpoint, bucket)
    right = d.read_block("obj.bin", 10, 2**20) == whole[10 : 10 + 2**20]
    answer.put((right, type(d._threaded()).__name__))
    d.close()


@pytest.mark.parametrize("parent_reads_first", [True, False], ids=["after-a-read", "before-any"])
def test_a_forked_child_reads_through_a_client_it_can_use(
    proxy: Any,  # noqa: F811
    bucket: str,
    parent_reads_first: bool,
) -> None:
    """obstore's threads are not in a forked child: a child of a process that made a request
    through obstore reads through botocore (it would wait forever on obstore's); a child forked
    before any request uses obstore. In a fresh process each (this one has made requests)."""
    code = (
        "from tests.storage.test_nativeranges import fork_case; "
        f"fork_case({proxy.url!r}, {bucket!r}, {parent_reads_first})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == ("S3Ranges" if parent_reads_first else "NativeRanges")


def _fs(**options: Any) -> Any:
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


@pytest.mark.parametrize(
    "options",
    [
        {"client_kwargs": {"verify": "/etc/ssl/certs/my-ca.pem"}},  # a CA bundle
        {"config_kwargs": {"proxies": {"https": "http://proxy:3128"}}},  # botocore's own
        {"client_kwargs": {"config": object()}},  # an option only botocore knows
        {"version_aware": True},
    ],
    ids=["ca-bundle", "proxies", "client-option", "version-aware"],
)
def test_settings_obstore_cannot_take_keep_botocore(options: dict[str, Any]) -> None:
    assert NativeRanges.of(_fs(key="k", secret="s", **options)) is None


def test_asking_for_botocore_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NativeRanges.of(_fs(key="k", secret="s")) is not None
    monkeypatch.delenv("TIERFEED_S3_CLIENT")  # the default: botocore
    assert NativeRanges.of(_fs(key="k", secret="s")) is None


def test_settings_carried_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    anon = NativeRanges.of(_fs(anon=True, config_kwargs={"s3": {"addressing_style": "virtual"}}))
    assert anon is not None
    config, options = anon._settings.config, anon._settings.client_options
    assert config["skip_signature"] and config["virtual_hosted_style_request"]
    assert config["endpoint"] == "http://127.0.0.1:9" and options["allow_http"]
    assert config["region"] == "eu-west-3" and anon._settings.session is None
    client = {"verify": False, "region_name": "us-west-2"}
    given = NativeRanges.of(_fs(key="k", secret="s", token="t", client_kwargs=client))
    assert given is not None and given._settings.config["token"] == "t"
    assert given._settings.client_options["allow_invalid_certificates"]
    assert given._settings.config["region"] == "us-west-2"
    profiled = NativeRanges.of(_fs(profile="research"))  # credentials: botocore's session
    assert profiled is not None and profiled._settings.session == {"profile": "research"}
    assert "access_key_id" not in profiled._settings.config


def test_a_pieces_buffers_come_as_obstore_handed_them_over(proxy: Any, bucket: str) -> None:  # noqa: F811
    d = _driver(proxy, bucket)
    parts = d.read_parts("obj.bin", 5, len(DATA) - 5)
    assert b"".join(parts) == DATA[5:] and all(len(part) for part in parts)
    assert len(parts) > 1  # as they came, not joined into one copy
    d.close()
