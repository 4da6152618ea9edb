"""The fsspec driver: any fsspec URL (s3://, gs://, az://, http(s)://, file://) as storage.

Reads are ranged requests (an S3 ranged GET). Library errors are translated here, once: a
missing bucket or object is `NotFoundError`, a refusal names the credentials to check, and
throttling (S3's 503 SlowDown), server errors and network timeouts are retried with backoff,
a bounded number of times, and counted (``counters.retries``). The first look at an object
pins its size and ETag for this process: an object replaced under a running job is an error
that says so, never a mix of old and new bytes (S3 reads ask ``If-Match`` the pinned ETag).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tierfeed.errors import ConfigError, NotFoundError, ReadOnlyError, StorageError
from tierfeed.format.relpath import relative_parts
from tierfeed.storage.driver import Driver

__all__ = ["FsspecDriver", "RetryPolicy", "error_code"]

T = TypeVar("T")

# S3 error codes and HTTP statuses worth another try: throttling, a server's own trouble.
_TRANSIENT = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
    "ServiceUnavailable", "InternalError", "RequestTimeout", "500", "502", "503", "504",
}  # fmt: skip
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "403"}
_CHANGED = {"PreconditionFailed", "412"}


def error_code(exc: BaseException) -> str:
    """The S3 error code (or HTTP status) behind ``exc``, following its causes; "" if none."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        response = getattr(seen, "response", None)
        if isinstance(response, Mapping):
            error = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode", "")
            return str(error.get("Code") or status)
        seen = seen.__cause__ or seen.__context__
    return ""


def _timed_out(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    return bool(names & {"TimeoutError", "ReadTimeoutError", "ConnectTimeoutError",
                         "FSTimeoutError", "ServerTimeoutError", "timeout"})  # fmt: skip


def _unreachable(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    return bool(names & {"EndpointConnectionError", "ClientConnectorError", "ConnectionError",
                         "ConnectionRefusedError", "ConnectionResetError"})  # fmt: skip


class RetryPolicy:
    """How often and how long a transient failure is tried again: exponential backoff with
    full jitter (AWS's advice), ``attempts`` tries in all.

    Args:
        attempts: tries in all, the first included.
        base_s: the first backoff's upper bound.
        cap_s: no backoff longer than this.
    """

    def __init__(self, attempts: int = 6, base_s: float = 0.05, cap_s: float = 4.0) -> None:
        self.attempts, self.base_s, self.cap_s = attempts, base_s, cap_s

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before try ``attempt + 1`` (attempt counts from 0)."""
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


class FsspecDriver(Driver):
    """Objects under an fsspec URL; library errors become tierfeed errors here.

    Credentials and endpoints are fsspec's and the cloud SDK's own: the environment
    (``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...), config files, or ``storage_options``.

    Args:
        url: e.g. ``s3://bucket/datasets/imagenet.tf``.
        read_only: refuse writes and deletes.
        retry: how transient failures are retried (see `RetryPolicy`).
        storage_options: passed to ``fsspec.url_to_fs`` (``key``, ``secret``,
            ``client_kwargs={"endpoint_url": ...}``, ...). For S3 this driver retries itself
            (the library's own retries are turned off so that each is counted), and a request
            times out after 10 s connecting or 60 s without data unless ``config_kwargs``
            says otherwise.
    """

    # Each GET of an object store is slow (tens of MB/s); its aggregate grows with parallel
    # ones. Measured on bench/s3_compare.py's slowed endpoint (20 ms, 25 MB/s per GET): a cold
    # epoch 1.8-2.0 s starting at 16 in flight, 2.6-2.8 s starting at 4.
    parallel_requests = 16
    costly_requests = True

    def __init__(
        self,
        url: str,
        read_only: bool = False,
        retry: RetryPolicy | None = None,
        **storage_options: Any,
    ) -> None:
        super().__init__(read_only)
        try:
            import fsspec
        except ImportError:
            raise ConfigError(
                "the fsspec driver needs fsspec (and s3fs for s3://): "
                "pip install 'tierfeed[fsspec]'"
            ) from None
        self.url = url.rstrip("/")
        self.name = f"fsspec:{self.url}"
        self.retry = retry or RetryPolicy()
        self._s3 = url.startswith(("s3://", "s3a://"))
        if self._s3:
            storage_options = _s3_defaults(storage_options)
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except ImportError as exc:
            raise ConfigError(f"{url}: {exc}; pip install 'tierfeed[fsspec]'") from None
        except Exception as exc:
            raise StorageError(f"{url}: cannot open ({type(exc).__name__}: {exc})") from None
        if self._s3:
            self.fs.retries = 1  # tried again here, counted
        self.root = root.rstrip("/")
        self._pins: dict[str, tuple[int, str | None]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _full(self, path: str) -> str:
        parts = relative_parts(
            path, lambda: StorageError(f"{self}: path {path!r} would leave the root")
        )
        return "/".join((self.root, *parts))

    def where(self, path: str) -> str:
        """The URL of object ``path``, for messages."""
        return f"{self.url}/{path}"

    def _fail(self, path: str, exc: BaseException) -> StorageError:
        where, code = self.where(path), error_code(exc)
        if isinstance(exc, FileNotFoundError) or code in ("NoSuchKey", "NoSuchBucket", "404"):
            what = (
                "no such bucket"
                if code == "NoSuchBucket" or self._no_bucket()
                else "no such object"
            )
            return NotFoundError(f"{where}: {what}")
        if isinstance(exc, PermissionError) or code in _DENIED:
            return StorageError(
                f"{where}: access denied ({code or exc}); check the credentials (environment, "
                "AWS_PROFILE, or storage_options) and that they may read this bucket"
            )
        return StorageError(f"{where}: {type(exc).__name__}: {exc}")

    def _no_bucket(self) -> bool:
        """Whether the bucket itself is missing (asked only once an object was not found)."""
        if not self._s3:
            return False
        bucket = self.root.split("/", 1)[0]
        try:
            return not self.fs.exists(bucket)
        except Exception:  # the question was only for a better message
            return False

    def _call(self, path: str, what: Callable[[], T]) -> T:
        """``what()``, tried again on throttling, server errors and timeouts (counted)."""
        started = time.monotonic()
        for attempt in range(self.retry.attempts):
            try:
                return what()
            except Exception as exc:  # library errors are translated at this boundary
                code = error_code(exc)
                if code in _CHANGED:
                    raise self._changed(path) from None
                transient = code in _TRANSIENT or _timed_out(exc) or _unreachable(exc)
                if not transient:
                    raise self._fail(path, exc) from None
                if attempt + 1 == self.retry.attempts:
                    took = time.monotonic() - started
                    kind = code or ("timed out" if _timed_out(exc) else "unreachable")
                    raise StorageError(
                        f"{self.where(path)}: gave up after {attempt + 1} tries in {took:.1f} s "
                        f"({kind}: {exc}); the store is throttling or unreachable: lower the "
                        "request rate (fewer DataLoader workers or fetch threads) or retry later"
                    ) from None
                self.counters.add(retries=1)
                time.sleep(self.retry.backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _changed(self, path: str) -> StorageError:
        size, etag = self._pins.get(path, (-1, None))
        return StorageError(
            f"{self.where(path)}: the object changed while this job read it (it had ETag "
            f"{etag}, {size} bytes); the store was rewritten under a running job: restart the "
            "job once the store is whole again"
        )

    def _pin(self, path: str) -> tuple[int, str | None]:
        """The object's size and ETag, as first seen by this process."""
        pinned = self._pins.get(path)
        if pinned is not None:
            return pinned
        self.counters.add(stats=1)
        info = self._call(path, lambda: self.fs.info(self._full(path)))
        etag = info.get("ETag") or info.get("etag")
        seen = (int(info["size"]), str(etag) if etag else None)
        with self._lock:
            return self._pins.setdefault(path, seen)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        size, etag = self._pin(path)
        end = min(offset + length, size)
        if end <= offset:
            return b""  # at or past the end: an empty range is no request
        full = self._full(path)
        if self._s3:
            data = self._call(path, lambda: self._s3_range(full, offset, end, etag))
        else:
            data = self._call(path, lambda: self.fs.cat_file(full, start=offset, end=end))
        data = bytes(data)
        self.counters.add(reads=1, bytes_read=len(data))
        return data

    def _s3_range(self, full: str, start: int, end: int, etag: str | None) -> bytes:
        """One ranged GET, on the pinned ETag (S3 answers 412 if the object changed)."""
        from fsspec.asyn import sync

        fs: Any = self.fs

        async def get() -> bytes:
            bucket, key, version = fs.split_path(full)
            extra = {"IfMatch": etag} if etag else {}
            if version:
                extra["VersionId"] = version
            response = await fs._call_s3(
                "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
            )
            try:
                return bytes(await response["Body"].read())
            finally:
                response["Body"].close()

        return bytes(sync(fs.loop, get))

    def size(self, path: str) -> int:
        """The object's size (as pinned: the first look of this process)."""
        return self._pin(path)[0]

    def etag(self, path: str) -> str | None:
        """The object's ETag as pinned (None where the store has none)."""
        return self._pin(path)[1]

    def list(self, prefix: str = "") -> list[str]:
        self.counters.add(lists=1)
        found = self._call(prefix or ".", lambda: self.fs.find(self.root))
        rel = (str(p)[len(self.root) + 1 :] for p in found)
        return sorted(p for p in rel if p.startswith(prefix))

    def _write(self, path: str, data: bytes) -> None:
        # Object stores publish a PUT whole or not at all; for file-like backends fsspec
        # writes through a temporary and moves it.
        self._call(path, lambda: self.fs.pipe_file(self._full(path), data))
        with self._lock:
            self._pins.pop(path, None)

    def put_file(self, local: Path, path: str) -> None:
        """Upload the file ``local`` to ``path`` (multipart where the library does it: an
        object appears whole or not at all)."""
        if self.read_only:
            raise ReadOnlyError(f"{self}: read-only; refusing to write {path}")
        self._call(path, lambda: self.fs.put_file(os.fspath(local), self._full(path)))
        self.counters.add(writes=1, bytes_written=local.stat().st_size)
        with self._lock:
            self._pins.pop(path, None)

    def _delete(self, path: str) -> None:
        if not self.exists(path):
            raise NotFoundError(f"{self.where(path)}: no such object")
        self._call(path, lambda: self.fs.rm_file(self._full(path)))
        with self._lock:
            self._pins.pop(path, None)

    def close(self) -> None:
        """Close the store's connections now. An S3 client left to close at garbage
        collection may be collected in a forked DataLoader worker, where closing it on the
        worker's event loop fails with tracebacks on stderr."""
        creator = getattr(self.fs, "_s3creator", None)
        if creator is not None and not self._closed:
            from fsspec.asyn import sync

            with contextlib.suppress(Exception):  # closing is best effort: never an error
                sync(self.fs.loop, creator.__aexit__, None, None, None, timeout=5)
        self._closed = True

    def exists(self, path: str) -> bool:
        # Asked afresh (not the pin): existence is what a writer checks before it writes.
        self.counters.add(stats=1)
        try:
            return bool(self._call(path, lambda: self.fs.exists(self._full(path))))
        except NotFoundError:
            return False


_sessions: dict[int, Any] = {}  # pid -> this process's aiobotocore session


def _session() -> Any:
    """One aiobotocore session per process: a client made from it again skips parsing the S3
    service model (~0.2 s of CPU per client otherwise, at every DataLoader worker's start). Not
    shared across a fork: a session's refreshable credentials hold a lock of its event loop."""
    from aiobotocore.session import AioSession

    pid = os.getpid()
    if pid not in _sessions:
        _sessions.clear()
        _sessions[pid] = AioSession()
    return _sessions[pid]


def _s3_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """S3 options with this driver's defaults where the caller set none: its own instance
    (retries are set on it) from the process's one session, one try per request in botocore,
    bounded timeouts."""
    out = dict(options)
    out.setdefault("skip_instance_cache", True)
    if "profile" not in out:  # a profile makes its own session
        out.setdefault("session", _session())
    config = dict(out.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})  # one try
    config.setdefault("connect_timeout", 10)
    config.setdefault("read_timeout", 60)
    out["config_kwargs"] = config
    return out
