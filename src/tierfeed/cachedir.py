"""Cache directories tierfeed can trust: opened without following a link, owned by this user.

A cache directory holds what tierfeed wrote and will serve or run again (chunks, stamps,
scratch files), often at a path another local user can reach first (under /tmp). So before
tierfeed writes into one, `open_cache_dir` opens it with ``O_DIRECTORY | O_NOFOLLOW`` and
checks the descriptor, not the path:

- a symbolic link is refused (never followed);
- private (the default): it must belong to this user and be writable by nobody else; a
  directory tierfeed creates is made 0700, an existing one keeps its mode (tierfeed never
  chmods what it did not create);
- shared (a cache several users fill on purpose): it must belong to this user or to root, and
  a directory writable by other users must be sticky (``chmod +t``), so nobody removes or
  replaces another's files.

Later creates, opens, renames and removals are made relative to the descriptor (``dir_fd``),
so a swap of the path after the check cannot redirect them: `CacheFolder` opens folders below
a cache that way, `open_own_file` the files in one (never a link, only this user's). This
module sits at the bottom of the import graph (beside `publish`): `config`, `format` and
`storage` all use it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from tierfeed.errors import ConfigError, StorageError

__all__ = [
    "DIR_FLAGS",
    "LOCK_POLL_MAX_S",
    "CacheFolder",
    "host_lock",
    "let_go",
    "list_names",
    "lock_within",
    "open_cache_dir",
    "open_own_file",
    "open_subdir",
    "private_dir",
]

# Opens a directory, never through a link at its last component.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_POLL_MAX_S = 0.004  # the longest sleep between two tries of a held lock (`lock_within`)


def _refuse(path: Path, what: str, st: os.stat_result | None = None) -> ConfigError:
    seen = "" if st is None else f" (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
    return ConfigError(f"{path}: {what}{seen}")


def _link_owner(path: Path) -> str:
    try:
        return f" (made by uid {os.lstat(path).st_uid})"
    except OSError:
        return ""


def open_cache_dir(
    path: str | os.PathLike[str], shared: bool = False, exact: bool = False, create: bool = True
) -> int:
    """Create ``path`` unless it exists (0700, 0755 when ``shared``; missing parents too),
    open it without following a link and check who may write it (see the module).

    Args:
        path: the directory.
        shared: a cache shared between users on purpose.
        exact: a directory of tierfeed's own (``/tmp/tierfeed-<uid>``): it must be 0700.
        create: make it if missing (else a missing directory is a StorageError).

    Returns:
        A descriptor of the directory (the caller closes it).

    Raises:
        ConfigError: it is a link, another user's, or open to writes by others.
        StorageError: it cannot be created or opened (a file there, no permission).
    """
    path = Path(path).absolute()
    mode = 0o755 if shared else 0o700
    fd, created = _make_and_open(path, mode, shared, exact, create)
    try:
        _check_open(fd, path, mode, created, shared, exact)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_and_open(
    path: Path, mode: int, shared: bool, exact: bool, create: bool
) -> tuple[int, bool]:
    """Make ``path`` (with ``mode``) unless it exists or not ``create``, and open it without
    following a link; also whether it was made here."""
    created = False
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, mode)
                created = True
        return os.open(path, DIR_FLAGS), created
    except OSError as exc:
        _refuse_open(path, exc, shared, exact)


def _refuse_open(path: Path, exc: OSError, shared: bool, exact: bool) -> NoReturn:
    """Raise why ``path`` could not be opened: a link, another user's, or else the OS's word."""
    if exc.errno == errno.ELOOP or os.path.islink(path):
        raise _refuse(
            path,
            f"the cache directory is a symbolic link{_link_owner(path)}, which tierfeed "
            "never follows; remove it, or give a directory you own itself, not a link",
        ) from None
    with contextlib.suppress(OSError):  # not ours to open: say whose it is
        _check(path, os.lstat(path), shared, exact)
    raise StorageError(
        f"{path}: cannot be used as a cache directory ({exc.strerror or exc}); "
        "give a writable directory path"
    ) from None


def _check_open(fd: int, path: Path, mode: int, created: bool, shared: bool, exact: bool) -> None:
    """Check the open directory ``fd``: its owner and mode (`_check`; one made here gets
    ``mode`` back from the umask), and that this user can write it."""
    st = os.fstat(fd)
    if created and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)  # ours, just made: the umask took bits away
        st = os.fstat(fd)
    _check(path, st, shared, exact)
    effective = os.access in os.supports_effective_ids  # as geteuid above
    # A shared one of root's not open to us, a read-only disk:
    if not os.access(".", os.W_OK, dir_fd=fd, effective_ids=effective):
        raise StorageError(
            f"{path}: cannot be used as a cache directory (uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}: not writable by uid {os.geteuid()}, or on a "
            "read-only file system); give a directory you can write"
        )


def _check(path: Path, st: os.stat_result, shared: bool, exact: bool) -> None:
    me = os.geteuid()
    owners = (me, 0) if shared else (me,)
    if st.st_uid not in owners:
        raise _refuse(
            path,
            "the cache directory belongs to another user; choose a directory you own, or remove it",
            st,
        )
    bits = stat.S_IMODE(st.st_mode)
    if exact and bits != 0o700:
        raise _refuse(
            path,
            "tierfeed's own cache directory must be 0700 and is not; remove it (tierfeed "
            "makes it again)",
            st,
        )
    if bits & (stat.S_IWGRP | stat.S_IWOTH) and not (shared and bits & stat.S_ISVTX):
        fix = "make it sticky (chmod +t) or " if shared else ""
        raise _refuse(
            path,
            f"the cache directory is writable by other users (mode {bits:04o}); {fix}"
            "chmod go-w it, or choose a directory only you can write",
        )


def private_dir(path: str | os.PathLike[str], exact: bool = False) -> Path:
    """``path``, created 0700 unless it exists and checked as `open_cache_dir` checks a
    private cache: for tierfeed's own state and scratch directories, written by path below
    a directory nobody else can write."""
    os.close(open_cache_dir(path, exact=exact))
    return Path(path)


def open_subdir(dir_fd: int, name: str, mode: int, create: bool = True) -> int:
    """A descriptor of the directory ``name`` in the directory open as ``dir_fd`` (made with
    ``mode`` if missing and ``create``): not through a link, and this user's or root's (in a
    shared sticky cache another user may have made the name first).

    Raises:
        OSError: it cannot be made or opened, is a link (ELOOP), or another user's (EPERM).
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=dir_fd)
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    if os.fstat(fd).st_uid not in (os.geteuid(), 0):
        os.close(fd)
        raise OSError(errno.EPERM, f"{name} belongs to another user")
    return fd


@dataclass(frozen=True)
class CacheFolder:
    """A folder of this user's below a cache directory: the folders ``names`` below ``base``.

    `open` checks ``base`` as a private cache (`open_cache_dir`) and opens each name from the
    descriptor of the one above: a path another user can rename a part of (a directory below
    a group's scratch) is resolved once, and what is used is what was checked.

    Attributes:
        base: the cache directory.
        names: the folders below it, outermost first.
    """

    base: Path
    names: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        """The folder's path, for messages."""
        return self.base.joinpath(*self.names)

    def open(self, *more: str) -> int:
        """A descriptor of the folder, or of the folders ``more`` below it (each made 0700
        if missing, the caller closes it).

        Raises:
            ConfigError: ``base`` or a folder below is a link, another user's, or not a
                directory of this user's (named, with what to do).
            StorageError: one cannot be made or opened.
        """
        fd = open_cache_dir(self.base)
        where = self.base
        try:
            for name in (*self.names, *more):
                where = where / name
                inner = _own_subdir(fd, name, where)
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd


def _own_subdir(dir_fd: int, name: str, path: Path) -> int:
    """`open_subdir` (0700) with its refusals said as errors naming ``path``."""
    try:
        return open_subdir(dir_fd, name, 0o700)
    except OSError as exc:
        _refuse_entry(path, exc, _lstat_at(dir_fd, name), "a directory")


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _refuse_entry(path: Path, exc: OSError, st: os.stat_result | None, kind: str) -> NoReturn:
    """Raise why the entry ``path`` of a checked cache (``st``: its lstat, or the fstat of
    what was opened) cannot be used, once opening it failed with ``exc`` or was refused."""
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise _refuse(
            path,
            f"is a symbolic link (made by uid {st.st_uid}) inside a cache directory, which "
            "tierfeed never follows; remove it (tierfeed makes what belongs there again)",
        ) from None
    if st is not None and st.st_uid != os.geteuid():
        raise _refuse(
            path,
            "belongs to another user, inside a cache directory of yours; remove it "
            "(tierfeed makes what belongs there again)",
            st,
        ) from None
    if st is not None and exc.errno in (errno.ENOTDIR, errno.EISDIR, errno.EPERM):
        raise _refuse(
            path, f"is not {kind}, inside a cache directory; remove it (tierfeed makes it again)"
        ) from None
    raise StorageError(
        f"{path}: cannot be used in a cache directory ({exc.strerror or exc}); check that the "
        "directory is writable, or remove it"
    ) from None


def open_own_file(dir_fd: int, name: str, flags: int, path: Path, mode: int = 0o600) -> int:
    """A descriptor of the file ``name`` in the checked cache directory open as ``dir_fd``
    (``path`` names it in errors), opened with ``flags`` (with ``O_CREAT``: made with
    ``mode`` if missing) never through a link, never blocking on a FIFO, and checked: a
    regular file of this user's that nobody else may write.

    Raises:
        FileNotFoundError: there is none (and ``O_CREAT`` was not given).
        ConfigError: a link, another user's, not a regular file, or writable by others.
        StorageError: it cannot be opened otherwise.
    """
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        _refuse_entry(path, exc, _lstat_at(dir_fd, name), "a file")
    st = os.fstat(fd)
    bad = st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode)
    if bad or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        if bad:
            _refuse_entry(path, OSError(errno.EPERM, "refused"), st, "a file")
        raise _refuse(
            path,
            "is writable by other users, inside a cache directory; remove it (tierfeed "
            "makes it again)",
            st,
        )
    return fd


def list_names(dir_fd: int, files: bool = False) -> list[str]:
    """The names in the directory open as ``dir_fd`` (with ``files``, of what is not a
    directory in it, as a walk lists files), listed through a descriptor of its own:
    `os.listdir` of a descriptor reads through a duplicate that shares its offset, so two
    threads listing one descriptor at once each saw part of the directory (a landing's
    arrivals in flight: one missed, two workers copied its chunk)."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not files:
            return os.listdir(fd)
        with os.scandir(fd) as entries:  # (the entries' types come with the listing)
            return [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
    finally:
        os.close(fd)


@contextlib.contextmanager
def host_lock(folder_fd: int, path: Path, doing: str, wait_s: float) -> Iterator[None]:
    """One process of the host at a time: an exclusive lock on the file ``path`` names in the
    checked cache directory open as ``folder_fd`` (this user's own: another's could be held
    forever), waited for at most ``wait_s``. ``doing`` says what the holder does (``fetching
    the index of s3://...``), for the error when the wait runs out.

    Raises:
        StorageError: the lock cannot be taken, or was held past ``wait_s``.
        ConfigError: the lock file is a link, another user's, or not a regular file.
    """
    try:  # (a refusal, or another error, names the file itself)
        fd = open_own_file(folder_fd, path.name, os.O_RDWR | os.O_CREAT, path)
    except FileNotFoundError as exc:  # the folder was removed meanwhile
        raise StorageError(f"{path}: cannot lock the cache ({exc.strerror})") from None
    try:
        try:
            locked = lock_within(fd, wait_s)
        except OSError as exc:
            raise StorageError(f"{path}: cannot lock ({exc.strerror})") from None
        if not locked:
            raise StorageError(
                f"{path}: another process has been {doing} for {wait_s:.0f} s; if none is "
                "running, remove this file"
            )
        yield
    finally:
        let_go(fd)


def lock_within(fd: int, wait_s: float) -> bool:
    """Take ``fd``'s exclusive lock (flock), polling, since flock has no timeout, for at most
    ``wait_s`` seconds; False if another process held it all that time. The polls are at
    most `LOCK_POLL_MAX_S` apart: the locks polled for are held for a placement decision (a
    scan, a link), so a waiter that slept longer would take the lock long after it was let
    go, and a cold epoch's reads wait for the copies that wait for it (docs/BENCHMARKS.md,
    "The placement lock polled sooner").

    Raises:
        OSError: the lock cannot be taken at all (not a wait).
    """
    deadline, pause = time.monotonic() + wait_s, 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, LOCK_POLL_MAX_S)


def let_go(fd: int) -> None:
    """Unlock, then close ``fd``. A lock belongs to the open file, which a process forked
    while it was held shares: closed alone, it would stay held for as long as that process
    (a DataLoader worker) lives, and every later taker on the host would wait on it."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
