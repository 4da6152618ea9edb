"""The fsspec driver: any fsspec URL (s3://, gs://, az://, http(s)://, file://) as storage.

Reads are ranged requests (an S3 ranged GET). Library errors are translated here, once: a
missing bucket or object is `NotFoundError`, a refusal names the credentials to check, and
throttling (S3's 503 SlowDown, 429), server errors, timeouts, a connection reset and a body cut
short are transient: tried again under the one `RetryPolicy` (bounded tries and seconds, each
retry counted in ``counters.retries``); a ranged read tried again asks only for the bytes it has
not received. The first look at an object pins its size and version for this process: an
object replaced under a running job is an error that says so, never a mix of old and new bytes
(S3, Azure and HTTP reads ask ``If-Match`` the pinned ETag; GCS reads name the pinned
generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

from tierfeed.errors import ConfigError, NotFoundError, ReadOnlyError, StorageError
from tierfeed.format.relpath import relative_parts
from tierfeed.storage.driver import Driver
from tierfeed.storage.fsspec_connection import (
    az_range,
    connection_closer,
    open_options,
    s3_range,
    store_kind,
)
from tierfeed.storage.nativeranges import NativeRanges, usable
from tierfeed.storage.objectfaults import (
    CHANGED,
    DENIED,
    MISSING,
    NO_BUCKET,
    ShortAnswerError,
    error_code,
    transient_kind,
)
from tierfeed.storage.retry import RetryPolicy, Verdict
from tierfeed.storage.s3ranges import Received, S3Ranges

__all__ = ["FsspecDriver", "RetryPolicy", "error_code"]

T = TypeVar("T")
_Get = Callable[[str, int, int, "_Pin", Received, float], None]  # one try of a ranged read

_ADVICE = (
    "the store is throttling, unreachable or cutting connections: lower the request rate "
    "(fewer DataLoader workers or fetch threads) or retry later"
)
_EXTRA = {"gs": "tierfeed[gcs]", "az": "tierfeed[azure]"}  # a protocol's own library


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

    # Each GET of an object store is slow; their aggregate grows with parallel ones (how many
    # pay: docs/BENCHMARKS.md, s3_compare's origin-limit row), and the fetch tuner climbs
    # from here to twice as many while that pays.
    parallel_requests = 32
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
                "fsspec, a dependency of tierfeed, is missing: reinstall it"
            ) from None
        self.url = url.rstrip("/")
        self.name = f"fsspec:{self.url}"
        self.scheme = store_kind(url)
        # gcsfs tries each request 6 times itself (its backoff is not configurable per
        # instance): retrying here too would multiply the tries (the deadline still holds).
        self.retry = retry or RetryPolicy()
        if self.scheme == "gs":
            self.retry = dataclasses.replace(self.retry, attempts=1)
        self._s3 = self.scheme == "s3"
        storage_options = open_options(self.scheme, storage_options)
        if self.scheme == "http" and not read_only:
            raise ReadOnlyError(
                f"{url}: an http(s) store is read-only; write to a path or to "
                "s3://, gs:// or az:// and serve that over http(s)"
            )
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except ImportError as exc:
            extra = _EXTRA.get(self.scheme, "tierfeed")
            raise ConfigError(f"{url}: {exc}; pip install '{extra}'") from None
        except Exception as exc:
            raise StorageError(f"{url}: cannot open ({type(exc).__name__}: {exc})") from None
        if self._s3:
            self.fs.retries = 1  # tried again here, counted
        self.root = root.rstrip("/")
        self._pins: dict[str, _Pin] = {}
        self._pinning: dict[str, threading.Lock] = {}  # path -> held while it is first looked at
        self._lock = threading.Lock()
        self._closed = False
        self._ranges: S3Ranges | bool | None = False  # False: not made yet (`read_block`)
        self._native: NativeRanges | bool | None = False  # False: not made yet

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
        if isinstance(exc, FileNotFoundError) or code in MISSING:
            if path in self._pins:  # it was there when this job first looked
                return self._changed(path)
            what = "no such bucket" if code in NO_BUCKET or self._no_bucket() else "no such object"
            return NotFoundError(f"{where}: {what}")
        if isinstance(exc, PermissionError) or code in DENIED:
            return StorageError(
                f"{where}: access denied ({code or exc}); check the credentials (environment, "
                "AWS_PROFILE, or storage_options) and that they may read this bucket"
            )
        return StorageError(f"{where}: {type(exc).__name__}: {exc}")

    def _no_bucket(self) -> bool:
        """Whether the bucket itself is missing (asked only once an object was not found)."""
        if self.scheme not in ("s3", "gs", "az"):
            return False
        bucket = self.root.split("/", 1)[0]
        try:
            return not self.fs.exists(bucket)
        except Exception:  # the question was only for a better message
            return False

    def _call(self, path: str, what: Callable[[float], T]) -> T:
        """``what(seconds_left)`` under the retry policy: a transient failure is tried again
        (counted), a permanent one is translated here, once."""

        def judge(exc: BaseException) -> Verdict:
            if error_code(exc) in CHANGED:
                return Verdict(error=self._changed(path))
            kind = transient_kind(exc)
            return Verdict(kind) if kind else Verdict(error=self._fail(path, exc))

        return self.retry.call(what, judge, self.where(path), self.counters, _ADVICE)

    def _bounded(self, seconds: float, coroutine: Callable[[], Any], plain: Callable[[], T]) -> T:
        """``coroutine()`` on the file system's loop, cancelled after ``seconds`` (a stalled
        request is then a timeout, within the policy's bound); ``plain()`` where the file
        system is not asynchronous (its own timeouts bound it)."""
        if not getattr(self.fs, "async_impl", False):
            return plain()
        from fsspec.asyn import sync

        async def run() -> Any:
            return await asyncio.wait_for(coroutine(), seconds)

        return cast("T", sync(self.fs.loop, run))

    def _changed(self, path: str) -> StorageError:
        pin = self._pins.get(path, _Pin(-1, None, None))
        return StorageError(
            f"{self.where(path)}: the object changed while this job read it (it had ETag "
            f"{pin.etag}, {pin.size} bytes); the store was rewritten under a running job: restart "
            "the job once the store is whole again"
        )

    def _pin(self, path: str) -> _Pin:
        """The object's size and version, as first seen by this process: one HEAD per object,
        however many reads ask at once (the pieces of a copy all start together, and each
        would otherwise send a HEAD of its own: bench/s3_trace.py counts them)."""
        pinned = self._pins.get(path)
        if pinned is not None:
            return pinned
        with self._lock:
            first = self._pinning.setdefault(path, threading.Lock())
        # The others wait for the first look, which its retry policy bounds; past that bound
        # each looks itself.
        waited = first.acquire(timeout=self.retry.deadline_s)
        try:
            pinned = self._pins.get(path)
            return pinned if pinned is not None else self._look(path)
        finally:
            if waited:
                first.release()

    def _look(self, path: str) -> _Pin:
        """One HEAD of ``path``; its size and version pinned."""
        self.counters.add(stats=1)
        full = self._full(path)
        info = self._call(
            path,
            lambda left: self._bounded(
                left, lambda: self.fs._info(full), lambda: self.fs.info(full)
            ),
        )
        etag = info.get("ETag") or info.get("etag")
        generation = info.get("generation") if self.scheme == "gs" else None
        seen = _Pin(int(info["size"]), str(etag) if etag else None, generation or None)
        with self._lock:
            return self._pins.setdefault(path, seen)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """For S3 received by obstore where asked and it can be (`NativeRanges`), else on
        fsspec's event loop."""
        native = self._received_natively() if self._s3 else None
        return self._read(path, offset, length, self._get if native is None else native.get)

    def read_whole_file(self, path: str, offset: int, length: int) -> bytes:
        """Through fsspec's event loop, never obstore: `get_file` fetches a store's index in
        the process that opened it, usually before it forks its DataLoader workers, and a
        child of a process that made an obstore request cannot use obstore (`usable`)."""
        return self._read(path, offset, length, self._get)

    def read_block(self, path: str, offset: int, length: int) -> bytes:
        """A copy's piece: for S3 on the calling thread (`S3Ranges`, or `NativeRanges` where
        asked), else as `read_range`."""
        return self._read(path, offset, length, self._piece_get())

    def read_parts(self, path: str, offset: int, length: int) -> Sequence[Any]:
        """`read_block`'s bytes as botocore (or obstore) handed them over, not joined."""
        return self._receive(path, offset, length, self._piece_get()).parts()

    def _piece_get(self) -> _Get:
        """One try of a copy's piece: on the calling thread where the client allows."""
        ranges = self._threaded() if self._s3 else None
        return self._get if ranges is None else ranges.get

    def open_ahead(self, paths: Sequence[str], blocks: bool = False) -> None:
        ranges = self._threaded() if blocks and self._s3 else None
        if isinstance(ranges, S3Ranges):  # copies come: their client made now, in the background
            ranges.ahead()

    def _threaded(self) -> NativeRanges | S3Ranges | None:
        """The calling thread's ranged GETs: obstore's where asked and this process can use
        it, else botocore's (`S3Ranges`)."""
        native = self._received_natively()
        if native is not None:
            return native
        with self._lock:
            if self._ranges is False:
                self._ranges = S3Ranges.of(self.fs)
            return self._ranges if isinstance(self._ranges, S3Ranges) else None

    def _received_natively(self) -> NativeRanges | None:
        """obstore's ranged GETs, if asked (``TIERFEED_S3_CLIENT=obstore``), this file system's
        settings carry over and this process may use it (`tierfeed.storage.nativeranges.usable`)."""
        with self._lock:
            if self._native is False:
                self._native = NativeRanges.of(self.fs)
            native = self._native
        return native if isinstance(native, NativeRanges) and usable() else None

    def _read(self, path: str, offset: int, length: int, get: _Get) -> bytes:
        return self._receive(path, offset, length, get).value()

    def _receive(self, path: str, offset: int, length: int, get: _Get) -> Received:
        pin = self._pin(path)
        end = min(offset + length, pin.size)
        if end <= offset:
            return Received()  # at or past the end: an empty range is no request
        full, got = self._full(path), Received()

        def rest(left: float) -> None:
            # Each try asks only for the bytes not received yet, of the pinned version.
            get(full, offset + len(got), end, pin, got, left)
            if len(got) < end - offset:
                raise ShortAnswerError(f"the answer ended {end - offset - len(got)} bytes short")

        self._call(path, rest)
        if len(got) != end - offset:  # a store that ignored the range
            raise StorageError(
                f"{self.where(path)}: asked for bytes {offset}-{end - 1}, got {len(got)} bytes"
            )
        self.counters.add(reads=1, bytes_read=len(got))
        return got

    def _get(self, full: str, start: int, end: int, pin: _Pin, got: Received, left: float) -> None:
        """One ranged GET of the pinned version, its bytes appended to ``got`` as they arrive
        (kept when the connection breaks), cancelled after ``left`` seconds: the store refuses
        it (412) or, for GCS, finds no such generation, if the object was replaced."""
        if self._s3:
            self._bounded(left, s3_range(self.fs, full, start, end, pin.etag, got), _none)
            return
        if self.scheme == "az" and pin.etag:
            self._bounded(left, az_range(self.fs, full, start, end, pin.etag, got), _none)
            return
        pinned: dict[str, Any] = {}
        if self.scheme == "gs" and pin.generation:
            pinned["generation"] = pin.generation
        elif self.scheme == "http" and pin.etag:
            pinned["headers"] = {"If-Match": pin.etag}
        got += self._bounded(
            left,
            lambda: self.fs._cat_file(full, start=start, end=end, **pinned),
            lambda: self.fs.cat_file(full, start=start, end=end, **pinned),
        )

    def size(self, path: str) -> int:
        """The object's size (as pinned: the first look of this process)."""
        return self._pin(path).size

    def etag(self, path: str) -> str | None:
        """The object's ETag as pinned (None where the store has none)."""
        return self._pin(path).etag

    def list(self, prefix: str = "") -> list[str]:
        self.counters.add(lists=1)
        found = self._call(prefix or ".", lambda _: self.fs.find(self.root))
        rel = (str(p)[len(self.root) + 1 :] for p in found)
        return sorted(p for p in rel if p.startswith(prefix))

    def _write(self, path: str, data: bytes) -> None:
        # Object stores publish a PUT whole or not at all; for file-like backends fsspec
        # writes through a temporary and moves it.
        self._call(path, lambda _: self.fs.pipe_file(self._full(path), data))
        with self._lock:
            self._pins.pop(path, None)

    def put_file(self, local: Path, path: str) -> None:
        """Upload the file ``local`` to ``path`` (multipart where the library does it: an
        object appears whole or not at all)."""
        if self.read_only:
            raise ReadOnlyError(f"{self}: read-only; refusing to write {path}")
        self._call(path, lambda _: self.fs.put_file(os.fspath(local), self._full(path)))
        self.counters.add(writes=1, bytes_written=local.stat().st_size)
        with self._lock:
            self._pins.pop(path, None)

    def _delete(self, path: str) -> None:
        if not self.exists(path):
            raise NotFoundError(f"{self.where(path)}: no such object")
        self._call(path, lambda _: self.fs.rm_file(self._full(path)))
        with self._lock:
            self._pins.pop(path, None)

    def close(self) -> None:
        """Close the store's connections now. A client or HTTP session left to close at
        garbage collection may be collected in a forked DataLoader worker, where closing it on
        the worker's copy of the parent's event loop fails (tracebacks on stderr) or hangs."""
        if self._closed:
            return
        self._closed = True
        for ranges in (self._ranges, self._native):
            if isinstance(ranges, (S3Ranges, NativeRanges)):
                ranges.close()
        closing = connection_closer(self.fs)
        if closing is not None:
            from fsspec.asyn import sync

            with contextlib.suppress(Exception):  # closing is best effort: never an error
                sync(self.fs.loop, closing, timeout=5)

    def exists(self, path: str) -> bool:
        # Asked afresh (not the pin): existence is what a writer checks before it writes.
        self.counters.add(stats=1)
        try:
            return bool(self._call(path, lambda _: self.fs.exists(self._full(path))))
        except NotFoundError:
            return False


def _none() -> None:
    return None


class _Pin(NamedTuple):
    """An object as this process first saw it."""

    size: int
    etag: str | None
    generation: str | None  # GCS's version of the object
