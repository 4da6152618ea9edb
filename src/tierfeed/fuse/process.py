"""Run a FUSE server as a child process: spawn, wait until mounted, unmount, clean up stale mounts.

Generic over the server: `tierfeed mount` and slowfs both use it; what is particular to
one of them (which mounts are tierfeed's own, target checks) stays in that package.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import IO, NamedTuple

from tierfeed.errors import StorageError

__all__ = [
    "FuseProcess",
    "MountEntry",
    "cleanup_stale_mount",
    "fuse_mount_type",
    "is_mounted",
    "is_stale_mount",
    "mount_entry",
    "unmount",
]

_MOUNTINFO = "/proc/self/mountinfo"
_POLL_S = 0.02
_OCTAL = re.compile(r"\\([0-7]{3})")
# A dead FUSE server leaves its mountpoint answering these to every access.
_STALE_ERRNOS = {errno.ENOTCONN, errno.ECONNABORTED}
# The one-line error a tierfeed CLI child prints before exiting 1 (see cli.main).
_CHILD_ERROR = re.compile(r"^tierfeed [\w-]+: error: (.+)$", re.MULTILINE)


class MountEntry(NamedTuple):
    """The topmost mount at a path, as the mount table shows it."""

    id: int
    fstype: str  # e.g. ``fuse.slowfs``, ``tmpfs``
    source: str  # the file system's name (FUSE's fsname), e.g. ``tierfeed:/data/store``


def _normalize(path: str | os.PathLike[str]) -> str:
    # realpath() of a stale mountpoint itself can fail, so resolve its parent only.
    absolute = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(absolute)
    return os.path.join(os.path.realpath(parent), name) if name else absolute


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_entry(path: str | os.PathLike[str]) -> MountEntry | None:
    """The topmost mount at exactly ``path`` (stale FUSE mounts included), or None."""
    target = _normalize(path)
    found = None
    with open(_MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            parts = left.split()
            if len(parts) >= 5 and _unescape(parts[4]) == target:
                fields = right.split()
                fstype = fields[0] if fields else ""
                source = _unescape(fields[1]) if len(fields) > 1 else ""
                found = MountEntry(int(parts[0]), fstype, source)
    return found


def fuse_mount_type(path: str | os.PathLike[str]) -> str | None:
    """File system type of the topmost mount at exactly ``path`` (e.g. ``fuse.slowfs``), or None."""
    top = mount_entry(path)
    return top.fstype if top is not None else None


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """True when something is mounted at exactly ``path``, stale FUSE mounts included.

    Unlike ``os.path.ismount`` this reads the mount table, so it also sees a mount whose
    server died (where every ``stat`` fails with ENOTCONN).
    """
    return fuse_mount_type(path) is not None


def is_stale_mount(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a FUSE mount whose server is gone (ENOTCONN on every access)."""
    kind = fuse_mount_type(path)
    if kind is None or not kind.startswith("fuse"):
        return False
    try:
        # Not stat(): the kernel may answer it from cached attributes for a while after
        # the server died; opening the directory always needs the server.
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY))
    except OSError as exc:
        return exc.errno in _STALE_ERRNOS
    return False


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))


def unmount(path: str | os.PathLike[str], *, lazy: bool = True, timeout: float = 10.0) -> None:
    """Unmount the FUSE mount at ``path``; nothing to do when nothing is mounted there.

    Tries ``fusermount3 -u`` first; when the mount is busy (open files, a cwd inside)
    and ``lazy`` is set, detaches it with ``fusermount3 -uz`` (then ``umount -l``): the
    name is free at once and the kernel drops the mount when its last user lets go.

    Raises:
        StorageError: the mount is still there afterwards.
    """
    target = _normalize(path)
    if not is_mounted(target):
        return
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
    attempts = [[fusermount, "-u", target]]
    if lazy:
        attempts += [[fusermount, "-uz", target], ["umount", "-l", target]]
    messages = []
    for argv in attempts:
        result = _run(argv, timeout)
        if not is_mounted(target):
            return
        messages.append(f"{' '.join(argv)}: {(result.stderr or result.stdout).strip()}")
    raise StorageError(f"cannot unmount {target}: " + "; ".join(messages))


def cleanup_stale_mount(path: str | os.PathLike[str]) -> bool:
    """Lazily unmount a dead FUSE server's mount at ``path`` so the directory is usable again.

    Safe to call before every mount: a live mount or a plain directory is left alone.

    Returns:
        True when a stale mount was found and removed.
    """
    if not is_stale_mount(path):
        return False
    unmount(path, lazy=True)
    return True


class FuseProcess:
    """A FUSE server running as a child process, mounted at ``mountpoint`` until ``close()``.

    The child must serve in the foreground and unmount itself on SIGTERM (libfuse does).
    Its stdout and stderr go to a temporary file, quoted in errors.

    Args:
        argv: the server's command line.
        mountpoint: where the server mounts; a stale mount there is cleaned up first.
        ready: extra readiness check, called once the mount table shows the mount.
        ready_timeout: seconds to wait for the mount before giving up.
        name: how errors name the server.
        detachable: start the server in its own session, so that `detach()` can leave it
            serving after this process exits (``tierfeed mount`` without --foreground).
    """

    def __init__(
        self,
        argv: Sequence[str],
        mountpoint: str | os.PathLike[str],
        *,
        ready: Callable[[], bool] | None = None,
        ready_timeout: float = 30.0,
        name: str = "FUSE server",
        detachable: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.mountpoint = _normalize(mountpoint)
        self.name = name
        self._ready = ready
        self._ready_timeout = ready_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._detachable = detachable

    @property
    def pid(self) -> int | None:
        """Process id of the server, None before ``start()``."""
        return self._proc.pid if self._proc is not None else None

    def output(self) -> str:
        """Everything the server wrote to stdout and stderr so far (the last 8 KiB)."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - 8192))
        return self._log.read().decode(errors="replace")

    def wait(self, timeout: float) -> int:
        """Wait for the server to exit by itself (after a signal or an unmount).

        Returns:
            Its exit code.

        Raises:
            StorageError: it was not started, or still runs after ``timeout`` seconds.
        """
        if self._proc is None:
            raise StorageError(f"{self.name} at {self.mountpoint} is not running")
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise StorageError(f"{self.name} still runs after {timeout} s") from None

    def start(self) -> FuseProcess:
        """Spawn the server and wait until its mount is live.

        Raises:
            StorageError: the server exited, or did not mount within ``ready_timeout``;
                the message quotes its output.
        """
        if self._proc is not None:
            raise StorageError(f"{self.name} at {self.mountpoint} was already started")
        cleanup_stale_mount(self.mountpoint)
        if is_mounted(self.mountpoint):
            raise StorageError(f"{self.mountpoint} is already a mountpoint; unmount it first")
        # Kept open for the server's whole life and closed in close(), hence no `with`.
        self._log = tempfile.TemporaryFile(prefix="tierfeed-fuse-")  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=self._detachable,
        )
        try:
            self._wait_mounted(self._proc)
        except BaseException:
            self.close()
            raise
        return self

    def _wait_mounted(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self._ready_timeout
        while True:
            code = proc.poll()
            if code is not None:
                raise StorageError(self._exit_message(code))
            if is_mounted(self.mountpoint) and (self._ready is None or self._ready()):
                return
            if time.monotonic() > deadline:
                raise StorageError(
                    f"{self.name} did not mount {self.mountpoint} within "
                    f"{self._ready_timeout:.0f} s; its output:\n{self.output().strip()}"
                )
            time.sleep(_POLL_S)

    def _exit_message(self, code: int) -> str:
        """Why the server exited before mounting: its own one-line error when it printed one
        (a tierfeed CLI child), else its whole output."""
        output = self.output().strip()
        said = _CHILD_ERROR.findall(output)
        if said:
            return f"{said[-1]} ({self.name} could not mount {self.mountpoint})"
        return f"{self.name} exited with code {code} before mounting {self.mountpoint}:\n{output}"

    def detach(self) -> None:
        """Leave the server serving on its own; `unmount` (or SIGTERM) stops it later."""
        if not self._detachable:
            raise StorageError(f"{self.name} was not started detachable")
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self, grace: float = 2.0) -> int | None:
        """Unmount (lazily when busy), stop the server, reap it; safe to call twice.

        Args:
            grace: seconds the server gets to exit by itself after the unmount before
                SIGTERM (then SIGKILL). One still serving files held open across a lazy
                unmount only exits on the signal.

        Returns:
            The server's exit code (None when it was never started).
        """
        proc, self._proc = self._proc, None
        code: int | None = None
        try:
            if proc is None:
                return None
            # A dead server leaves a stale mount or none; a live mount there is then a
            # successor's (mount ids are reused, so they cannot tell) and is left alone.
            if proc.poll() is None or is_stale_mount(self.mountpoint):
                unmount(self.mountpoint, lazy=True)
            code = _reap(proc, grace)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
        return code

    def __enter__(self) -> FuseProcess:
        return self.start() if self._proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _reap(proc: subprocess.Popen[bytes], grace: float) -> int:
    # After the unmount the server's loop ends by itself; SIGTERM, then SIGKILL, if not.
    for stop in (None, proc.terminate, proc.kill):
        if stop is not None:
            stop()
        try:
            return proc.wait(timeout=grace if stop is None else 5.0)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()
