"""Writing a store to a URL: `pack`, `Writer`, `optimize` and `index_shards` with an
``s3://...`` destination.

The store is built as it is for a directory, in a staging directory on local disk (under the
user's cache, `tierfeed.config.default_cache_dir`, so set ``TIERFEED_CACHE`` to a disk with
room for the store), and then uploaded: the chunks in parallel (multipart for large ones, as
the SDK does it), the index last, so that a reader never finds an index whose chunks are not
all there. A pack interrupted before the upload resumes from its staging directory; the
staging directory is removed once the store is uploaded.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tierfeed.config import default_cache_dir
from tierfeed.errors import ConfigError, NotFoundError, PackError, StorageError
from tierfeed.format import optimize as local_optimize
from tierfeed.format import pack as local_pack
from tierfeed.format import shards as local_shards
from tierfeed.format import writer as local_writer
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.optimize import Fn
from tierfeed.format.pack import PackOptions, PackReport
from tierfeed.format.shards import IndexReport
from tierfeed.format.writer import Classes, WriteReport
from tierfeed.loader.location import StoreLocation, is_url
from tierfeed.storage import Driver, driver_for

__all__ = ["Writer", "index_shards", "optimize", "pack", "staging_dir", "upload_store"]

_THREADS = 8  # chunks uploaded at once


def staging_dir(url: str) -> Path:
    """Where a store bound for ``url`` is built before its upload."""
    return default_cache_dir() / "upload" / hashlib.sha256(url.encode()).hexdigest()[:24]


def upload_store(
    local: str | os.PathLike[str],
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> int:
    """Upload the store in directory ``local`` to ``url``: chunks first, the index last;
    returns the bytes uploaded.

    With ``overwrite``, a store already at ``url`` is replaced: its chunks that the new index
    does not name are deleted once the new index is in place.

    Raises:
        PackError: ``url`` holds a store already (without ``overwrite``).
        StorageError: an upload failed (nothing of the new store is announced: no index).
    """
    location = StoreLocation.of(url, storage_options)
    target = driver_for(location.text, read_only=False, **location.storage_options)
    with target, Index(Path(local)) as ix:
        if target.exists(INDEX_NAME) and not overwrite:
            raise already_holds_a_store(location.text, "overwrite=True")
        root = ix.path.parent
        names = [ix.chunk_name(c) for c in range(ix.num_chunks)]
        total = int(ix.chunk_size.sum()) + ix.path.stat().st_size
        with tqdm(total=total, unit="B", unit_scale=True, desc="upload",
                  disable=not progress) as bar, ThreadPoolExecutor(_THREADS) as pool:  # fmt: skip

            def put(name: str) -> None:
                target.put_file(root / name, name)
                bar.update((root / name).stat().st_size)

            for done in [pool.submit(put, name) for name in names]:
                done.result()
            target.put_file(ix.path, INDEX_NAME)  # last: the store is whole when it appears
            bar.update(ix.path.stat().st_size)
        if overwrite:
            _delete_strays(target, set(names))
    return total


def _delete_strays(target: Driver, keep: set[str]) -> None:
    """Chunks of a replaced store that the new index does not name."""
    for name in target.list("chunks/"):
        if name not in keep:
            with contextlib.suppress(NotFoundError):  # gone already
                target.delete(name)


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
    url = StoreLocation.of(dst).text
    options = options or PackOptions()
    _refuse_existing(url, storage_options, options.overwrite)
    staging = staging_dir(url)
    staging.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (staging / INDEX_NAME).exists():  # built before, but its upload failed: build anew
        shutil.rmtree(staging)
    with _staging_errors(staging, url):
        report = local_pack.pack(src, staging, options, files)  # resumes an interrupted build
    started = time.perf_counter()
    upload_store(staging, url, storage_options, options.overwrite, options.progress)
    shutil.rmtree(staging, ignore_errors=True)
    report.seconds += time.perf_counter() - started
    report.store = url
    return report


@contextlib.contextmanager
def _staging_errors(staging: Path, url: str) -> Iterator[None]:
    """A local error in the staging directory says where that is and how to move it (the
    user named a URL, not this directory)."""
    try:
        yield
    except (PackError, StorageError) as exc:
        text = str(exc)
        if str(staging) not in text:
            raise
        hint = (f"a store bound for {url} is built in {staging} first: free space there or "
                "point TIERFEED_CACHE at a local disk with room for the whole store")  # fmt: skip
        text = text.replace("free some space there or choose a DST on another file system", hint)
        raise PackError(text if hint in text else f"{text} ({hint})") from None


def _refuse_existing(
    url: str, storage_options: Mapping[str, Any] | None, overwrite: bool, how: str = "--overwrite"
) -> None:
    """Before anything is built: a URL that cannot be written (http; a missing bucket, no
    right to write, bad credentials: an empty object is written there and deleted), or that
    holds a store and ``overwrite`` is not given, is refused. Else a pack of hours would fail
    at its first upload."""
    location = StoreLocation.of(url, storage_options)
    with driver_for(location.text, read_only=False, **location.storage_options) as target:
        if not overwrite and target.exists(INDEX_NAME):
            raise already_holds_a_store(url, how)
        probe = f".tierfeed-write-check-{os.getpid()}"
        try:
            target.write(probe, b"")
        except StorageError as exc:
            raise PackError(f"{url}: cannot write there ({exc}); nothing was built") from None
        with contextlib.suppress(StorageError):  # written, so deletable; a leftover is harmless
            target.delete(probe)


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

    At a URL (``out="s3://bucket/shards"``; ``shards`` are URLs under it, or glob patterns
    such as ``"s3://bucket/shards/*.tar"``), each shard is copied to `staging_dir` (its
    checksums need every byte), indexed there, and only the index is uploaded: the shards stay
    where they are. See the local function for the rest."""
    if not is_url(os.fspath(out)):
        return local_shards.index_shards(
            shards, out, labels, skip_bad_names, progress, classes, overwrite
        )
    location = StoreLocation.of(out, storage_options)
    root = location.text
    _refuse_existing(  # an index there; a URL not writable
        root, storage_options, overwrite, "--overwrite (overwrite=True from Python)"
    )
    staging = staging_dir(root)
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
    """The shards' names under ``root``: URLs under it, glob patterns expanded (sorted)."""
    names: list[str] = []
    for shard in shards:
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
    return names


class Writer(local_writer.Writer):
    """`tierfeed.format.writer.Writer`, to a directory or a URL: for a URL the store is
    written in `staging_dir` and uploaded by `close` (``storage_options`` as for
    `tierfeed.open_store`); see there for the rest."""

    def __init__(
        self,
        dst: str | os.PathLike[str],
        chunk_size: int = 64 * 2**20,
        labels: str = "auto",
        classes: Classes = None,
        overwrite: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        image_quality: int = 95,
    ) -> None:
        self.url = StoreLocation.of(dst).text if is_url(os.fspath(dst)) else None
        self.storage_options = dict(storage_options or {})
        if self.url is not None:
            _refuse_existing(self.url, storage_options, overwrite, "overwrite=True")
            dst = staging_dir(self.url)
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        super().__init__(
            dst, chunk_size, labels, classes, overwrite or self.url is not None, image_quality
        )
        self._overwrite = overwrite

    def close(self) -> WriteReport:
        """Finish the store (and upload it, for a URL); see the local Writer's `close`."""
        uploaded = self.report is not None
        report = super().close()
        if self.url is not None and not uploaded:
            upload_store(self.dst, self.url, self.storage_options, self._overwrite, False)
            shutil.rmtree(self.dst, ignore_errors=True)
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
    if not is_url(os.fspath(dst)):
        return local_optimize.optimize(
            fn, inputs, dst, workers, chunk_size, labels, classes, overwrite, start_method,
            image_quality,
        )  # fmt: skip
    url = StoreLocation.of(dst).text
    _refuse_existing(url, storage_options, overwrite, "overwrite=True")
    staging = staging_dir(url)
    staging.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _staging_errors(staging, url):
        report = local_optimize.optimize(
            fn, inputs, staging, workers, chunk_size, labels, classes, True, start_method,
            image_quality,
        )  # fmt: skip
    upload_store(staging, url, storage_options, overwrite, progress=False)
    shutil.rmtree(staging, ignore_errors=True)
    return report
