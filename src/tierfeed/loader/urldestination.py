"""Where a store written to a URL goes: built in a staging directory on local disk, then
uploaded, the chunks first and the index last, so that a reader never finds an index whose
chunks are not all there.

The staging directory lies under the user's cache (`tierfeed.config.default_cache_dir`, so set
``TIERFEED_CACHE`` to a disk with room for the store), and is removed once the store is
uploaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tierfeed.config import default_cache_dir
from tierfeed.errors import NotFoundError, PackError, StorageError, WriteError
from tierfeed.format.chunkroot import is_url
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.storetarget import Destination, LocalDirectory
from tierfeed.loader.location import StoreLocation
from tierfeed.storage import Driver, driver_for

__all__ = ["UrlDestination", "destination_for", "staging_dir", "upload_store"]

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
        with (
            tqdm(
                total=total, unit="B", unit_scale=True, desc="upload", disable=not progress
            ) as bar,
            ThreadPoolExecutor(_THREADS) as pool,
        ):

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


@contextlib.contextmanager
def _staging_errors(staging: Path, url: str) -> Iterator[None]:
    """A local error in the staging directory says where that is and how to move it (the
    user named a URL, not this directory)."""
    try:
        yield
    except (PackError, StorageError) as exc:
        hint = (
            f"a store bound for {url} is built in {staging} first: free space there or "
            "point TIERFEED_CACHE at a local disk with room for the whole store"
        )
        if isinstance(exc, WriteError) and Path(exc.path).is_relative_to(staging):
            raise exc.advised(hint) from None
        if str(staging) not in str(exc):
            raise
        raise PackError(f"{exc} ({hint})") from None


def refuse_unwritable(
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


class UrlDestination:
    """A store bound for a URL: built in `staging_dir` (a `LocalDirectory` of its own, claimed
    as a directory destination is), uploaded by `publish` (`upload_store`), the staging
    directory then removed. A pack interrupted before its upload resumes from there.

    Args:
        url: where the store goes (``s3://bucket/ds``, ...).
        storage_options: as for `tierfeed.open_store`.
        overwrite: replace a store already at ``url``.
        how: how the user asks to replace a store, for the error that refuses one.
        progress: show the upload's progress bar.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        how: str = "overwrite=True",
        progress: bool = False,
    ) -> None:
        self.url = StoreLocation.of(url).text
        self.storage_options = dict(storage_options or {})
        self.overwrite, self.how, self.progress = overwrite, how, progress
        self.staging = staging_dir(self.url)
        # What the staging directory holds is this destination's own: a store built there
        # before (its upload failed) is built anew.
        self._local = LocalDirectory(self.staging, overwrite=True)

    @property
    def store(self) -> str:
        """The URL."""
        return self.url

    @property
    def directory(self) -> Path:
        """The staging directory."""
        return self.staging

    def check(self) -> None:
        """Refuse the URL before anything is built (`refuse_unwritable`)."""
        refuse_unwritable(self.url, self.storage_options, self.overwrite, self.how)

    def claim(self, resume: bool = False) -> Path:
        """Claim the staging directory (`LocalDirectory.claim`)."""
        self.staging.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self._local.claim(resume)

    def release(self) -> None:
        """Let the staging directory's lock go."""
        self._local.release()

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """A local error in the staging directory says where that is and how to move it (the
        user named a URL, not this directory)."""
        with _staging_errors(self.staging, self.url):
            yield

    def publish(self, directory: Path) -> None:
        """Upload the store built in ``directory``, then remove it."""
        upload_store(directory, self.url, self.storage_options, self.overwrite, self.progress)
        shutil.rmtree(directory, ignore_errors=True)


def destination_for(
    dst: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None,
    overwrite: bool,
    how: str = "overwrite=True",
    progress: bool = False,
) -> Destination:
    """A `UrlDestination` for a URL, else the `LocalDirectory` ``dst``: the one way `pack`,
    `Writer` and `optimize` (`tierfeed.loader.upload`) say where a store goes.

    Raises:
        PackError: ``storage_options`` given for a local path.
    """
    if is_url(os.fspath(dst)):
        return UrlDestination(dst, storage_options, overwrite, how, progress)
    if storage_options:
        raise PackError(f"{dst}: storage_options apply to URLs, not to local paths")
    return LocalDirectory(dst, overwrite, how)
