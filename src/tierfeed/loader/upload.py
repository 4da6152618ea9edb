"""Writing a store to a URL: `pack`, `Writer`, `optimize` and `index_shards` with an
``s3://...`` destination.

Each builds the store as it does for a directory, in a staging directory on local disk, and
uploads it (`tierfeed.loader.urldestination`). A pack interrupted before the upload resumes
from its staging directory.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tierfeed.errors import ConfigError, PackError
from tierfeed.format import optimize as local_optimize
from tierfeed.format import pack as local_pack
from tierfeed.format import shards as local_shards
from tierfeed.format.braces import expand_braces
from tierfeed.format.gunzip import GZIP_SUFFIXES
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.optimize import Fn
from tierfeed.format.pack import PackOptions, PackReport
from tierfeed.format.shards import IndexReport
from tierfeed.format.writer import Classes, WriteReport
from tierfeed.loader.location import StoreLocation, is_url
from tierfeed.loader.urldestination import (
    UrlDestination,
    staging_dir,
    upload_store,
)
from tierfeed.loader.writer import Writer
from tierfeed.storage import Driver, driver_for

__all__ = ["Writer", "index_shards", "optimize", "pack", "staging_dir", "upload_store"]

_HOW_PACK = "--overwrite (PackOptions(overwrite=True) from Python)"
_HOW_INDEX = "--overwrite (overwrite=True from Python)"


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    options: PackOptions | None = None,
    files: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackReport:
    """`tierfeed.format.pack.pack`, to a directory or a URL (built in `staging_dir`, then
    uploaded with `upload_store`); see there for the arguments and errors."""
    if not is_url(os.fspath(dst)):
        if storage_options:
            raise PackError(f"{dst}: storage_options apply to URLs, not to local paths")
        return local_pack.pack(src, dst, options, files)
    options = options or PackOptions()
    target = UrlDestination(dst, storage_options, options.overwrite, _HOW_PACK, options.progress)
    target.check()
    staging = target.staging
    staging.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (staging / INDEX_NAME).exists():  # built before, but its upload failed: build anew
        shutil.rmtree(staging)
    with target.building():
        report = local_pack.pack(src, staging, options, files)  # resumes an interrupted build
    started = time.perf_counter()
    target.publish(staging)
    report.seconds += time.perf_counter() - started
    report.store = target.url
    return report


def index_shards(
    shards: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    labels: str = "auto",
    skip_bad_names: bool = False,
    progress: bool = True,
    classes: str | os.PathLike[str] | Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> IndexReport:
    """`tierfeed.format.shards.index_shards`, in a directory or at a URL.

    At a URL (``out="s3://bucket/shards"``; ``shards`` are URLs under it, brace patterns such
    as ``"s3://bucket/shards/shard-{000000..000009}.tar"`` or glob patterns such as
    ``"s3://bucket/shards/*.tar"``), each shard is copied to `staging_dir` (its
    checksums need every byte), indexed there, and only the index is uploaded: the shards stay
    where they are. See the local function for the rest."""
    if not is_url(os.fspath(out)):
        remote = next((str(s) for s in shards if is_url(os.fspath(s))), None)
        if remote is not None:
            raise ConfigError(
                f"{remote}: shards at a URL are indexed into a store at their URL (--out "
                "s3://bucket/shards; only the index is uploaded): a local store reads local "
                "shards"
            )
        return local_shards.index_shards(
            shards, out, labels, skip_bad_names, progress, classes, overwrite
        )
    location = StoreLocation.of(out, storage_options)
    root = location.text
    bound = UrlDestination(root, storage_options, overwrite, _HOW_INDEX)
    bound.check()  # an index there; a URL not writable
    staging = bound.staging
    shutil.rmtree(staging, ignore_errors=True)
    with driver_for(root, read_only=True, **location.storage_options) as origin:
        names = _shard_names(origin, root, [os.fspath(s) for s in shards])
        local = []
        for name in names:
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            origin.get_file(name, target)
            local.append(target)
    report = local_shards.index_shards(
        local, staging, labels, skip_bad_names, progress, classes, overwrite=True
    )
    with driver_for(root, read_only=False, **location.storage_options) as destination:
        destination.put_file(staging / INDEX_NAME, INDEX_NAME)
    shutil.rmtree(staging, ignore_errors=True)
    report.index = f"{root}/{INDEX_NAME}"
    return report


def _shard_names(origin: Driver, root: str, shards: list[str]) -> list[str]:
    """The shards' names under ``root``: URLs under it, brace patterns expanded as
    WebDataset's (in order), glob patterns expanded (sorted)."""
    names: list[str] = []
    for shard in (name for pattern in shards for name in expand_braces(pattern)):
        if not shard.startswith(root + "/"):
            raise ConfigError(f"{shard}: a shard must lie under --out {root}")
        pattern = shard[len(root) + 1 :]
        if any(c in pattern for c in "*?["):
            found = [p for p in origin.list() if fnmatch.fnmatchcase(p, pattern)]
            if not found:
                raise ConfigError(f"{shard}: no object matches")
            names += sorted(found)
        else:
            names.append(pattern)
    gzipped = next((n for n in names if n.endswith(GZIP_SUFFIXES)), None)
    if gzipped is not None:  # its chunk would be a plain tar that is not at the URL
        raise ConfigError(
            f"{root}/{gzipped}: a gzipped shard cannot be read by range at a URL; copy it "
            "here and index it into a local store (`tierfeed index` decompresses it there)"
        )
    return names


def optimize(
    fn: Fn,
    inputs: Sequence[Any],
    dst: str | os.PathLike[str],
    workers: int = 2,
    chunk_size: int = 64 * 2**20,
    labels: str = "auto",
    classes: Classes = None,
    overwrite: bool = False,
    start_method: str = "spawn",
    storage_options: Mapping[str, Any] | None = None,
    image_quality: int = 95,
) -> WriteReport:
    """`tierfeed.format.optimize.optimize`, to a directory or a URL (built in `staging_dir`,
    then uploaded); see there for the arguments."""
    target = UrlDestination(dst, storage_options, overwrite) if is_url(os.fspath(dst)) else None
    with target.building() if target else contextlib.nullcontext():
        return local_optimize.optimize(
            fn, inputs, target or dst, workers, chunk_size, labels, classes, overwrite,
            start_method, image_quality,
        )  # fmt: skip
