"""S3 ranged GETs received outside the interpreter, where asked: obstore (Rust's object_store).

``TIERFEED_S3_CLIENT=obstore`` has a driver's S3 reads received by obstore: the request is
made, the answer parsed and its body received by Rust on obstore's own threads while the
asking thread waits without the interpreter's lock, and the body is handed over as it arrived
(one bytes per read of the connection); a copy's piece lands from those bytes as they are
(`Driver.read_parts`). It is not the default, by measurement (docs/BENCHMARKS.md, "Object
stores at the link"): in one process of 32 threads it receives a third more of the slowed
link than botocore's blocking client (`tierfeed.storage.s3ranges`, bench/s3_receive.py), but
in a Loader's cold epoch on 2 cores, where each worker runs obstore's runtime threads beside
its own, the epoch was slower with it (bench/s3_compare.py, alternated) and its CPU seconds per
GB no lower (bench/s3_trace.py). Where cores are many and one process reads, it may pay: the
choice is the user's, and every promise below is tested for both clients.

`NativeRanges` serves the ranged GETs of an s3fs file system with the settings that file
system was opened with, where obstore can be given the same ones: the endpoint, region,
credentials (from a botocore session, so the environment, ``AWS_PROFILE``, config files and
instance roles are read as botocore reads them), unsigned requests, path- or virtual-host-style
addressing, requester-pays and TLS verification (on or off). Where a setting cannot be carried
over (a session of the caller's own, a CA bundle, a botocore option only botocore knows) there
is no `NativeRanges`, and botocore serves the reads.

What a GET promises is the driver's (`FsspecDriver`): this module makes one try of one range
of a pinned version (``If-Match``), bounded in time, translates obstore's failures into what
the driver's `RetryPolicy` judges (the store's error code, a timeout, a connection cut or
refused) and leaves retries to it; obstore's own retries are off, so each one is counted.

obstore's runtime (its threads) starts with a process's first request and is not made again
in a forked child: a child of a process that made a request here would wait forever on its
first one. So a process makes requests here only if it started the runtime itself or no
process before the fork had (`usable`); a DataLoader worker forked after its parent read
from S3 reads through botocore instead. Nothing of a parent's is used in a child: its stores
are made anew per process.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from tierfeed.errors import StorageError
from tierfeed.storage.s3ranges import Pinned, Received, is_default_session

if TYPE_CHECKING:
    from obstore import GetOptions
    from obstore.store import ClientConfig, RetryConfig, S3Config

__all__ = ["NativeError", "NativeRanges", "usable"]

# A body is handed over as it arrives (hyper's reads: hundreds of KiB each on a fast link), not
# gathered into larger blocks first: what arrived before a cut is kept, to the byte, and the
# deadline is checked between reads.
_AS_IT_ARRIVES = 1

# botocore Config settings that have an obstore equivalent (or none is needed); any other
# setting the caller gave keeps the reads on botocore.
_KNOWN_CONFIG = {
    "connect_timeout",
    "read_timeout",
    "retries",
    "max_pool_connections",
    "s3",
    "signature_version",
    "region_name",
}
_KNOWN_CLIENT = {
    "endpoint_url",
    "region_name",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "verify",
    "use_ssl",
}

_runtime_pid: int | None = None  # the process whose first request started obstore's runtime


def usable() -> bool:
    """Whether this process may make requests through obstore: no process before a fork
    that made this one had started obstore's runtime (its threads are not in this process)."""
    return _runtime_pid is None or _runtime_pid == os.getpid()


def _starting() -> None:
    global _runtime_pid
    if _runtime_pid is None:  # noted before the first request: a fork meanwhile sees it
        _runtime_pid = os.getpid()


class NativeError(Exception):
    """An answer of the store obstore received, with the store's error code (S3's, or the HTTP
    status) where `tierfeed.storage.objectfaults.error_code` finds codes."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.error_code = code


_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>(\w+)</Code>")
_KIND = re.compile(r"kind: (\w+)")
_KINDS: dict[str, type[Exception]] = {
    "Timeout": TimeoutError,
    "Connect": ConnectionRefusedError,
    "Request": ConnectionResetError,
    "Interrupted": ConnectionResetError,
    "Decode": ConnectionResetError,
}


def translated(exc: Exception) -> Exception:
    """obstore's failure as the driver judges every client's: a missing object as
    FileNotFoundError (obstore's own is one), an answer by its code, a timeout, a cut or a
    refused connection by its type; anything else as it was."""
    if isinstance(exc, FileNotFoundError):
        return exc
    text = str(exc)
    answered = _CODE.search(text) or _STATUS.search(text)  # S3's code, else the status
    if answered:
        return NativeError(text.split("\n", 1)[0][:300], answered.group(1))
    kind = _KIND.search(text)
    if kind and kind.group(1) in _KINDS:
        return _KINDS[kind.group(1)](text.split("\n", 1)[0][:300])
    return exc


class NativeRanges:
    """Ranged GETs of one s3fs file system's objects, through obstore, on the calling thread
    (which waits without the interpreter's lock). Thread-safe; one store per bucket (and per
    shorter timeout, see `_store`) serves every thread of this process."""

    def __init__(self, fs: Any, settings: _Settings) -> None:
        self._fs = fs
        self._settings = settings
        self._lock = threading.Lock()
        self._pid = -1
        self._stores: dict[tuple[str, int], Any] = {}

    @classmethod
    def of(cls, fs: Any) -> NativeRanges | None:
        """Ranged GETs for ``fs`` (an s3fs file system) with its settings, or None where
        obstore is missing or cannot be given the same ones."""
        if os.environ.get("TIERFEED_S3_CLIENT", "").lower() != "obstore":
            return None  # botocore's client, the default (the module's docstring says why)
        try:  # imported only where asked for: not on every driver's first read
            import obstore  # noqa: F401
        except ImportError:
            return None
        if fs.session is not None and not is_default_session(fs.session):
            return None  # the caller's own session: its settings are not ours to copy
        client, config = dict(fs.client_kwargs), dict(fs.config_kwargs)
        addressing = dict(config.get("s3") or {}).get("addressing_style", "auto")
        if (
            set(client) - _KNOWN_CLIENT
            or set(config) - _KNOWN_CONFIG
            or set(dict(config.get("s3") or {})) - {"addressing_style"}
            or not isinstance(client.get("verify", True), bool)  # a CA bundle's path
            or ("signature_version" in config and not fs.anon)
            or getattr(fs, "version_aware", False)
            or set(getattr(fs, "req_kw", None) or {}) - {"RequestPayer"}
        ):
            return None
        return cls(fs, _settings(fs, client, config, addressing))

    def _store(self, bucket: str, left: float) -> Any:
        """This process's store of ``bucket`` whose waits fit in ``left`` seconds: the
        configured timeouts, or, when less time is left, ones that short."""
        cap = 0 if left >= self._settings.read_s else max(1, math.ceil(left))
        with self._lock:
            if self._pid != os.getpid():  # a forked process: nothing of the parent's is used
                self._pid, self._stores = os.getpid(), {}
            made = self._stores.get((bucket, cap))
            if made is None:
                made = self._settings.store(bucket, cap)
                self._stores[(bucket, cap)] = made
            return made

    def get(self, full: str, start: int, end: int, pin: Pinned, got: Received, left: float) -> None:
        """One ranged GET of bytes ``start``..``end - 1`` of ``full`` (bucket/key), on the
        pinned ETag (S3 answers 412 if the object changed), its bytes kept in ``got`` as they
        arrive (kept when the connection breaks). Bounded by ``left`` seconds.

        Raises:
            TimeoutError: ``left`` seconds passed before the body was whole.
            StorageError: the store answered more than the range.
            Exception: obstore's, translated (`translated`), for the driver to judge.
        """
        import obstore

        deadline = time.monotonic() + left
        bucket, key, _ = self._fs.split_path(full)
        store = self._store(bucket, left)
        asked: dict[str, Any] = {"range": (start, end)}
        if pin.etag:
            asked["if_match"] = pin.etag
        limit = len(got) + end - start
        _starting()
        try:
            answer = obstore.get(store, key, options=cast("GetOptions", asked))
            for block in answer.stream(min_chunk_size=_AS_IT_ARRIVES):
                got += block
                if len(got) > limit:
                    raise StorageError(f"{full}: answered more than bytes {start}-{end - 1}")
                if len(got) < limit and time.monotonic() > deadline:
                    raise TimeoutError(f"{full}: the answer took longer than {left:.1f} s")
        except (StorageError, TimeoutError):
            raise
        except Exception as exc:
            raise translated(exc) from exc

    def close(self) -> None:
        """Drop this process's stores (their connections close as they are dropped)."""
        with self._lock:
            self._stores = {}


class _Settings(NamedTuple):
    """What an obstore S3 store of a file system is made with."""

    config: dict[str, Any]  # S3Store's config: endpoint, region, addressing, credentials
    client_options: dict[str, Any]
    read_s: float
    connect_s: float
    session: dict[str, Any] | None  # a botocore session's arguments: credentials from it

    def store(self, bucket: str, cap: int) -> Any:
        """A store of ``bucket`` whose requests end within ``cap`` seconds (0: the configured
        timeouts), obstore's own retries off."""
        from obstore.store import S3Store

        read_s, connect_s = float(cap or self.read_s), min(self.connect_s, cap or self.connect_s)
        options = dict(self.client_options)
        options["connect_timeout"] = f"{connect_s}s"
        options["timeout"] = f"{read_s}s"  # the whole request, its body included
        provider = None
        if self.session is not None:
            import botocore.session
            from obstore.auth.boto3 import Boto3CredentialProvider

            provider = Boto3CredentialProvider(botocore.session.Session(**self.session))
        no_retry = {
            "max_retries": 0,
            "retry_timeout": timedelta(seconds=read_s),
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=1),
                "base": 2.0,
            },
        }
        return S3Store(
            bucket,
            config=cast("S3Config", self.config),
            client_options=cast("ClientConfig", options),
            retry_config=cast("RetryConfig", no_retry),
            credential_provider=provider,
        )


def _settings(
    fs: Any, client: dict[str, Any], config: dict[str, Any], addressing: str
) -> _Settings:
    """What botocore would use for ``fs``, for obstore: taken from the file system, else the
    environment; credentials given (or none: unsigned), or read by a botocore session."""
    env = os.environ
    endpoint = (
        client.get("endpoint_url")
        or fs.endpoint_url
        or env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
    )
    region = (
        client.get("region_name")
        or config.get("region_name")
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
    )
    store: dict[str, Any] = {
        "region": region or "us-east-1",
        "virtual_hosted_style_request": addressing == "virtual",
    }
    if endpoint:
        if client.get("use_ssl") is False or fs.use_ssl is False:
            endpoint = re.sub(r"^https://", "http://", endpoint)
        store["endpoint"] = endpoint
    if (getattr(fs, "req_kw", None) or {}).get("RequestPayer") == "requester":
        store["request_payer"] = True
    options: dict[str, Any] = {"allow_http": bool(endpoint and endpoint.startswith("http://"))}
    if client.get("verify") is False:
        options["allow_invalid_certificates"] = True
    key = client.get("aws_access_key_id") or fs.key
    secret = client.get("aws_secret_access_key") or fs.secret
    session: dict[str, Any] | None = None
    if fs.anon:
        store["skip_signature"] = True
    elif key and secret:
        store.update(access_key_id=key, secret_access_key=secret)
        token = client.get("aws_session_token") or fs.token
        if token:
            store["token"] = token
    else:
        session = dict(getattr(fs, "kwargs", None) or {})
        if getattr(fs, "profile", None):
            session["profile"] = fs.profile
    read_s = float(config.get("read_timeout") or 60)
    connect_s = float(config.get("connect_timeout") or 60)
    return _Settings(store, options, read_s, connect_s, session)
