"""A store for shards given by name: ``Dataset(["a.tar", "b.tar"])``, a brace pattern
(``"shard-{000000..000009}.tar"``) or one ``.tar`` path, where a store is expected.

The shards are indexed once (`tierfeed.format.shards.index_shards`, where they lie; gzipped
ones decompressed) into a store directory in the user's cache
(`tierfeed.config.default_cache_dir`, under ``shards/``), named by the list of shards (their
absolute paths, in order). The directory holds a stamp of what was indexed: each shard's
resolved path, size and mtime. While the shards are unchanged the store is reused as it is;
when one changed, was replaced, or a link now points elsewhere, they are indexed again. One
process of the host indexes while the others wait for it (boundedly), as for a URL's index
(`tierfeed.loader.location`). Indexing says so in one line on stderr.

Shards at URLs are not indexed here: they are indexed once where they lie, into a store at
their URL (`tierfeed index 'URL/...' --out URL`) or, where the bucket is not the user's to
write, into a local directory that records their URL (`--out DIR`), and the store is named by
that URL or directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tierfeed.cachedir import CacheFolder, host_lock, open_own_file
from tierfeed.config import default_cache_dir
from tierfeed.errors import ConfigError, FormatError
from tierfeed.format.braces import expand_braces
from tierfeed.format.chunkroot import is_url
from tierfeed.format.gunzip import GZIP_SUFFIXES
from tierfeed.format.layout import INDEX_NAME
from tierfeed.publish import publish
from tierfeed.units import human

__all__ = ["SHARD_SUFFIXES", "shard_list", "shard_store"]

SHARD_SUFFIXES = (".tar", *GZIP_SUFFIXES)
_STAMP = "shards.json"
_LOCK_WAIT_S = 900.0  # at least this long for another process of the host indexing them
_LOCK_RATE = 50 << 20  # and longer for a large set: its bytes at this rate (it reads them all)


def shard_list(where: object) -> list[str] | None:
    """The shards ``where`` names (a list or tuple of paths, a brace pattern, or one path
    ending ``.tar``, ``.tar.gz`` or ``.tgz`` that is not a directory), patterns expanded; None
    when it names a store (a directory, an index, a URL of a store, anything else).

    Raises:
        ConfigError: an empty list; a list item that is not a path; a pattern that names too
            many shards.
    """
    if isinstance(where, (list, tuple)):
        if not where:
            raise ConfigError("an empty list of shards: give at least one .tar file")
        if not all(isinstance(w, (str, os.PathLike)) for w in where):
            raise ConfigError("a list of shards holds paths (str or os.PathLike) only")
        return [n for w in where for n in _names(os.fspath(w))]
    if not isinstance(where, (str, os.PathLike)):
        return None
    text = os.fspath(where)
    if not isinstance(text, str):
        return None
    names = _names(text)
    if len(names) > 1 or (names[0].endswith(SHARD_SUFFIXES) and not Path(names[0]).is_dir()):
        return names
    return None


def _names(text: str | bytes) -> list[str]:
    if not isinstance(text, str):
        return [os.fsdecode(text)]
    return expand_braces(text)


def shard_store(shards: Sequence[str], cache: Path | None = None) -> Path:
    """The store directory of ``shards`` in ``cache`` (default: the user's cache), indexed
    now unless an earlier index of the same, unchanged shards is there.

    Raises:
        ConfigError: a shard is named by URL; the cache, or something in it, is a link or
            another user's.
        FormatError, PackError: a shard is missing, not a tar, or holds a bad member (as
            `tierfeed index` says).
        StorageError: another process of the host held the lock past its bound.
    """
    urls = [s for s in shards if is_url(s)]
    if urls:
        raise ConfigError(
            f"{urls[0]}: shards at a URL are indexed once where they lie, then named by "
            "their directory's URL: tierfeed index 'URL/shard-{000000..000009}.tar' --out URL; "
            "or, where you cannot write there (a public bucket), by a local directory that "
            "keeps the index: --out LOCAL_DIR"
        )
    paths = [Path(s.removeprefix("file://")).expanduser().absolute() for s in shards]
    key = hashlib.sha256("\0".join(map(os.fspath, paths)).encode(errors="surrogateescape"))
    folder = CacheFolder(cache if cache is not None else default_cache_dir(), ("shards",))
    name = key.hexdigest()[:24]
    folder_fd = folder.open(name)  # made 0700, or checked: not a link, ours
    store = folder.path / name
    try:
        stamp = _stamp(paths)
        wait = max(_LOCK_WAIT_S, sum(size for _, size, _ in stamp) / _LOCK_RATE)
        with host_lock(folder_fd, store / ".lock", f"indexing the shards in {store}", wait):
            if _stamp_of(folder_fd, store) != stamp or not (store / INDEX_NAME).exists():
                _index(paths, store, stamp)
                text = json.dumps(stamp).encode()
                publish(store / _STAMP, text, mode=0o600, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
    return store


def _stamp(paths: list[Path]) -> list[tuple[str, int, int]]:
    """Each shard's resolved path, size and mtime (ns): what says it is unchanged."""
    out = []
    for path in paths:
        try:
            st = path.stat()
        except OSError as exc:
            raise FormatError(f"{path}: cannot use the shard: {exc.strerror}") from None
        out.append((os.path.realpath(path), st.st_size, st.st_mtime_ns))
    return out


def _stamp_of(folder_fd: int, store: Path) -> list[tuple[str, int, int]] | None:
    """The stamp of the shards indexed in ``store`` before, or None."""
    try:
        fd = open_own_file(folder_fd, _STAMP, os.O_RDONLY, store / _STAMP)
    except FileNotFoundError:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            found = json.loads(f.read(1 << 26))
        return [(str(path), int(size), int(mtime)) for path, size, mtime in found]
    except (ValueError, TypeError):
        return None  # damaged: indexed again
    finally:
        os.close(fd)


def _index(paths: list[Path], store: Path, stamp: list[tuple[str, int, int]]) -> None:
    from tierfeed.format.shards import index_shards  # (tqdm with it) only when indexing

    total = sum(size for _, size, _ in stamp)
    print(
        f"tierfeed: indexing {len(paths)} shard(s) ({human(total)}, read where they lie) "
        f"into {store}, once: reused while they are unchanged",
        file=sys.stderr,
    )
    index_shards(paths, store, progress=False, overwrite=True)
