"""`tierfeed index` wherever the shards and the index lie: local shards into a directory, or
shards at URLs (they stay where they are, only read).

At a URL the index goes to the shards' URL (``--out s3://bucket/shards``: only the index is
uploaded) or into a local directory (``--out DIR``: for a bucket its user cannot write, such
as a public dataset's). That local index records the shards' URL directory as its chunk root
(`tierfeed.format.chunkroot`), and a store opened there reads its chunks under that URL with
the tiers, copies and retries a store at a URL gets (`tierfeed.loader.compose`).

Each shard is copied in turn to a scratch file on local disk (its checksums need every byte),
indexed, and removed: the disk holds one shard at a time. Every shard's size and ETag are asked
for before the first is read, so that a missing one fails before any work.

With ``part`` (``--part I/N``) the shards are indexed in parts into a local directory, for
`tierfeed merge` (`tierfeed.format.indexparts`): each part lists the whole shard set (sizes and
ETags, its fingerprint) and copies only its own run of shards.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tierfeed.config import default_cache_dir
from tierfeed.errors import ConfigError, StorageError
from tierfeed.format import shards as local_shards
from tierfeed.format.braces import expand_braces
from tierfeed.format.chunkroot import ShardNames, is_url, url_shard_names
from tierfeed.format.gunzip import GZIP_SUFFIXES
from tierfeed.format.indexparts import index_part
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.shards import IndexReport
from tierfeed.format.shardset import ShardSet
from tierfeed.loader.location import StoreLocation
from tierfeed.loader.urldestination import UrlDestination
from tierfeed.storage import Driver, driver_for

__all__ = ["index_shards"]

_HOW = "--overwrite (overwrite=True from Python)"
_GLOB = "*?["
# What `tierfeed.format.shards.index_shards` takes after ``out``: labels, skip_bad_names,
# progress, classes.
_Options = tuple[str, bool, bool, "str | os.PathLike[str] | Sequence[str] | None"]


def index_shards(
    shards: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    labels: str = "auto",
    skip_bad_names: bool = False,
    progress: bool = True,
    classes: str | os.PathLike[str] | Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    part: tuple[int, int] | None = None,
) -> IndexReport:
    """`tierfeed.format.shards.index_shards`, of local shards or of shards at URLs, into a
    directory or at a URL; with ``part``, `tierfeed.format.indexparts.index_part`.

    Shards at URLs are named by URL: each one, brace patterns such as
    ``"s3://bucket/shards/shard-{000000..000009}.tar"``, or glob patterns such as
    ``"s3://bucket/shards/*.tar"`` (matched against a listing, sorted). With ``out`` a URL,
    they lie under it and only the index is uploaded there. With ``out`` a directory, the
    index goes there and records the deepest URL directory holding every shard as the chunk
    root (`tierfeed.format.chunkroot`); ``storage_options`` are then that URL's (as a
    `tierfeed.open_store` of the directory takes them again). ``part`` = (I, N): index only
    part I of N into ``out/parts/`` (``out`` a directory), for `tierfeed merge`. See the
    local function for the rest.

    Raises:
        ConfigError: local shards and URLs mixed; shards in two buckets; a gzipped shard at a
            URL; a glob pattern that matches nothing.
    """
    names = [os.fspath(s) for s in shards]
    urls = [n for n in names if is_url(n)]
    _refuse_gzipped([u for url in urls for u in expand_braces(url)])  # before any request
    options: _Options = (labels, skip_bad_names, progress, classes)
    if part is not None and (is_url(os.fspath(out)) or not urls):  # index_part refuses a URL
        return index_part(shards, out, part, *options, overwrite=overwrite)
    if is_url(os.fspath(out)):
        return _into_url(names, os.fspath(out), options, storage_options, overwrite)
    if not urls:
        return local_shards.index_shards(shards, out, *options, overwrite=overwrite)
    if len(urls) != len(names):
        local = next(n for n in names if not is_url(n))
        raise ConfigError(
            f"{local}, {urls[0]}: the shards of one store are all local files or all at URLs; "
            "index each kind into a store of its own"
        )
    return _into_directory(urls, out, options, storage_options, overwrite, part)


def _into_directory(
    urls: list[str],
    out: str | os.PathLike[str],
    options: _Options,
    storage_options: Mapping[str, Any] | None,
    overwrite: bool,
    part: tuple[int, int] | None,
) -> IndexReport:
    """Shards at ``urls`` indexed into the directory ``out``, their URL directory recorded;
    with ``part`` = (I, N), only part I of N, into ``out/parts/``."""
    found_urls = _expanded(urls, storage_options or {})
    _refuse_gzipped(found_urls)  # a glob's matches too
    root, names = url_shard_names(found_urls)
    with (
        driver_for(root, read_only=True, **(storage_options or {})) as origin,
        tempfile.TemporaryDirectory(dir=default_cache_dir(), prefix=".index-") as scratch,
    ):
        found = _shard_set(origin, ShardNames(root, names), root, Path(scratch))
        if part is not None:
            return index_part(found, out, part, *options, overwrite=overwrite)
        return local_shards.index_shards(found, out, *options, overwrite=overwrite)


def _into_url(
    shards: list[str],
    out: str,
    options: _Options,
    storage_options: Mapping[str, Any] | None,
    overwrite: bool,
) -> IndexReport:
    """Shards under the URL ``out`` indexed there: the index built in `staging_dir`, then
    uploaded (the shards are not)."""
    location = StoreLocation.of(out, storage_options)
    root = location.text
    bound = UrlDestination(root, storage_options, overwrite, _HOW)
    bound.check()  # an index there; a URL not writable
    staging = bound.staging
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging.mkdir(mode=0o700)
    with driver_for(root, read_only=True, **location.storage_options) as origin:
        names = _names_under(origin, root, shards)
        _refuse_gzipped([f"{root}/{name}" for name in names])  # a glob's matches too
        found = _shard_set(origin, ShardNames(None, names), root, staging)
        report = local_shards.index_shards(found, staging, *options, overwrite=True)
    with driver_for(root, read_only=False, **location.storage_options) as destination:
        destination.put_file(staging / INDEX_NAME, INDEX_NAME)
    shutil.rmtree(staging, ignore_errors=True)
    report.index = f"{root}/{INDEX_NAME}"
    return report


def _shard_set(origin: Driver, where: ShardNames, root: str, scratch: Path) -> ShardSet:
    """The shards ``where`` names under ``root`` (``origin``'s URL): each one's size and
    ETag asked for now (a missing one fails before any work; the parts of `index_part`
    fingerprint them), and a copy of each in ``scratch`` while it is indexed."""
    names = where.names
    sizes = [origin.size(name) for name in names]
    stamps = [origin.etag(name) or "" for name in names]  # pinned by size(): no request

    @contextlib.contextmanager
    def fetch(chunk: int) -> Iterator[Path]:
        local = scratch / ".shard.tar"
        try:
            origin.get_file(names[chunk], local)
        except StorageError:  # the store's own error (an OSError too): as it is
            raise
        except OSError as exc:  # the local copy
            raise StorageError(
                f"{scratch}: cannot hold a copy of {root}/{names[chunk]} to index it "
                f"({exc.strerror}); free space or point TIERFEED_CACHE at a larger local "
                "directory"
            ) from None
        try:
            yield local
        finally:
            local.unlink(missing_ok=True)

    return ShardSet(where, [f"{root}/{name}" for name in names], sizes, fetch, stamps)


def _expanded(patterns: list[str], options: Mapping[str, Any]) -> list[str]:
    """The URLs ``patterns`` name: brace patterns expanded as WebDataset's (in order), glob
    patterns matched against a listing under their literal directory (sorted)."""
    urls: list[str] = []
    for url in (u for pattern in patterns for u in expand_braces(pattern)):
        scheme, _, rest = url.partition("://")
        parts = rest.split("/")
        glob = next((i for i, part in enumerate(parts) if any(c in part for c in _GLOB)), None)
        if glob is None:
            urls.append(url)
            continue
        if glob == 0:
            raise ConfigError(f"{url}: name the bucket in full (a pattern matches objects in it)")
        root = f"{scheme}://{'/'.join(parts[:glob])}"
        with driver_for(root, read_only=True, **options) as origin:
            urls += [f"{root}/{name}" for name in _names_under(origin, root, [url])]
    return urls


def _names_under(origin: Driver, root: str, shards: list[str]) -> list[str]:
    """The shards' names under ``root`` (``origin``'s URL): URLs under it, brace patterns
    expanded as WebDataset's (in order), glob patterns expanded (sorted)."""
    names: list[str] = []
    for shard in (name for pattern in shards for name in expand_braces(pattern)):
        if not shard.startswith(root + "/"):
            raise ConfigError(f"{shard}: a shard must lie under --out {root}")
        pattern = shard[len(root) + 1 :]
        if any(c in pattern for c in _GLOB):
            found = [p for p in origin.list() if fnmatch.fnmatchcase(p, pattern)]
            if not found:
                raise ConfigError(f"{shard}: no object matches")
            names += sorted(found)
        else:
            names.append(pattern)
    return names


def _refuse_gzipped(urls: list[str]) -> None:
    gzipped = next((u for u in urls if u.endswith(GZIP_SUFFIXES)), None)
    if gzipped is not None:  # its chunk would be a plain tar that is not at the URL
        raise ConfigError(
            f"{gzipped}: a gzipped shard cannot be read by range at a URL; copy it here and "
            "index it into a local store (`tierfeed index` decompresses it there)"
        )
