"""What `tierfeed pack` checks before its first write: the source is a directory, and the
destination is one it may write that is not the source or inside it (the origin is read-only).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tierfeed.errors import PackError
from tierfeed.format.source import file_kind

__all__ = ["check_destination", "check_source"]


def _identity(path: str | Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_source(src: Path) -> tuple[int, int]:
    """The (device, inode) of the source directory; PackError if it is not one."""
    try:
        st = os.stat(src)
    except OSError as exc:
        raise PackError(
            f"{src}: cannot open the source ({exc.strerror or exc}); pack takes a source directory"
        ) from None
    if stat.S_ISREG(st.st_mode):
        raise PackError(
            f"{src}: a file, not a directory; pack takes the directory of a tree of files "
            "(`tierfeed index` indexes tar shards in place)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise PackError(
            f"{src}: not a directory ({file_kind(st.st_mode)}); pack takes a source directory"
        )
    return st.st_dev, st.st_ino


def check_destination(src: Path, dst: Path) -> None:
    """Refuse a destination pack cannot or must not write, before anything is written.

    The destination may not be the source or lie inside it (also through a symlink or a bind
    mount: directories are compared by identity), because the origin is read-only. (A store
    already there is the destination's to refuse: `tierfeed.format.storetarget`.)
    """
    source = check_source(src)
    real = Path(os.path.realpath(dst))
    if any(_identity(p) == source for p in (real, *real.parents)):
        sibling = src.absolute().parent / f"{src.absolute().name}-store"
        raise PackError(
            f"{dst}: the destination is inside the source {src}, and pack never writes inside "
            f"its source; choose a sibling directory such as {sibling}"
        )
    existing = next(p for p in (real, *real.parents) if os.path.lexists(p))
    if not existing.is_dir():
        where = "" if existing == real else f", so {dst} cannot be created under it"
        raise PackError(f"{existing}: not a directory{where}; choose another DST")
    if not os.access(existing, os.W_OK | os.X_OK):
        readonly = os.statvfs(existing).f_flag & os.ST_RDONLY
        why = "Read-only file system" if readonly else "Permission denied"
        raise PackError(f"{existing}: cannot write there ({why}); choose a writable DST")


def already_holds_a_store(dst: object, how: str = "--overwrite") -> PackError:
    """The error for a destination (a path or a URL) that holds a store, and ``how`` to replace it:
    ``--overwrite`` for pack (``PackOptions(overwrite=True)`` from Python), ``overwrite=True``
    for `Writer` and `optimize`."""
    if how == "--overwrite":
        how = "--overwrite (PackOptions(overwrite=True) from Python)"
    return PackError(f"{dst}: already holds a store; pass {how} to replace it")
