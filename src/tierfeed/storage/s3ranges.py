"""S3 ranged GETs on the calling thread, through botocore's own blocking client (urllib3).

An s3fs file system receives every answer on fsspec's one event-loop thread: the pieces of a
copy, each on a fetch thread of its own, all wait for that one thread to read their bodies,
and a copy lags the link (bench/s3_receive.py). `S3Ranges` serves the same ranged GETs on the
threads that ask, with a client made from the same settings the s3fs file system was opened
with (credentials, endpoint, region, profile, botocore config, requester-pays and the extra
request arguments): the environment (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...) and config
files are read by botocore as aiobotocore reads them. Where a setting cannot be carried over
(a session of the caller's own, an option only aiobotocore knows) there is no `S3Ranges`, and
the file system serves the reads as before.

What a GET promises is the driver's (`FsspecDriver`): this module makes one try of one range
of a pinned version (``If-Match``), bounded in time, and leaves retries and the translation of
failures to the driver's `RetryPolicy`. A client is never shared across a fork: a forked
process (a DataLoader worker) makes its own on its first read.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from typing import Any, Protocol

from tierfeed.errors import StorageError

__all__ = ["Pinned", "Received", "S3Ranges", "is_default_session", "mark_default_session"]

_BLOCK = 1 << 20  # bytes per read of a body: what arrived before a cut is kept, and the
# deadline is checked between reads

# The aiobotocore sessions tierfeed made itself (`fsspec_connection`): one holds nothing of the
# caller's, so botocore's default session reads the same settings.
_defaults: weakref.WeakSet[Any] = weakref.WeakSet()
_CREDENTIALS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token"})


class Received:
    """The bytes of one ranged read as they arrived, kept as the buffers the client handed
    over and joined once (`value`): a connection cut midway leaves what arrived before it."""

    def __init__(self) -> None:
        self._parts: list[Any] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iadd__(self, block: Any) -> Received:
        self.extend(block)
        return self

    def extend(self, block: Any) -> None:
        """Keep ``block`` (bytes, or any buffer) after what arrived before it."""
        size = len(block)
        if size:
            self._parts.append(block)
            self._size += size

    def value(self) -> bytes:
        """Every byte received, in order, as one bytes."""
        return b"".join(self._parts)

    def parts(self) -> list[Any]:
        """Every byte received, in order, as the buffers that came (no copy)."""
        return list(self._parts)


class Pinned(Protocol):
    """An object as the driver first saw it: its ETag (None where the store gave none)."""

    @property
    def etag(self) -> str | None: ...


def mark_default_session(session: Any) -> None:
    """Note ``session`` as one made with no settings of the caller's (see `S3Ranges.of`)."""
    _defaults.add(session)


def is_default_session(session: Any) -> bool:
    """Whether ``session`` is one tierfeed made with no settings of the caller's."""
    return session in _defaults


_alive: weakref.WeakSet[S3Ranges] = weakref.WeakSet()  # every S3Ranges of this process


def _after_fork() -> None:
    """A forked child's locks anew: one held by a thread of the parent (a client being made
    ahead) at the fork would be held forever in the child, which has no such thread."""
    for ranges in list(_alive):
        ranges._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class S3Ranges:
    """Ranged GETs of one s3fs file system's objects, on the calling thread.

    Thread-safe: botocore's clients are; one client (its pool sized by the file system's
    ``max_pool_connections``) serves every thread of this process.
    """

    def __init__(
        self, fs: Any, session: dict[str, Any], client: dict[str, Any], config: dict[str, Any]
    ) -> None:
        self._fs = fs
        self._session_kwargs, self._client_kwargs, self._config = session, client, config
        self._read_s = float(config.get("read_timeout") or 60)
        self._connect_s = float(config.get("connect_timeout") or 60)
        self._lock = threading.Lock()
        self._pid = -1
        self._session: Any = None
        self._clients: dict[int, Any] = {}  # a read timeout (0: the configured one) -> client
        self._ahead_pid, self._ahead = -1, threading.Thread()  # `ahead`'s, in this process
        _alive.add(self)

    @classmethod
    def of(cls, fs: Any) -> S3Ranges | None:
        """Ranged GETs for ``fs`` (an s3fs file system) with its settings, or None where
        botocore cannot be given the same ones (the file system then reads itself)."""
        try:
            from botocore import UNSIGNED
            from botocore.config import Config
            from botocore.session import Session
        except ImportError:
            return None
        if fs.session is not None and not is_default_session(fs.session):
            return None  # the caller's own session: its settings are not ours to copy
        session = dict(getattr(fs, "kwargs", None) or {})
        options = {
            "aws_access_key_id": fs.key,
            "aws_secret_access_key": fs.secret,
            "aws_session_token": fs.token,
            "endpoint_url": fs.endpoint_url,
        }
        client = dict(fs.client_kwargs)
        init = {k: v for k, v in options.items() if v is not None and v != client.get(k)}
        if "use_ssl" not in client:
            init["use_ssl"] = fs.use_ssl
        config = dict(fs.config_kwargs)
        config.setdefault("connect_timeout", fs.connect_timeout)
        config.setdefault("read_timeout", fs.read_timeout)
        if fs.anon:  # unsigned requests, with no credentials
            client = {k: v for k, v in client.items() if k not in _CREDENTIALS}
            init = {k: v for k, v in init.items() if k not in _CREDENTIALS}
            config["signature_version"] = UNSIGNED
        try:  # options that only aiobotocore knows: the file system reads itself
            Session(**session)
            Config(**config)
        except TypeError:
            return None
        return cls(fs, session, {**init, **client}, config)

    def _client(self, left: float) -> Any:
        """This process's client whose waits fit in ``left`` seconds: the configured one, or,
        when less time is left than its read timeout, one whose timeouts are that short."""
        cap = 0 if left >= self._read_s else max(1, math.ceil(left))
        with self._lock:
            if self._pid != os.getpid():  # a forked process: nothing of the parent's is used
                from botocore.session import Session

                self._pid, self._clients = os.getpid(), {}
                self._session = Session(**self._session_kwargs)
                if self._fs.session in _defaults:  # its parsed service models, not parsed again
                    self._session.register_component(
                        "data_loader", self._fs.session.get_component("data_loader")
                    )
            made = self._clients.get(cap)
            if made is None:
                from botocore.config import Config

                config = dict(self._config)
                if cap:
                    config["read_timeout"] = cap
                    config["connect_timeout"] = min(self._connect_s, cap)
                made = self._session.create_client(
                    "s3", config=Config(**config), **self._client_kwargs
                )
                self._clients[cap] = made
            return made

    def ahead(self) -> None:
        """Make this process's client in the background now (a copy's first GET would wait
        for it otherwise); best effort: a failure here is met again, and reported, by a GET."""
        with self._lock:
            if self._ahead_pid == os.getpid():
                return
            self._ahead_pid = os.getpid()
            self._ahead = threading.Thread(target=self._make, name="tierfeed-s3", daemon=True)
            self._ahead.start()

    def _make(self) -> None:
        with contextlib.suppress(Exception):
            self._client(math.inf)

    def get(self, full: str, start: int, end: int, pin: Pinned, got: Received, left: float) -> None:
        """One ranged GET of bytes ``start``..``end - 1`` of ``full`` (bucket/key), on the
        pinned ETag (S3 answers 412 if the object changed), its bytes appended to ``got``
        as they arrive (kept when the connection breaks). Its waits are bounded by the
        client's timeouts and ``left`` seconds (checked between blocks of the body).

        Raises:
            TimeoutError: ``left`` seconds passed before the body was whole.
            StorageError: the store answered more than the range.
            Exception: botocore's, for the driver to judge (retry or translate).
        """
        deadline = time.monotonic() + left
        client = self._client(left)
        bucket, key, version = self._fs.split_path(full)
        asked: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end - 1}"}
        if pin.etag:
            asked["IfMatch"] = pin.etag
        if version:
            asked["VersionId"] = version
        extra = getattr(self._fs, "_get_s3_method_kwargs", None)  # s3fs's request arguments
        asked = extra(client.get_object, **asked) if extra is not None else asked
        body = client.get_object(**asked)["Body"]
        limit = len(got) + end - start  # a server ignoring the range is not read on
        try:
            while block := body.read(_BLOCK):
                got += block
                if len(got) > limit:
                    raise StorageError(f"{full}: answered more than bytes {start}-{end - 1}")
                if len(got) < limit and time.monotonic() > deadline:
                    raise TimeoutError(f"{full}: the answer took longer than {left:.1f} s")
        finally:
            body.close()

    def close(self) -> None:
        """Close this process's connections (a forked copy's are the parent's: left alone)."""
        if self._ahead_pid == os.getpid() and self._ahead.is_alive():
            self._ahead.join(timeout=10)
        with self._lock:
            clients = list(self._clients.values()) if self._pid == os.getpid() else []
            self._clients = {}
        for made in clients:
            made.close()
