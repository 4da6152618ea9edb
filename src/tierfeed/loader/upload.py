"""Writing a store to a URL: `pack`, `Writer` and `optimize` with an ``s3://...`` destination
(`tierfeed.loader.urlshards` indexes shards at a URL).

Each builds the store as it does for a directory, in a staging directory on local disk, and
uploads it (`tierfeed.loader.urldestination`). A pack interrupted before the upload resumes
from its staging directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tierfeed.errors import PackError
from tierfeed.format import optimize as local_optimize
from tierfeed.format import pack as local_pack
from tierfeed.format.chunkroot import is_url
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.optimize import Fn
from tierfeed.format.pack import PackOptions, PackReport
from tierfeed.format.writer import Classes, WriteReport
from tierfeed.loader.urldestination import (
    UrlDestination,
    staging_dir,
    upload_store,
)
from tierfeed.loader.writer import Writer

__all__ = ["Writer", "optimize", "pack", "staging_dir", "upload_store"]

_HOW_PACK = "--overwrite (PackOptions(overwrite=True) from Python)"


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
            fn,
            inputs,
            target or dst,
            workers,
            chunk_size,
            labels,
            classes,
            overwrite,
            start_method,
            image_quality,
        )
