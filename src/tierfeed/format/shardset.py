"""The shards `tierfeed index` reads, every input checked before any work: local files (a
missing shard, a directory, a FIFO, an ``--out`` that is not a directory: refused before a
byte is read; gzipped ones decompressed once into the store directory, `tierfeed.format.gunzip`)
or a `ShardSet` made elsewhere (objects at a URL, `tierfeed.loader.urlshards`).

A `ShardSet` says what the index records (the chunk root and each shard's name under it,
`tierfeed.format.chunkroot`), how messages name each shard, and gives a local file of each in
turn: the file itself, or a copy of an object that lasts while it is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from tierfeed.errors import ConfigError, EmptySourceError, FormatError, PackError
from tierfeed.format.braces import expand_braces
from tierfeed.format.chunkroot import ShardNames, shard_names
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.gunzip import Gunzip, gunzip_shards, is_gzipped, plan_gunzip

__all__ = ["ShardSet", "check_target", "listed_shards", "shard_set"]


@dataclass(frozen=True)
class ShardSet:
    """Shards for `tierfeed.format.shards.index_shards`, in chunk order.

    Attributes:
        where: the chunk root the index records (None: the shards lie in the store
            directory, or under the URL the index goes to) and each shard's name under it.
        shown: each shard as messages name it (its path, or its URL).
        sizes: each shard's size in bytes, found before any work (the progress bar's total).
        fetch: a local file holding shard ``i``'s bytes while the context lasts (a copy of
            an object at a URL, removed after; a local shard itself).
    """

    where: ShardNames
    shown: list[str]
    sizes: list[int]
    fetch: Callable[[int], AbstractContextManager[Path]]
    stamps: list[str] = field(default_factory=list)  # each shard's version (mtime, ETag), if known


def shard_set(
    shards: Sequence[str | os.PathLike[str]] | ShardSet,
    out: Path,
    index_path: Path,
    overwrite: bool,
    progress: bool,
) -> ShardSet:
    """The shards to index into ``index_path`` (``out`` as given): ``shards`` itself when a
    `ShardSet`, else the files named (brace patterns expanded as WebDataset's,
    `tierfeed.format.braces`), each checked, gzipped ones decompressed into the store
    directory; ``--out`` checked after the shards (`check_target`); the store directory made.

    Raises:
        EmptySourceError: no shard given.
        FormatError: a shard is missing or not a regular file.
        PackError: ``--out`` is a file, or holds an index and ``overwrite`` is not given.
    """
    store = index_path.parent
    if isinstance(shards, ShardSet):
        if not shards.shown:
            raise EmptySourceError("no shard given to index")
        check_target(out, index_path, overwrite)
        _make_out(store)
        return shards
    paths = _shard_paths(shards)
    if not paths:
        raise EmptySourceError("no shard given to index")
    for p in paths:
        _shard_size(p)
    check_target(out, index_path, overwrite)
    plan = plan_gunzip([p for p in paths if is_gzipped(p)], store)  # each one gzip, or refused
    paths = _into_store(paths, plan, store, progress)
    return ShardSet(
        shard_names(paths, store),
        [str(p) for p in paths],
        [_shard_size(p) for p in paths],
        lambda chunk: nullcontext(paths[chunk]),
    )


def listed_shards(shards: Sequence[str | os.PathLike[str]], store: Path) -> ShardSet:
    """The local plain shards named (brace patterns expanded), each checked, named for an index
    in the directory ``store`` (`shard_names`), each stamped with its mtime; nothing written.

    Raises:
        EmptySourceError: no shard given.
        FormatError: a shard is missing or not a regular file.
        ConfigError: a shard is gzipped (it would be decompressed into one part's directory).
    """
    paths = _shard_paths(shards)
    if not paths:
        raise EmptySourceError("no shard given to index")
    stats = [_shard_stat(p) for p in paths]
    gzipped = next((p for p in paths if is_gzipped(p)), None)
    if gzipped is not None:
        raise ConfigError(
            f"{gzipped}: --part indexes plain .tar shards; decompress gzipped ones first, or "
            "index them without --part"
        )
    return ShardSet(
        shard_names(paths, store),
        [str(p) for p in paths],
        [st.st_size for st in stats],
        lambda chunk: nullcontext(paths[chunk]),
        [str(st.st_mtime_ns) for st in stats],
    )


def check_target(out: Path, index_path: Path, overwrite: bool) -> None:
    """``--out``: a directory (or an index path inside one) or nothing yet, and no index
    there unless ``overwrite``.

    Raises:
        PackError: ``--out`` is not a directory or cannot be used; it holds an index.
    """
    where = index_path.parent if out == index_path else out
    try:
        mode = where.stat().st_mode
    except FileNotFoundError:
        mode = None  # made once every input is checked
    except OSError as exc:
        raise PackError(f"{where}: cannot use --out: {exc.strerror or exc}") from None
    if mode is not None and not stat.S_ISDIR(mode):
        raise PackError(
            f"{where}: --out is not a directory; give the store directory the index goes into"
        )
    if not overwrite and index_path.exists():
        raise already_holds_a_store(index_path.parent, "--overwrite (overwrite=True from Python)")


def _make_out(store: Path) -> None:
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PackError(f"{store}: cannot make the store directory: {exc.strerror}") from None


def _shard_size(shard: Path) -> int:
    """Size of a shard that must be a regular file; stat only, so a FIFO is never opened."""
    return _shard_stat(shard).st_size


def _shard_stat(shard: Path) -> os.stat_result:
    """The stat of a shard that must be a regular file; a FIFO is never opened."""
    try:
        st = shard.stat()
    except FileNotFoundError:
        raise FormatError(f"{shard}: no such shard (does not exist); check the path") from None
    except OSError as exc:
        raise FormatError(f"{shard}: cannot stat shard: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise FormatError(f"{shard}: is a directory; a shard must be a plain .tar file")
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(
            f"{shard}: is not a regular file (FIFO, socket, device); a shard must be a plain "
            ".tar file"
        )
    return st


def _shard_paths(shards: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The shards given: each brace pattern (a string, ``shard-{000000..000009}.tar``)
    expanded as WebDataset expands it (`tierfeed.format.braces`)."""
    paths: list[Path] = []
    for shard in shards:
        names = expand_braces(shard) if isinstance(shard, str) else [os.fspath(shard)]
        paths.extend(map(Path, names))
    return paths


def _into_store(paths: list[Path], plan: list[Gunzip], store: Path, progress: bool) -> list[Path]:
    """Make the store directory; the shards as plain tars: each gzipped one decompressed
    there (``plan``)."""
    _make_out(store)
    if not plan:
        return paths
    gunzip_shards(plan, store, progress)
    plain = iter(g.target for g in plan)
    return [next(plain) if is_gzipped(p) else p for p in paths]
