"""An fsspec file system's connection: the store's kind, the options it opens with, its closing,
and the ranged GETs made on its event loop where fsspec's own cannot pin a version."""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, cast

from tierfeed.errors import StorageError
from tierfeed.storage.s3ranges import mark_default_session

if TYPE_CHECKING:
    from tierfeed.storage.s3ranges import Received

__all__ = [
    "POOL_CONNECTIONS",
    "az_range",
    "connection_closer",
    "open_options",
    "s3_range",
    "store_kind",
]

_BLOCK = 1 << 20  # bytes per read of a response body: what arrived before a cut is kept


def connection_closer(fs: Any) -> Callable[[], Any] | None:
    """The coroutine function that closes ``fs``'s connections (S3's client, an HTTP or GCS
    session, Azure's service client), or None if it holds none."""
    creator = getattr(fs, "_s3creator", None)
    if creator is not None:
        return lambda: creator.__aexit__(None, None, None)
    session = getattr(fs, "_session", None)
    if session is not None and hasattr(session, "close"):
        return cast("Callable[[], Any]", session.close)
    client = getattr(fs, "service_client", None)
    if client is not None and hasattr(client, "close"):
        return cast("Callable[[], Any]", client.close)
    return None


def store_kind(url: str) -> str:
    """The store's kind: s3, gs, az, http, or the URL's own scheme."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    kinds = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "https": "http"}
    return kinds.get(scheme, scheme)


# Connections one client may hold open at once. botocore's default is 10, and it queues a
# request past that silently: a copy's ranged GETs then never had more than 10 in flight,
# whatever the fetch tuner chose (bench/s3_trace.py). Room for the most requests in flight the
# tuner may choose (`FsspecDriver.parallel_requests`, or the fetch threads if more), the sample
# reads beside them; hedges go through a client of their own. An idle pool holds nothing.
POOL_CONNECTIONS = 128

_sessions: dict[int, Any] = {}  # pid -> this process's aiobotocore session
_loaders: list[Any] = []  # the service models' loader of the first session, inherited by forks


def _session() -> Any:
    """One aiobotocore session per process: a client made from it again skips parsing the S3
    service model (a noticeable CPU cost per client otherwise). Not shared across a fork: a
    session's refreshable credentials hold a lock of its event loop. Its models' loader is:
    a forked DataLoader worker's session takes the one its parent parsed with (the worker's
    copy of it), instead of parsing the models again at every worker's start (several times
    the CPU of a start with the parent's: `bench/s3_client_start.py`; docs/BENCHMARKS.md,
    "The CPU a cold epoch needs, against the row's")."""
    from aiobotocore.session import AioSession

    pid = os.getpid()
    if pid not in _sessions:
        _sessions.clear()
        session = AioSession()
        if _loaders:  # parsed models only: nothing of the parent's connections or credentials
            session.register_component("data_loader", _loaders[0])
        else:
            _loaders.append(session.get_component("data_loader"))
        _sessions[pid] = session
        mark_default_session(session)
    return _sessions[pid]


def open_options(scheme: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Options with this driver's defaults where the caller set none: a file system instance
    of its own (fsspec's are shared by default; this driver closes its own at `close`), and
    bounded connect and read timeouts."""
    out = dict(options)
    out.setdefault("skip_instance_cache", True)
    if scheme == "s3":
        return _s3_options(out)
    if scheme == "http":
        import aiohttp

        client = dict(out.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(sock_connect=10, sock_read=60))
        out["client_kwargs"] = client
    elif scheme == "gs":
        out.setdefault("requests_timeout", 60)
    elif scheme == "az":
        out.setdefault("connection_timeout", 10)
        out.setdefault("read_timeout", 60)
    return out


def _s3_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """S3 options with this driver's defaults where the caller set none: the process's one
    session, one try per request in botocore (retries are counted here), bounded timeouts, and
    a connection pool with room for the requests the fetch keeps in flight."""
    out = dict(options)
    if "profile" not in out:  # a profile makes its own session
        out.setdefault("session", _session())
    config = dict(out.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})  # one try
    config.setdefault("connect_timeout", 10)
    config.setdefault("read_timeout", 60)
    config.setdefault("max_pool_connections", POOL_CONNECTIONS)
    out["config_kwargs"] = config
    return out


def s3_range(
    fs: Any, full: str, start: int, end: int, etag: str | None, got: Received
) -> Callable[[], Coroutine[Any, Any, None]]:
    """One ranged GET on ``fs``'s event loop (its coroutine function), on the pinned ETag (S3
    answers 412 if the object changed), its bytes kept in ``got`` as they arrive."""

    async def get() -> None:
        bucket, key, version = fs.split_path(full)
        extra = {"IfMatch": etag} if etag else {}
        if version:
            extra["VersionId"] = version
        response = await fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
        )
        body = response["Body"]
        limit = len(got) + end - start  # a server ignoring the range is not read on
        try:
            while block := await body.read(_BLOCK):
                got.extend(block)
                if len(got) > limit:
                    raise StorageError(f"{full}: answered more than bytes {start}-{end - 1}")
        finally:
            body.close()

    return get


def az_range(
    fs: Any, full: str, start: int, end: int, etag: str, got: Received
) -> Callable[[], Coroutine[Any, Any, None]]:
    """One ranged GET of a blob on ``fs``'s event loop (its coroutine function), on the pinned
    ETag (adlfs's ``cat_file`` cannot ask it)."""
    from azure.core import MatchConditions

    async def get() -> None:
        container, blob, _ = fs.split_path(full)
        async with fs.service_client.get_blob_client(container=container, blob=blob) as bc:
            stream = await bc.download_blob(
                offset=start,
                length=end - start,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
                retry_total=0,  # tried again here, counted
            )
            limit = len(got) + end - start  # a server ignoring the range is not read on
            async for block in stream.chunks():
                got.extend(block)
                if len(got) > limit:
                    raise StorageError(f"{full}: answered more than bytes {start}-{end - 1}")

    return get
