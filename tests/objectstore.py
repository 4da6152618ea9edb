"""Object stores for tests (moto's S3, the GCS emulator, Azurite, files served over http, all
on loopback), and the helpers that talk to them."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import fsspec

from tierfeed.storage.fsspec_driver import FsspecDriver

__all__ = [
    "SCHEMES", "Remote", "azure_connection", "client", "env", "free_port", "make_remote",
    "object_behind_proxy", "root_driver", "s3_options", "upload",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_options(endpoint: str, **config: Any) -> dict[str, Any]:
    """storage_options for an fsspec S3 file system on ``endpoint`` (``config``: botocore
    Config settings, e.g. ``read_timeout``)."""
    options: dict[str, Any] = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    if config:
        options["config_kwargs"] = config
    return options


def env(endpoint: str) -> dict[str, str]:
    """Environment variables that point the AWS SDKs (and so the CLI) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def client(endpoint: str) -> Any:
    """A boto3 S3 client on ``endpoint`` (the tests' own hands, not tierfeed's)."""
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


@contextlib.contextmanager
def object_behind_proxy(endpoint: str, bucket: str, data: bytes) -> Iterator[Any]:
    """``data`` put at ``s3://bucket/root/obj.bin`` (straight to ``endpoint``), and a fresh
    counting, fault-injecting `tests.s3proxy.S3Proxy` in front of ``endpoint``."""
    from tests.s3proxy import S3Proxy

    client(endpoint).put_object(Bucket=bucket, Key="root/obj.bin", Body=data)
    with S3Proxy(endpoint) as running:
        yield running


def root_driver(endpoint: str, bucket: str, **config: Any) -> FsspecDriver:
    """A read-only driver on ``s3://bucket/root`` through ``endpoint`` (``config``: botocore
    Config settings, as `s3_options`)."""
    return FsspecDriver(f"s3://{bucket}/root", True, **s3_options(endpoint, **config))


def upload(endpoint: str, directory: Path, bucket: str, prefix: str) -> str:
    """Put every file under ``directory`` at ``s3://bucket/prefix/...``; returns that URL."""
    s3 = client(endpoint)
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(directory).as_posix()}"
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}"


# --- every kind of store, behind a counting, fault-injecting proxy ---------------------------

AZURITE_ACCOUNT = "devstoreaccount1"  # Azurite's well-known development account and key
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
SCHEMES = ("s3", "gs", "az", "http")


def azure_connection(endpoint: str) -> str:
    """An Azure connection string for Azurite's blob service at ``endpoint``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


@dataclass
class Remote:
    """A bucket of one kind of store (s3, gs, az, or an http server of files), reached
    through ``proxy`` (which counts requests and injects faults): what a test needs to put a
    store there and point tierfeed (the library, or the CLI by environment) at it."""

    scheme: str
    bucket: str
    proxy: Any  # tests.s3proxy.S3Proxy
    options: dict[str, Any]  # storage_options
    env: dict[str, str]  # the same, as the CLI takes it
    served: Path | None = None  # http: the directory the proxy serves the bucket from

    def url(self, prefix: str) -> str:
        if self.scheme == "http":
            return f"{self.proxy.url}/{self.bucket}/{prefix}"
        return f"{self.scheme}://{self.bucket}/{prefix}"

    def put_tree(self, directory: Path, prefix: str) -> str:
        """Put every file under ``directory`` at ``prefix`` (the test's own hands, not
        tierfeed's); returns the URL."""
        if self.served is not None:
            shutil.copytree(directory, self.served / prefix, dirs_exist_ok=True)
        else:
            fs = fsspec.filesystem(self.scheme, **self.options)
            for path in sorted(directory.rglob("*")):
                if path.is_file():
                    rel = path.relative_to(directory).as_posix()
                    fs.pipe_file(f"{self.bucket}/{prefix}/{rel}", path.read_bytes())
        return self.url(prefix)

    def data_gets(self, contains: str) -> list[str]:
        """The GETs of object bytes through the proxy whose path contains ``contains`` (not
        listings, nor GCS's GETs of an object's metadata)."""
        return [
            target for method, target, _ in list(self.proxy.requests)
            if method == "GET" and contains in unquote(target)
            and "list" not in urlsplit(target).query
            and (self.scheme != "gs" or "alt=media" in target)
        ]  # fmt: skip

    def data_ranges(self, contains: str) -> set[tuple[str, str]]:
        """The distinct (path, Range) of `data_gets`: a late GET hedged by a second of the
        same range counts once."""
        return {
            (target, rng) for method, target, rng in list(self.proxy.requests)
            if method == "GET" and target in set(self.data_gets(contains))
        }  # fmt: skip

    def rewrite(self, prefix: str, name: str, data: bytes) -> None:
        """Replace one object with other bytes (a store rewritten under a running job)."""
        if self.served is not None:
            target = self.served / prefix / name
            target.write_bytes(data)
            os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new ETag
        else:
            fsspec.filesystem(self.scheme, **self.options).pipe_file(
                f"{self.bucket}/{prefix}/{name}", data
            )


def make_remote(
    scheme: str, bucket: str, proxy_factory: Callable[..., Any], endpoints: dict[str, str],
    served: Path,
) -> Remote:  # fmt: skip
    """A new, empty bucket of ``scheme`` behind a new proxy (``proxy_factory(upstream,
    serve=...)``) in front of the emulator at ``endpoints[scheme]``."""
    if scheme == "http":
        (served / bucket).mkdir(parents=True)
        proxy = proxy_factory("http://127.0.0.1:9", serve={bucket: served / bucket})
        return Remote(scheme, bucket, proxy, {}, {}, served / bucket)
    proxy = proxy_factory(endpoints[scheme])
    if scheme == "s3":
        options, env_vars = s3_options(proxy.url), env(proxy.url)
        client(endpoints[scheme]).create_bucket(Bucket=bucket)
    elif scheme == "gs":
        options = {"endpoint_url": proxy.url, "token": "anon", "project": "test"}
        env_vars = {"STORAGE_EMULATOR_HOST": proxy.url}
        fsspec.filesystem("gs", skip_instance_cache=True, **options).mkdir(bucket)
    else:
        options = {"connection_string": azure_connection(proxy.url)}
        env_vars = {"AZURE_STORAGE_CONNECTION_STRING": options["connection_string"]}
        fsspec.filesystem("az", skip_instance_cache=True, **options).mkdir(bucket)
    return Remote(scheme, bucket, proxy, {**options, "skip_instance_cache": True}, env_vars)
