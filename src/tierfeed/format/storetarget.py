"""Where a store written from Python goes: the `Destination` a `Writer` or `optimize` builds
it for, and `LocalDirectory`, a directory claimed for one writer."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

from tierfeed.errors import PackError
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.packstate import JOURNAL, lock_destination
from tierfeed.format.tarchunk import cannot_write
from tierfeed.publish import is_temporary

__all__ = ["Destination", "LocalDirectory", "claim_destination", "remove_chunks"]


class Destination(Protocol):
    """Where the bytes of a store written from Python go: the store is built in a local
    directory that `claim` checks and locks, and `publish` makes it appear at its destination
    once its index is written (a URL's destination uploads it: `tierfeed.loader.upload`)."""

    @property
    def store(self) -> Path | str:
        """What reports name: the store's directory, or its URL."""
        ...

    def claim(self) -> tuple[Path, int]:
        """Refuse a destination that cannot be written, or holds a store (unless told to
        replace it); the local directory to build the store in, and its lock's descriptor.

        Raises:
            PackError: the destination holds a store or cannot be written.
        """
        ...

    def publish(self, directory: Path) -> None:
        """Make the store built in ``directory`` (its index written) appear at its destination."""
        ...


class LocalDirectory:
    """A store directory on a local file system: built in place, published as it is.

    Args:
        path: the store directory (created if missing).
        overwrite: replace a store (or an interrupted write's chunks) there.
    """

    def __init__(self, path: str | os.PathLike[str], overwrite: bool = False) -> None:
        self.path = Path(path)
        self.overwrite = overwrite

    @property
    def store(self) -> Path:
        """The store directory."""
        return self.path

    def claim(self) -> tuple[Path, int]:
        """The directory and its lock (`claim_destination`)."""
        return self.path, claim_destination(self.path, self.overwrite)

    def publish(self, directory: Path) -> None:
        """Nothing to do: the store was built where it belongs."""


def _is_chunk_file(name: str) -> bool:
    """A chunk, whole or still under its temporary name."""
    return name.endswith(".tar") or is_temporary(name)


def remove_chunks(chunks: Path) -> None:
    """Remove the chunk files (whole or partial) in ``chunks``; nothing else is touched."""
    with contextlib.suppress(FileNotFoundError):
        for path in chunks.iterdir():
            if _is_chunk_file(path.name) and path.is_file():
                path.unlink()


def claim_destination(dst: Path, overwrite: bool) -> int:
    """Lock ``dst`` for one writer and make sure it holds no store; returns the lock's fd.

    A store already there (an index), or chunks left by an interrupted write or pack, is
    refused unless ``overwrite``: then the index goes first, then the chunks.
    """
    if dst.exists() and not dst.is_dir():
        raise PackError(f"{dst}: not a directory; choose another destination")
    try:
        (dst / "chunks").mkdir(parents=True, exist_ok=True)
        fd = lock_destination(dst)
    except OSError as exc:
        raise cannot_write(dst, exc) from None
    try:
        if (dst / INDEX_NAME).exists() and not overwrite:
            raise already_holds_a_store(dst, "overwrite=True")
        names = sorted(p.name for p in (dst / "chunks").iterdir())
        left = [f"chunks/{n}" for n in names if _is_chunk_file(n)]
        left += [JOURNAL] if (dst / JOURNAL).exists() else []
        if left and not overwrite:
            raise PackError(
                f"{dst}: holds chunks but no index ({left[0]}, {len(left)} in all): an earlier "
                "write or pack was interrupted. A Writer cannot resume it, since its input is "
                "yours: pass overwrite=True to write the store again from the start"
            )
        with contextlib.suppress(FileNotFoundError):
            (dst / INDEX_NAME).unlink()  # first: an interrupted rewrite leaves no store
        with contextlib.suppress(FileNotFoundError):
            (dst / JOURNAL).unlink()
        remove_chunks(dst / "chunks")
    except BaseException:
        os.close(fd)
        raise
    return fd
