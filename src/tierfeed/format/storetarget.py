"""Where a store is written: the `Destination` that `pack`, a `Writer` and `optimize` build it
for, `LocalDirectory` (a directory claimed for one writer), and `claimed`, the claim held for
a block."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from tierfeed.errors import PackError
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.packstate import JOURNAL, lock_destination, unlock_destination
from tierfeed.format.tarchunk import cannot_write
from tierfeed.publish import is_temporary

__all__ = [
    "Destination",
    "LocalDirectory",
    "as_destination",
    "claim_destination",
    "claimed",
    "remove_chunks",
]


class Destination(Protocol):
    """Where the bytes of a store go: the store is built in a local `directory` that `claim`
    locks (`release` lets it go), and `publish` makes it appear at its destination once its
    index is written (a URL's destination uploads it: `tierfeed.loader.urldestination`).

    The one sequence every writer follows: `check` before anything is written, `claim`,
    build inside `building`, `release` (always), then `publish` (once the index is written).
    """

    @property
    def store(self) -> Path | str:
        """What reports name: the store's directory, or its URL."""
        ...

    @property
    def directory(self) -> Path:
        """The local directory the store is built in."""
        ...

    def check(self) -> None:
        """Refuse, before anything is written, a destination that holds a store (unless told
        to replace it) or, for a URL, cannot be written.

        Raises:
            PackError: the destination holds a store or cannot be written.
        """
        ...

    def claim(self, resume: bool = False) -> Path:
        """Lock `directory` for this writer and clear what it replaces (`claim_destination`);
        ``resume`` keeps an interrupted pack's chunks and journal. Returns `directory`.

        Raises:
            PackError: it holds a store (unless told to replace it), or another writer's lock.
        """
        ...

    def release(self) -> None:
        """Let the lock `claim` took go (nothing to do when none is held)."""
        ...

    def building(self) -> AbstractContextManager[None]:
        """Around the build: a local error in `directory` says what to do about it."""
        ...

    def publish(self, directory: Path) -> None:
        """Make the store built in ``directory`` (its index written) appear at its destination."""
        ...


class LocalDirectory:
    """A store directory on a local file system: built in place, published as it is.

    Args:
        path: the store directory (created if missing).
        overwrite: replace a store (or an interrupted write's chunks) there.
        how: how the user asks to replace a store, for the error that refuses one.
    """

    def __init__(
        self, path: str | os.PathLike[str], overwrite: bool = False, how: str = "overwrite=True"
    ) -> None:
        self.path = Path(path)
        self.overwrite, self.how = overwrite, how
        self._lock: int | None = None

    @property
    def store(self) -> Path:
        """The store directory."""
        return self.path

    @property
    def directory(self) -> Path:
        """The store directory: built where it belongs."""
        return self.path

    def check(self) -> None:
        """Refuse a store already there, unless ``overwrite``."""
        if not self.overwrite and (self.path / INDEX_NAME).exists():
            raise already_holds_a_store(self.path, self.how)

    def claim(self, resume: bool = False) -> Path:
        """The directory, locked and cleared (`claim_destination`)."""
        self._lock = claim_destination(self.path, self.overwrite, resume, self.how)
        return self.path

    def release(self) -> None:
        """Let the lock go, its file removed."""
        if self._lock is not None:
            unlock_destination(self.path, self._lock)
            self._lock = None

    def building(self) -> AbstractContextManager[None]:
        """Nothing to add: a local error names the directory the user gave."""
        return contextlib.nullcontext()

    def publish(self, directory: Path) -> None:
        """Nothing to do: the store was built where it belongs."""


def as_destination(
    dst: str | os.PathLike[str] | Destination, overwrite: bool = False, how: str = "overwrite=True"
) -> Destination:
    """``dst`` as a `Destination`: a path is its `LocalDirectory` (``overwrite`` and ``how``
    are for it; a `Destination` has its own)."""
    if isinstance(dst, str | os.PathLike):
        return LocalDirectory(dst, overwrite, how)
    return dst


@contextlib.contextmanager
def claimed(destination: Destination, resume: bool = False) -> Iterator[Path]:
    """The destination claimed for the block (its directory), its lock let go after."""
    directory = destination.claim(resume)
    try:
        yield directory
    finally:
        destination.release()


def _is_chunk_file(name: str) -> bool:
    """A chunk, whole or still under its temporary name."""
    return name.endswith(".tar") or is_temporary(name)


def remove_chunks(chunks: Path) -> None:
    """Remove the chunk files (whole or partial) in ``chunks``; nothing else is touched."""
    with contextlib.suppress(FileNotFoundError):
        for path in chunks.iterdir():
            if _is_chunk_file(path.name) and path.is_file():
                path.unlink()


def _refuse_leftovers(dst: Path) -> None:
    """Chunks or a journal without an index: a write or pack was interrupted there."""
    names = sorted(p.name for p in (dst / "chunks").iterdir())
    left = [f"chunks/{n}" for n in names if _is_chunk_file(n)]
    left += [JOURNAL] if (dst / JOURNAL).exists() else []
    if left:
        raise PackError(
            f"{dst}: holds chunks but no index ({left[0]}, {len(left)} in all): an earlier "
            "write or pack was interrupted. A Writer cannot resume it, since its input is "
            "yours: pass overwrite=True to write the store again from the start"
        )


def claim_destination(
    dst: Path, overwrite: bool, resume: bool = False, how: str = "overwrite=True"
) -> int:
    """Lock ``dst`` for one writer and make sure it holds no store; returns the lock's fd.

    A store already there (an index) is refused unless ``overwrite``: then its index goes
    first (an interrupted rewrite leaves no store that opens), then its pack's journal. With
    ``resume`` (a pack), the chunks and journal of an interrupted pack stay for it to keep;
    else (a Writer, optimize) they are refused unless ``overwrite``, then removed. ``how``
    the user asks to replace a store, for the error that refuses one.
    """
    if dst.exists() and not dst.is_dir():
        raise PackError(f"{dst}: not a directory; choose another destination")
    try:
        (dst / "chunks").mkdir(parents=True, exist_ok=True)
        fd = lock_destination(dst)
    except OSError as exc:
        raise cannot_write(dst, exc) from None
    try:
        if (dst / INDEX_NAME).exists():
            if not overwrite:
                raise already_holds_a_store(dst, how)
            (dst / INDEX_NAME).unlink()
            with contextlib.suppress(FileNotFoundError):
                (dst / JOURNAL).unlink()
        if not resume:
            if not overwrite:
                _refuse_leftovers(dst)
            with contextlib.suppress(FileNotFoundError):
                (dst / JOURNAL).unlink()
            remove_chunks(dst / "chunks")
    except BaseException:
        unlock_destination(dst, fd)  # refused: no lock file stays behind
        raise
    return fd
