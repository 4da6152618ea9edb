"""The one check that a relative name stays under its root: chunk names and driver paths.

It lives in `format` (the lowest package that needs it: `verify` checks chunk names in an
index) and `tierfeed.storage.files` re-exports it for the drivers and chunk sources.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

from tierfeed.errors import IndexFormatError, TierfeedError

__all__ = ["path_under", "relative_parts", "safe_chunk_path"]


def path_under(root: Path, name: str, refuse: Callable[[], TierfeedError]) -> Path:
    """``root / name`` after checking that ``name`` cannot resolve outside ``root``.

    Args:
        root: the directory ``name`` is relative to.
        name: a relative POSIX path.
        refuse: builds the error to raise (each caller names its own file and error type).

    Raises:
        The error ``refuse`` builds: ``name`` is empty or absolute, has a ``..`` part, or
        holds a NUL byte.
    """
    return root.joinpath(*relative_parts(name, refuse))


def relative_parts(name: str, refuse: Callable[[], TierfeedError]) -> tuple[str, ...]:
    """The parts of the relative POSIX path ``name``, after the checks of `path_under` (for
    roots that are not local directories: an object store's prefix)."""
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or ".." in parts or "\0" in name:
        raise refuse()
    return parts


def safe_chunk_path(root: Path, name: str, where: Path) -> Path:
    """The path of chunk ``name`` of the index ``where``, under ``root``: the store directory,
    or the shard root the index records (`tierfeed.format.chunkroot`).

    Raises:
        IndexFormatError: the chunk name would resolve outside ``root``.
    """
    outside = "the store" if root == where.parent else f"the store's chunk directory {root}"
    return path_under(
        root,
        name,
        lambda: IndexFormatError(f"{where}: chunk name {name!r} would resolve outside {outside}"),
    )
