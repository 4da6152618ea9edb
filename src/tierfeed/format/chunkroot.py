"""Where a store's chunk files lie: beside its index, or under the shard root it records.

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
cannot honour it refuses the index by its version instead of reading beside it; and a store
at a URL whose index names a root is refused (`tierfeed.loader.location`), so an index that
came from elsewhere never turns a reader to local files.

A shard that is a symbolic link is recorded as the file it points to (the link resolved as
the index is made, every link on its path too): re-pointing the link later changes nothing
that is read. What is read is still checked, so a shard rewritten or truncated under the
index fails at read: every member read against its xxh3, every chunk copied into a tier and
every chunk `tierfeed verify` checks against its size and xxh3.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ShardNames", "chunk_root", "shard_names"]


def chunk_root(index_path: Path, recorded: str | None) -> Path:
    """The directory the chunk names of the index at ``index_path`` are relative to: its
    own directory, or the ``recorded`` root (absolute, or relative to that directory)."""
    store = index_path.parent
    return store if recorded is None else store / recorded


@dataclass(frozen=True)
class ShardNames:
    """Where `tierfeed index` finds its shards again: what the header records as the chunk
    root (None: they lie in the store directory) and each shard's name under it."""

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
