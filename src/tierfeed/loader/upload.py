"""Writing a store to a URL: `pack`, `Writer` and `optimize` with an ``s3://...`` destination
(`tierfeed.loader.urlshards` indexes shards at a URL).

Each is given its `Destination` by `destination_for` and builds the store there as it does for
a directory: for a URL, in a staging directory on local disk, uploaded once the index is
written (`tierfeed.loader.urldestination.UrlDestination`). A pack interrupted before the
upload resumes from its staging directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tierfeed.format import optimize as local_optimize
from tierfeed.format import pack as local_pack
from tierfeed.format.optimize import Fn
from tierfeed.format.pack import PackOptions, PackReport
from tierfeed.format.writer import Classes, WriteReport
from tierfeed.loader.urldestination import destination_for, staging_dir, upload_store
from tierfeed.loader.writer import Writer

__all__ = ["Writer", "optimize", "pack", "staging_dir", "upload_store"]


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    options: PackOptions | None = None,
    files: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackReport:
    """`tierfeed.format.pack.pack`, to a directory or a URL (built in `staging_dir`, then
    uploaded with `upload_store`); see there for the arguments and errors."""
    options = options or PackOptions()
    target = destination_for(
        dst, storage_options, options.overwrite, "--overwrite", options.progress
    )
    return local_pack.pack(src, target, options, files)


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
    return local_optimize.optimize(
        fn,
        inputs,
        destination_for(dst, storage_options, overwrite),
        workers,
        chunk_size,
        labels,
        classes,
        overwrite,
        start_method,
        image_quality,
    )
