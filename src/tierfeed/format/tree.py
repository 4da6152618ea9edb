"""A store's original tree, answered from its index alone: `stat`, `listdir` and the
directory link counts a mount shows (`subdirs`), with no stat or open on storage."""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass

from tierfeed.errors import IndexFormatError, NotFoundError
from tierfeed.format.index import Index

__all__ = ["PathStat", "Tree"]


@dataclass(frozen=True)
class PathStat:
    """What `Store.stat` knows of a path, from the index alone.

    ``mode`` (permission bits) and ``mtime_ns`` are the packed tree's (its root's included)
    when the index holds the tree; otherwise 0o555 for a directory, 0o444 for a file, and the
    index file's mtime.
    """

    is_dir: bool
    size: int
    member: int = -1  # the member stored at this path; -1 for directories
    mode: int = 0o444
    mtime_ns: int = 0


class Tree:
    """The packed tree of the store whose index is ``index``; ``location`` names the store in
    errors."""

    def __init__(self, index: Index, location: str) -> None:
        self.index = index
        self.location = location
        self._index_mtime_ns = os.stat(index.path).st_mtime_ns

    @staticmethod
    def _clean(path: str | bytes) -> bytes:
        return os.fsencode(path).strip(b"/")

    def _dir_stat(self, at: int | None) -> PathStat:
        """A directory: the table's entry ``at``, or the defaults (root, no tree)."""
        ix = self.index
        if at is None or ix.dir_mode is None or ix.dir_mtime is None:
            return PathStat(True, 0, mode=0o555, mtime_ns=self._index_mtime_ns)
        return PathStat(True, 0, mode=int(ix.dir_mode[at]), mtime_ns=int(ix.dir_mtime[at]))

    def _find_dir(self, raw: bytes) -> int | None:
        """Position of directory ``raw`` in the index's directory table, or None."""
        dirs = self.index.dir_paths
        at = bisect_left(dirs, raw)
        return at if at < len(dirs) and dirs[at] == raw else None

    def stat(self, path: str | bytes) -> PathStat:
        """Size, kind, mode and mtime of ``path`` (relative to the store's original tree root).

        Raises:
            NotFoundError: no file or directory at ``path``.
        """
        raw = self._clean(path)
        if not raw:
            if self.index.root is not None:
                mode, mtime = self.index.root
                return PathStat(True, 0, mode=mode, mtime_ns=mtime)
            return self._dir_stat(None)
        ix = self.index
        member = ix.find_member(raw)
        if member is not None:
            size = int(ix.member_length[member])
            if ix.member_mode is None or ix.member_mtime is None:
                return PathStat(False, size, member, 0o444, self._index_mtime_ns)
            mode, mtime = int(ix.member_mode[member]), int(ix.member_mtime[member])
            return PathStat(False, size, member, mode, mtime)
        at = self._find_dir(raw)
        if at is not None:
            return self._dir_stat(at)
        prefix = raw + b"/"
        i = ix.bisect_path(prefix)
        if i < ix.num_members and ix.sorted_path(i).startswith(prefix):
            return self._dir_stat(None)
        raise NotFoundError(
            f"{self.location}: no file or directory {os.fsdecode(raw)!r} in the store"
        )

    def _table_children(self, prefix: bytes) -> list[bytes]:
        """Names of the directories directly under ``prefix`` in the directory table (sorted,
        checked on open): one binary search per child, skipping its descendants."""
        dirs = self.index.dir_paths
        i = bisect_left(dirs, prefix)
        names: list[bytes] = []
        while i < len(dirs) and dirs[i].startswith(prefix):
            name = dirs[i][len(prefix) :].split(b"/", 1)[0]
            names.append(name)
            i = max(bisect_left(dirs, prefix + name + b"0", i), i + 1)  # b"0" follows b"/"
        return names

    def subdirs(self, path: str | bytes) -> int | None:
        """How many directories lie directly under directory ``path`` (its link count is 2
        more), from the directory table: O(subdirectories · log dirs); None without the tree."""
        if not self.index.has_tree:
            return None
        raw = self._clean(path)
        return len(self._table_children(raw + b"/" if raw else b""))

    def listdir(self, path: str | bytes = "") -> list[str]:
        """Names directly under directory ``path``, sorted bytewise.

        Costs O(entries · log n): files are read off the path-sorted order, and each
        subdirectory is skipped with one binary search; directories without files come from
        the index's directory table the same way. Every step moves forward in the path order
        and the paths met must increase, so a crafted index whose order is not sorted ends in
        IndexFormatError after at most n steps, never in a loop.
        """
        raw = self._clean(path)
        prefix = raw + b"/" if raw else b""
        ix = self.index
        i = ix.bisect_path(prefix)
        names: list[bytes] = []
        seen: set[bytes] = set()
        previous = b""
        while i < ix.num_members:
            p = ix.sorted_path(i)
            if not p.startswith(prefix):
                break
            rest = p[len(prefix) :]
            slash = rest.find(b"/")
            name = rest if slash < 0 else rest[:slash]
            if p <= previous or name in seen or name in (b"", b".", b".."):
                raise IndexFormatError(
                    f"{ix.path}: damaged index: the path order is not sorted or holds an "
                    f"unsafe path at {os.fsdecode(p)!r}; re-create it (`tierfeed pack` or "
                    "`tierfeed index`)"
                )
            names.append(name)
            seen.add(name)
            previous = p
            if slash < 0:
                i += 1
            else:
                after = ix.bisect_path(prefix + name + b"0")  # b"0" sorts right after b"/"
                i = max(after, i + 1)  # always forward: the next path is checked above
        names.extend(n for n in self._table_children(prefix) if n not in seen)
        if not names and raw and not self.stat(raw).is_dir:
            raise NotFoundError(f"{self.location}: {os.fsdecode(raw)!r} is not a directory")
        return [os.fsdecode(n) for n in sorted(names)]
