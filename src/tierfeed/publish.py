"""Publish a file atomically: write it under a temporary name in its directory, then rename.

Chunks, the index, cache entries, verification marks, staged chunks and inbox segments are all
published here, under one temporary name, ``.tmp.<pid>.<name>``: hidden, recognisable as what
it will become, and carrying its writer's pid, so that `sweep_stale` can tell a temporary left
by a dead process from one still being written. This module sits at the bottom of the import
graph (beside `units`): `format`, `storage` and `dist` all use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = [
    "PendingFile",
    "is_temporary",
    "publish",
    "publishing",
    "sweep_stale",
    "temporary_path",
    "writer_pid",
]

_TEMPORARY = re.compile(r"\.tmp\.([0-9]+)\.(.+)", re.DOTALL)

Data = bytes | bytearray | memoryview


def temporary_path(path: str | os.PathLike[str], pid: int | None = None) -> Path:
    """The temporary name ``path`` is written under by process ``pid`` (default: this one)."""
    path = Path(path)
    return path.with_name(f".tmp.{os.getpid() if pid is None else pid}.{path.name}")


def writer_pid(name: str) -> int | None:
    """The pid of the process writing the temporary file ``name``; None for any other name."""
    match = _TEMPORARY.fullmatch(name)
    return int(match.group(1)) if match else None


def is_temporary(name: str) -> bool:
    """Whether ``name`` (a file name, not a path) is a temporary of `publish`/`publishing`."""
    return writer_pid(name) is not None


class PendingFile:
    """A file being written under its temporary name: `commit` publishes it, `abort` drops it.

    As a context manager it commits when the block ends normally and aborts on an exception.
    Errors are the `OSError` of the failed call, with the temporary file already removed; the
    caller translates them, naming the file.

    Args:
        path: the final name.
        mode: permission bits of the new file (the umask applies, as for `open`).
        fsync: sync the data before the rename (a caller that syncs later passes False).
        dir_fd: a directory descriptor ``path`` is relative to (a checked cache directory,
            `tierfeed.cachedir`); the temporary file is then opened without following a link.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        mode: int = 0o666,
        fsync: bool = True,
        dir_fd: int | None = None,
    ):
        self.path = Path(path)
        self.temporary = temporary_path(self.path)
        self._fsync = fsync
        self._dir_fd = dir_fd
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        if dir_fd is not None:
            flags |= os.O_NOFOLLOW
        self.fd = os.open(self.temporary, flags, mode, dir_fd=dir_fd)

    def write(self, *parts: Data) -> int:
        """Write every byte of ``parts``, in order; returns how many. On an error the file
        stays pending (the caller aborts it, or the ``with`` block does)."""
        return self._write_all(parts, lambda views, _: os.writev(self.fd, views))

    def write_at(self, offset: int, *parts: Data) -> int:
        """`write` from ``offset`` on, not moving the file's position (a section laid out
        before its bytes were known; other threads may write other ranges at once)."""
        return self._write_all(parts, lambda views, at: os.pwritev(self.fd, views, offset + at))

    @staticmethod
    def _write_all(parts: tuple[Data, ...], call: Callable[[list[memoryview], int], int]) -> int:
        """``call(views, written)`` until every byte is written: writev and pwritev may write
        less than asked (signals, > 2 GiB)."""
        views = [m for m in (memoryview(p).cast("B") for p in parts) if m.nbytes]
        total, written = sum(m.nbytes for m in views), 0
        while views:
            done = call(views, written)
            if done <= 0:  # nothing written and no error: treat as a full disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += done
            while views and done >= views[0].nbytes:
                done -= views.pop(0).nbytes
            if done:
                views[0] = views[0][done:]
        return total

    def size(self) -> int:
        """Bytes written so far (the temporary file's size)."""
        return os.fstat(self.fd).st_size

    def commit(self) -> None:
        """Sync (if asked), close and rename to the final name; on failure, abort and raise."""
        try:
            if self._fsync:
                os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            os.replace(self.temporary, self.path, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Close and remove the temporary file (idempotent; also after `commit`)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.temporary, dir_fd=self._dir_fd)

    def __enter__(self) -> PendingFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.commit()
        else:
            self.abort()


def publishing(path: str | os.PathLike[str], mode: int = 0o666, fsync: bool = True) -> PendingFile:
    """Start writing ``path``: ``with publishing(path) as out: out.write(...)`` renames it into
    place when the block ends, or removes the temporary file when the block raises."""
    return PendingFile(path, mode, fsync)


def publish(
    path: str | os.PathLike[str],
    content: Data | Callable[[PendingFile], object],
    mode: int = 0o666,
    fsync: bool = True,
    dir_fd: int | None = None,
) -> None:
    """Write ``content`` to ``path`` atomically: readers see the old file or the whole new one.

    Args:
        path: the final name (its directory must exist).
        content: the bytes, or a function writing them to the `PendingFile` it is given
            (anything taking a file with ``write``, e.g. ``lambda f: np.save(f, a)``).
        mode: permission bits of the new file (the umask applies).
        fsync: sync the data before the rename.
        dir_fd: a directory descriptor ``path`` is relative to (see `PendingFile`).

    Raises:
        OSError: the write failed; no temporary file is left and ``path`` is unchanged.
    """
    with PendingFile(path, mode, fsync, dir_fd) as out:
        if callable(content):
            content(out)
        else:
            out.write(content)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):  # no process can have this pid
        return False
    return True


def sweep_stale(
    directory: str | os.PathLike[str], recursive: bool = False, dir_fd: int | None = None
) -> int:
    """Remove the temporaries in ``directory`` whose writer process is gone; returns how many.

    Temporaries of live processes (this one included) are kept: they are still being written.
    A missing directory holds nothing. Symbolic links to directories are not followed. With
    ``dir_fd`` (a checked cache directory), ``directory`` is ignored and the walk and removals
    are made relative to that descriptor.
    """
    removed = 0
    walk = (
        os.fwalk(".", dir_fd=dir_fd)
        if dir_fd is not None
        else ((parent, dirs, names, None) for parent, dirs, names in os.walk(directory))
    )
    for parent, _, names, at in walk:
        for name in names:
            pid = writer_pid(name)
            if pid is not None and not _alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(name if at is not None else os.path.join(parent, name), dir_fd=at)
                    removed += 1
        if not recursive:
            break
    return removed
