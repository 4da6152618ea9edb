"""Mount-process lifecycle: spawn a FUSE server, wait until it is mounted, unmount, clean up."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tierfeed.errors import StorageError

__all__ = ["FuseProcess", "clear_stale_mount", "is_mounted", "python_argv", "unmount"]


def is_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    """True when ``mountpoint`` is in the mount table (works for a dead FUSE server too)."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as fh:
        return any(line.split()[1] == target for line in fh if len(line.split()) > 1)


def unmount(mountpoint: str | os.PathLike[str], lazy: bool = True) -> None:
    """Unmount a FUSE mount; with ``lazy``, detach it even when files are still open."""
    if not is_mounted(mountpoint):
        return
    done = subprocess.run(["fusermount3", "-u", os.fspath(mountpoint)], capture_output=True)
    if done.returncode != 0 and lazy:
        done = subprocess.run(["fusermount3", "-uz", os.fspath(mountpoint)], capture_output=True)
    if done.returncode != 0 and is_mounted(mountpoint):
        raise StorageError(
            f"{mountpoint}: cannot unmount: {done.stderr.decode().strip()}; "
            f"try `fusermount3 -uz {mountpoint}`"
        )


def clear_stale_mount(mountpoint: str | os.PathLike[str]) -> bool:
    """Lazily unmount a mount whose server died ("Transport endpoint is not connected").

    Returns:
        True if a stale mount was found and removed.
    """
    try:
        os.stat(mountpoint)
        return False
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            return False
    unmount(mountpoint, lazy=True)
    return True


class FuseProcess:
    """A FUSE server in a child process, mounted on enter and unmounted on close.

    Args:
        argv: the server's command line (it must serve in the foreground).
        mountpoint: where it mounts.
        timeout_s: how long to wait for the mount to appear.
    """

    def __init__(
        self, argv: Sequence[str], mountpoint: str | os.PathLike[str], timeout_s: float = 30.0
    ) -> None:
        self.argv = list(argv)
        self.mountpoint = Path(mountpoint)
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> FuseProcess:
        """Spawn the server and wait until the mount is live."""
        clear_stale_mount(self.mountpoint)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + self.timeout_s
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self._stop_and_read_stderr()
                raise StorageError(
                    f"{self.mountpoint}: the FUSE server did not mount within "
                    f"{self.timeout_s:.0f} s: {err or 'no message'}"
                )
            time.sleep(0.02)
        return self

    def _stop_and_read_stderr(self) -> str:
        proc = self.proc
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=10)
        return err.decode(errors="replace").strip()

    def close(self) -> None:
        """Unmount (lazily if busy), stop the server and reap it; idempotent."""
        with contextlib.suppress(StorageError):
            unmount(self.mountpoint)
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None
        clear_stale_mount(self.mountpoint)

    def __enter__(self) -> FuseProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def python_argv(*args: str) -> list[str]:
    """The command line running ``python -m tierfeed ARGS`` with this interpreter."""
    return [sys.executable, "-m", "tierfeed", *args]
