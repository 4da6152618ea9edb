"""Where a store lives: a local directory (or its index file), or a URL (``s3://...`` and the
other fsspec protocols) whose index is fetched once per host into the local cache.

Every face names a store the same way: `tierfeed.open_store`, `torch.Dataset`,
`torch.ImageFolder`, and the commands take a path or a URL, and `StoreLocation` turns it into
the origin's driver (always read-only) and a local index file to map. A remote index is cached
under its URL and its ETag and size: a store rewritten in place is fetched anew, an unchanged
one never again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierfeed.config import default_cache_dir
from tierfeed.errors import ConfigError, IndexFormatError, NotFoundError, StorageError
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.publish import sweep_stale
from tierfeed.storage import Driver, PosixDriver, driver_for

__all__ = ["StoreLocation", "fetch_index", "is_url"]

_LOCK_WAIT_S = 900.0  # at most this long for another process of the host fetching the index


def is_url(text: str) -> bool:
    """Whether ``text`` names a store by URL (``file://`` is a local path)."""
    return "://" in text and not text.startswith("file://")


@dataclass(frozen=True)
class StoreLocation:
    """A store's place: a local path, or a URL with the options its storage takes.

    Attributes:
        text: the directory, index file or URL as given (``file://`` dropped; a URL without
            a trailing slash or index name).
        storage_options: for a URL, what fsspec's file system takes (credentials,
            ``client_kwargs={"endpoint_url": ...}``); never written to the index or cache.
    """

    text: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        where: str | os.PathLike[str] | StoreLocation,
        storage_options: Mapping[str, Any] | None = None,
    ) -> StoreLocation:
        """The location of a store given by path, URL, or an existing location."""
        if isinstance(where, StoreLocation):
            return where
        text = os.fspath(where)
        if not is_url(text):
            path = Path(text.removeprefix("file://")).absolute()
            if storage_options:
                raise ConfigError(f"{path}: storage_options apply to URLs, not to local paths")
            return cls(os.fspath(path))
        text = text.rstrip("/").removesuffix("/" + INDEX_NAME)
        return cls(text, dict(storage_options or {}))

    @property
    def remote(self) -> bool:
        """Whether the store is read through fsspec (not a local directory)."""
        return is_url(self.text)

    @property
    def root(self) -> str:
        """The store's directory or URL: chunk names are relative to it."""
        if self.remote:
            return self.text
        path = Path(self.text)
        return os.fspath(path.parent if path.name == INDEX_NAME else path)

    def origin(self) -> Driver:
        """A read-only driver over the store's directory or URL."""
        if self.remote:
            return driver_for(self.text, read_only=True, **self.storage_options)
        return PosixDriver(self.root, read_only=True)

    def index_file(
        self, cache_dir: str | os.PathLike[str] | None = None, origin: Driver | None = None
    ) -> Path:
        """A local file holding the store's index: the store's own, or, for a URL, the copy in
        ``cache_dir`` (default: the user's cache, see `tierfeed.config.default_cache_dir`),
        fetched if this host has none of the store's current index, through ``origin`` if
        given (else a driver of its own).

        Raises:
            IndexFormatError: the store has no index (nothing packed there, or a wrong URL).
            StorageError: the store cannot be read (access denied, unreachable).
        """
        if not self.remote:
            return Path(self.text)
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "index"
        if origin is not None:  # the caller's own driver, which it goes on using
            return fetch_index(origin, self.text, cache)
        with self.origin() as own:
            return fetch_index(own, self.text, cache)

    def __str__(self) -> str:
        return self.text


def fetch_index(origin: Driver, url: str, cache: Path) -> Path:
    """The index of the store at ``url`` (read through ``origin``) in ``cache``: one file per
    URL, named by the index's ETag and size, fetched by one process of the host while the
    others wait for it (boundedly), then published whole (temporary name, rename).

    Raises:
        IndexFormatError: no index at ``url``.
        StorageError: the index cannot be read, or the cache cannot be written.
    """
    try:
        size = origin.size(INDEX_NAME)
    except NotFoundError as exc:
        raise IndexFormatError(
            f"{exc}; check the URL, or pack a dataset there with `tierfeed pack SRC {url}`"
        ) from None
    version = hashlib.sha256(f"{origin.etag(INDEX_NAME)}:{size}".encode()).hexdigest()[:16]
    folder = cache / hashlib.sha256(url.encode()).hexdigest()[:24]
    target = folder / f"{version}-{INDEX_NAME}"
    if _usable(target, size):
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise StorageError(f"{folder}: cannot cache the index of {url} ({exc.strerror})") from None
    with _host_lock(folder / ".lock", url):
        if not _usable(target, size):  # another process of the host fetched it meanwhile
            _download(origin, url, target)
            _check_fetched(target, url)
    _drop_older(folder, keep=target.name)
    return target


def _usable(path: Path, size: int) -> bool:
    """Whether the cached copy is whole and opens; one damaged in place (bit rot, another
    hand) is removed, to be fetched again."""
    try:
        if path.stat().st_size != size:
            return False
        Index(path).close()
    except OSError:
        return False
    except IndexFormatError:
        with contextlib.suppress(OSError):
            path.unlink()
        return False
    return True


def _check_fetched(path: Path, url: str) -> None:
    """A fetched index is checked in full (its checksum too) once, before any process of
    the host maps it; a damaged one is removed and named by its URL."""
    try:
        with Index(path) as index:
            index.check_checksum()
    except IndexFormatError as exc:
        with contextlib.suppress(OSError):
            path.unlink()
        reason = str(exc).removeprefix(f"{path}: ")
        raise IndexFormatError(
            f"{url}/{INDEX_NAME}: {reason.split('; re-create it')[0]}; the store at this URL is "
            f"damaged: pack or upload it again"
        ) from None


def _download(origin: Driver, url: str, target: Path) -> None:
    sweep_stale(target.parent)  # left by a process killed mid-fetch
    try:
        origin.get_file(INDEX_NAME, target, fsync=True)
    except StorageError:  # the store's own error (an OSError too): as it is
        raise
    except OSError as exc:  # the local copy
        raise StorageError(
            f"{target}: cannot cache the index of {url} ({exc.strerror}); free space or point "
            "TIERFEED_CACHE at a writable local directory"
        ) from None


def _drop_older(folder: Path, keep: str) -> None:
    """Remove earlier versions of the index (a store rewritten in place); a process that maps
    one keeps reading it (unlinked files stay mapped)."""
    for path in folder.glob(f"*-{INDEX_NAME}"):
        if path.name != keep:
            with contextlib.suppress(OSError):
                path.unlink()


@contextlib.contextmanager
def _host_lock(path: Path, url: str) -> Iterator[None]:
    """One process of the host at a time; waits at most `_LOCK_WAIT_S`."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StorageError(f"{path}: cannot lock the index cache ({exc.strerror})") from None
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise StorageError(f"{path}: cannot lock ({exc.strerror})") from None
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"{path}: another process has been fetching the index of {url} for "
                        f"{_LOCK_WAIT_S:.0f} s; if none is running, remove this file"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
