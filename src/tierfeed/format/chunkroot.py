"""Where a store's chunk files lie: beside its index, under the shard root it records, or under
the URL it records.

An index names each chunk by a relative path. An index without a ``chunk_root`` header field
(what `pack` and `Writer` write, every index before format 4, and `tierfeed index` of shards
inside ``--out``) names chunks relative to its own directory, and `tierfeed.format.relpath`
keeps every name inside that directory: a crafted index cannot make a reader open a file
outside the store.

`tierfeed index` of shards kept elsewhere (a read-only share) writes the index into the store
directory and records the shards' directory in the header as the chunk root, explicitly:
absolute, or relative to the store directory when the shards were named by relative paths
(then the store and its shards can move together). The chunk names stay relative names under
that root, and every reader checks each one as before (no absolute name, no ``..``), now
against the root: an index reaches only the files under the root its user indexed. The
field is covered by the header checksum; it makes the index format 4, so a tierfeed that
cannot honour it refuses the index by its version instead of reading beside it.

`tierfeed index` of shards at URLs into a local directory (a bucket its user cannot write,
such as a public dataset's) records the shards' URL directory as the root
(``s3://bucket/path``: a scheme, a bucket, no empty, ``.`` or ``..`` part, no trailing slash;
`url_shard_names`). A reader then reads the chunks under that URL, through the object-store
driver and the tiers a store at a URL gets (`tierfeed.loader.location`,
`tierfeed.loader.compose`); each name is checked against the URL as against a directory (no
absolute name, no ``..``: `tierfeed.format.relpath.relative_parts`, which every driver
applies). `Index.chunk_url` names such a root; `Index.chunk_root` is then the store directory,
where none of its chunks lie (a reader that reads files there finds none).

A root is honoured only in a store's own local index, which its user made: a store at a URL
whose index names any root, a directory or a URL, is refused (`tierfeed.loader.location`), so
an index that came from elsewhere never turns a reader to local files or to other objects.

A shard that is a symbolic link is recorded as the file it points to (the link resolved as
the index is made, every link on its path too): re-pointing the link later changes nothing
that is read. What is read is still checked, so a shard rewritten, replaced or truncated under
the index fails at read: every member read against its xxh3, every chunk copied into a tier and
every chunk `tierfeed verify` checks against its size and xxh3.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tierfeed.errors import ConfigError

__all__ = [
    "ShardNames",
    "chunk_root",
    "chunk_url",
    "is_url",
    "shard_names",
    "url_root_problem",
    "url_shard_names",
]

_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*")


def is_url(text: str) -> bool:
    """Whether ``text`` names a place by URL (``s3://...``; ``file://`` is a local path)."""
    return "://" in text and not text.startswith("file://")


def chunk_root(index_path: Path, recorded: str | None) -> Path:
    """The directory the chunk names of the index at ``index_path`` are relative to: its
    own directory, or the ``recorded`` root (absolute, or relative to that directory); for a
    recorded URL (`chunk_url`), the index's directory, where none of its chunks lie."""
    store = index_path.parent
    return store if recorded is None or is_url(recorded) else store / recorded


def chunk_url(recorded: str | None) -> str | None:
    """The URL the chunk names are relative to, when the ``recorded`` root is one."""
    return recorded if recorded is not None and is_url(recorded) else None


def url_root_problem(root: str) -> str | None:
    """What makes ``root`` (text holding ``://``) no URL directory a chunk root may name, or
    None: it needs a scheme other than ``file``, then a bucket and path parts, none of them
    empty, ``.`` or ``..``, and no NUL."""
    scheme, _, rest = root.partition("://")
    if not _SCHEME.fullmatch(scheme) or scheme.lower() == "file":
        return "has no object-store scheme (s3://, gs://, ...)"
    if "\0" in rest or any(part in ("", ".", "..") for part in rest.split("/")):
        return "has an empty, '.' or '..' part (or ends in '/')"
    return None


@dataclass(frozen=True)
class ShardNames:
    """Where `tierfeed index` finds its shards again: what the header records as the chunk
    root (None: they lie in the store directory, or under the store's own URL) and each
    shard's name under it."""

    root: str | None
    names: list[str]


def shard_names(shards: Sequence[Path], store: Path) -> ShardNames:
    """The chunk names of ``shards`` (each the file it resolves to, links followed) for an
    index in the directory ``store``: relative to the store when every shard lies in it,
    else relative to the deepest directory holding them all, recorded as the root (relative
    to the store if every shard was named by a relative path)."""
    real = [Path(os.path.realpath(s)) for s in shards]
    home = Path(os.path.realpath(store))
    if all(r.is_relative_to(home) for r in real):
        return ShardNames(None, [r.relative_to(home).as_posix() for r in real])
    top = Path(os.path.commonpath([r.parent for r in real]))
    names = [r.relative_to(top).as_posix() for r in real]
    relative = not any(Path(s).is_absolute() for s in shards)
    return ShardNames(os.path.relpath(top, home) if relative else os.fspath(top), names)


def url_shard_names(urls: Sequence[str]) -> tuple[str, list[str]]:
    """The chunk root and names of the shards at ``urls`` (objects, such as
    ``s3://bucket/path/shard-000000.tar``) for an index kept in a local directory: the
    deepest URL directory holding them all (the bucket at least), to be recorded as the
    root, and each shard's name under it.

    Raises:
        ConfigError: no URL; one that names no object under a bucket (`url_root_problem`);
            shards in two buckets or of two schemes.
    """
    if not urls:
        raise ConfigError("no shard given to index")
    split: list[list[str]] = []
    for url in urls:
        problem = url_root_problem(url) if is_url(url) else "is not a URL"
        scheme, _, rest = url.partition("://")
        if problem is None and "/" not in rest:
            problem = "names a bucket, not an object in it"
        if problem is not None:
            raise ConfigError(
                f"{url}: {problem}; name each shard by its URL (s3://bucket/path/shard.tar)"
            )
        split.append([scheme, *rest.split("/")])
    common = split[0][:-1]  # the parts every shard's directory starts with
    for parts in split[1:]:
        same = (a == b for a, b in zip(common, parts[:-1], strict=False))
        common = common[: next((i for i, s in enumerate(same) if not s), len(parts) - 1)]
    if len(common) < 2:  # not even the scheme and the bucket
        odd = next(u for u, p in zip(urls, split, strict=True) if p[:2] != split[0][:2])
        raise ConfigError(
            f"{urls[0]}, {odd}: the shards of one store lie in one bucket; index each "
            "bucket's shards into a store of its own"
        )
    root = f"{common[0]}://{'/'.join(common[1:])}"
    return root, ["/".join(parts[len(common) :]) for parts in split]
