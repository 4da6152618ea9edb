"""Where a store lives: a local directory (or its index file), or a URL (``s3://...`` and the
other fsspec protocols) whose index is fetched once per host into the local cache.

Every face names a store the same way: `tierfeed.open_store`, `torch.Dataset`,
`torch.ImageFolder`, and the commands take a path or a URL, and `StoreLocation` turns it into
the origin's driver (always read-only) and its index, open. A local store whose index records
a URL as its chunk root (shards in a bucket its user cannot write, indexed into a local
directory: `tierfeed.format.chunkroot`) reads its chunks under that URL (`chunk_origin`), and
takes the ``storage_options`` of that URL's storage; an index fetched from a URL names no root.

A remote index is cached under its URL and its ETag and size: a store rewritten in place is
fetched anew, an unchanged one never again. The cache directory is checked once and opened
(`tierfeed.cachedir.CacheFolder`); the copy, its folder and its lock are then made, opened,
mapped and removed relative to that descriptor, never through a link and only if they are
this user's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierfeed.cachedir import CacheFolder, host_lock, list_names, open_own_file
from tierfeed.config import default_cache_dir
from tierfeed.errors import (
    ConfigError,
    IndexFormatError,
    NotFoundError,
    StorageError,
    TierfeedError,
)
from tierfeed.format.chunkroot import is_url
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.shardstore import shard_list, shard_store
from tierfeed.publish import is_temporary, sweep_stale
from tierfeed.storage import Driver, PosixDriver, driver_for

__all__ = ["StoreLocation", "fetch_index"]

_LOCK_WAIT_S = 900.0  # at most this long for another process of the host fetching the index


@dataclass(frozen=True)
class StoreLocation:
    """A store's place: a local path, or a URL with the options its storage takes.

    Attributes:
        text: the directory, index file or URL as given (``file://`` dropped; a URL without
            a trailing slash or index name).
        storage_options: for a URL, what fsspec's file system takes (credentials,
            ``client_kwargs={"endpoint_url": ...}``); never written to the index or cache.
            For a local store only where its index records a URL chunk root: that URL's.
    """

    text: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        where: str | os.PathLike[str] | StoreLocation | Sequence[str | os.PathLike[str]],
        storage_options: Mapping[str, Any] | None = None,
    ) -> StoreLocation:
        """The location of a store given by path, URL, or an existing location; or of the
        store of shards given by name (a list of ``.tar`` paths, a brace pattern, one
        ``.tar``): indexed once into the user's cache (`tierfeed.loader.shardstore`)."""
        if isinstance(where, StoreLocation):
            return where
        shards = shard_list(where)
        if shards is not None:
            if storage_options:
                raise ConfigError("storage_options apply to a store at a URL, not to shards")
            return cls(os.fspath(shard_store(shards)))
        if not isinstance(where, (str, os.PathLike)):
            raise ConfigError(
                f"a store is a directory, an index file or a URL (shards: a list of .tar "
                f"paths or a brace pattern), not a {type(where).__name__}"
            )
        text = os.fspath(where)
        if not is_url(text):
            path = Path(text.removeprefix("file://")).expanduser().absolute()
            if storage_options and not _chunks_at_a_url(path):
                raise ConfigError(f"{path}: storage_options apply to URLs, not to local paths")
            return cls(os.fspath(path), dict(storage_options or {}))
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

    def chunks_at(self, index: Index) -> str:
        """Where the chunks of this store (whose index is ``index``) lie: its URL, or what
        its local index records: the URL of its shards (`Index.chunk_url`), else its
        `chunk_root` (the store directory, or the shards' directory)."""
        if self.remote:
            return self.text
        return index.chunk_url or os.fspath(index.chunk_root)

    def chunk_origin(self, index: Index) -> Driver:
        """A read-only driver over `chunks_at`: what reads this store's chunks by name (for a
        URL, the object-store driver, with `storage_options` and its retry policy)."""
        if self.remote:
            return self.origin()
        if index.chunk_url is not None:  # its own user's index: the shards' URL
            return driver_for(index.chunk_url, read_only=True, **self.storage_options)
        return PosixDriver(index.chunk_root, read_only=True)

    def open_index(
        self,
        cache_dir: str | os.PathLike[str] | CacheFolder | None = None,
        origin: Driver | None = None,
        lazy: bool = False,
        recheck: bool = False,
    ) -> Index:
        """The store's index, open: the store's own file, or, for a URL, the copy in
        ``cache_dir`` (default: the user's cache, see `tierfeed.config.default_cache_dir`),
        fetched if this host has none of the store's current index, through ``origin`` if
        given (else a driver of its own). ``lazy`` applies to a store's own file (`Index`);
        a URL's copy was checked in full once, when fetched, and is stamped. ``recheck``: no
        stamp spares the checks (`tierfeed verify`).

        Raises:
            IndexFormatError: the store has no index (nothing packed there, or a wrong URL).
            StorageError: the store cannot be read (access denied, unreachable).
            ConfigError: the cache, or something in it, is a link or another user's.
        """
        if not self.remote:
            return Index(self.text, recheck=recheck, lazy=lazy)
        if origin is not None:  # the caller's own driver, which it goes on using
            return fetch_index(origin, self.text, cache_dir, recheck)
        with self.origin() as own:
            return fetch_index(own, self.text, cache_dir, recheck)

    def __str__(self) -> str:
        return self.text


def fetch_index(
    origin: Driver,
    url: str,
    cache: str | os.PathLike[str] | CacheFolder | None = None,
    recheck: bool = False,
) -> Index:
    """The index of the store at ``url`` (read through ``origin``), open from its copy in
    ``cache`` (default: the user's cache): one file per URL, named by the index's ETag and
    size, fetched by one process of the host while the others wait for it (boundedly), then
    published whole (temporary name, rename). The folder is opened, and checked, once: every
    file in it is then made, opened, locked and removed relative to that descriptor, never
    through a link, and only if it is this user's. ``recheck``: no stamp spares the checks of
    a copy cached before.

    Raises:
        IndexFormatError: no index at ``url``.
        StorageError: the index cannot be read, or the cache cannot be written.
        ConfigError: the cache, or something in it, is a link or another user's.
    """
    folder = _cache_folder(cache)
    name = hashlib.sha256(url.encode()).hexdigest()[:24]
    folder_fd = folder.open(name)  # before any request: a refused cache costs no GET
    try:
        index = _fetch_into(origin, url, folder_fd, folder.path / name, recheck)
    finally:
        os.close(folder_fd)
    if "chunk_root" in index.header:  # its chunks are the objects under the URL, no others
        index.close()
        raise IndexFormatError(
            f"{url}/{INDEX_NAME}: names a chunk root ({index.header['chunk_root']!r}), which "
            "only a store's own local index may do: a store at a URL reads the chunks under "
            "its URL; index them there (`tierfeed index URL/... --out URL`), or into a local "
            "directory of yours (`--out DIR`)"
        )
    return index


def _chunks_at_a_url(path: Path) -> bool:
    """Whether the local store at ``path`` has an index that records a URL chunk root (its
    reads then take that URL's storage_options); False where no index opens there."""
    try:
        with Index(path, lazy=True) as index:
            return index.chunk_url is not None
    except (TierfeedError, OSError):
        return False


def _cache_folder(cache: str | os.PathLike[str] | CacheFolder | None) -> CacheFolder:
    if isinstance(cache, CacheFolder):
        return cache
    if cache is None:
        return CacheFolder(default_cache_dir(), ("index",))
    return CacheFolder(Path(cache).absolute())


def _fetch_into(
    origin: Driver, url: str, folder_fd: int, folder: Path, recheck: bool = False
) -> Index:
    """`fetch_index` in the folder open as ``folder_fd`` (``folder`` names it)."""
    try:
        size = origin.size(INDEX_NAME)
    except NotFoundError as exc:
        raise IndexFormatError(
            f"{exc}; check the URL, or pack a dataset there with `tierfeed pack SRC {url}`"
        ) from None
    version = hashlib.sha256(f"{origin.etag(INDEX_NAME)}:{size}".encode()).hexdigest()[:16]
    target = folder / f"{version}-{INDEX_NAME}"
    index = _open_cached(folder_fd, target, size, recheck)
    if index is not None:
        return index
    with host_lock(folder_fd, folder / ".lock", f"fetching the index of {url}", _LOCK_WAIT_S):
        index = _open_cached(folder_fd, target, size, recheck)  # another process fetched it
        if index is None:
            _download(origin, url, folder_fd, target)
            index = _check_fetched(folder_fd, target, url)
    _drop_older(folder_fd, keep=target.name)
    return index


def _open_cached(folder_fd: int, path: Path, size: int, recheck: bool = False) -> Index | None:
    """The cached copy ``path`` (in the folder open as ``folder_fd``), open, if it is whole
    and opens; None if there is none. One damaged in place (bit rot, another hand) is
    removed, to be fetched again.

    Raises:
        ConfigError: the name is a link, another user's file, or not a file.
    """
    try:
        fd = open_own_file(folder_fd, path.name, os.O_RDONLY, path)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(fd).st_size != size:
            return None
        return Index(path, recheck=recheck, fd=fd)
    except IndexFormatError:
        with contextlib.suppress(OSError):
            os.unlink(path.name, dir_fd=folder_fd)
        return None
    finally:
        os.close(fd)


def _check_fetched(folder_fd: int, path: Path, url: str) -> Index:
    """A fetched index is checked in full (its checksum too) once, before any process of
    the host maps it, and returned open; a damaged one is removed and named by its URL."""
    fd = open_own_file(folder_fd, path.name, os.O_RDONLY, path)
    try:
        index = Index(path, fd=fd)
        try:
            index.check_checksum()
        except BaseException:
            index.close()
            raise
        return index
    except IndexFormatError as exc:
        with contextlib.suppress(OSError):
            os.unlink(path.name, dir_fd=folder_fd)
        reason = str(exc).removeprefix(f"{path}: ")
        raise IndexFormatError(
            f"{url}/{INDEX_NAME}: {reason.split('; re-create it')[0]}; the store at this URL is "
            f"damaged: pack or upload it again"
        ) from None
    finally:
        os.close(fd)


def _download(origin: Driver, url: str, folder_fd: int, target: Path) -> None:
    sweep_stale(target.parent, dir_fd=folder_fd)  # left by a process killed mid-fetch
    try:
        origin.get_file(INDEX_NAME, Path(target.name), fsync=True, dir_fd=folder_fd)
    except StorageError:  # the store's own error (an OSError too): as it is
        raise
    except OSError as exc:  # the local copy
        raise StorageError(
            f"{target}: cannot cache the index of {url} ({exc.strerror}); free space or point "
            "TIERFEED_CACHE at a writable local directory"
        ) from None


def _drop_older(folder_fd: int, keep: str) -> None:
    """Remove earlier versions of the index (a store rewritten in place); a process that maps
    one keeps reading it (unlinked files stay mapped)."""
    with contextlib.suppress(OSError):
        for name in list_names(folder_fd):
            if name.endswith(f"-{INDEX_NAME}") and name != keep and not is_temporary(name):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=folder_fd)
