"""An fsspec file system's connection: the store's kind, the options it opens with, its closing."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, cast

from tierfeed.storage.s3ranges import mark_default_session

__all__ = ["POOL_CONNECTIONS", "connection_closer", "open_options", "store_kind"]


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
    copy of it), instead of parsing the models again at every worker's start (~66 ms of CPU
    in a forked child, ~10 ms with the parent's: bench/s3_client_start.py)."""
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
