"""One pread, O_DIRECT aware: every POSIX byte path's read (`tierfeed.storage.files`, the
index's hedged read in `tierfeed.format.indexfile`)."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os

__all__ = ["pread"]

_ALIGN = 4096  # what file systems that want direct reads aligned ask at most (a page)


def pread(
    fd: int, path: str, length: int, offset: int, flags: int, dir_fd: int | None = None
) -> bytes:
    """One pread of ``fd`` (opened from ``path``, relative to ``dir_fd`` if given, with
    ``flags``). An O_DIRECT read the file system refuses (EINVAL: a local disk's wants its
    buffer, offset and length aligned) is made again into an aligned buffer where the offset
    is aligned, else through the page cache."""
    try:
        return os.pread(fd, length, offset)
    except OSError as exc:
        if exc.errno != errno.EINVAL or not flags & os.O_DIRECT:
            raise
    if offset % _ALIGN == 0 and length > 0:
        with contextlib.suppress(OSError):
            return _aligned_pread(fd, length, offset)
    plain = os.open(path, (flags & ~os.O_DIRECT) | os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.pread(plain, length, offset)
    finally:
        os.close(plain)


def _aligned_pread(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at an aligned ``offset`` through a page-aligned buffer of whole
    pages (fewer where the file ends first)."""
    with mmap.mmap(-1, -(-length // _ALIGN) * _ALIGN) as buffer:
        got = os.preadv(fd, [buffer], offset)
        return buffer[: min(got, length)]
