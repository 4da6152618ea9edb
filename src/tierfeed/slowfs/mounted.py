"""SlowFS: a slowed mount served by a child process, for tests, benchmarks and demos."""

from __future__ import annotations

import os
import sys
from dataclasses import fields
from pathlib import Path
from types import TracebackType

from tierfeed.errors import StorageError
from tierfeed.fuse.process import FuseProcess
from tierfeed.latency import LatencyModel
from tierfeed.slowfs.options import SlowFSOptions
from tierfeed.slowfs.stats import STATS_PATH, SlowFSStats

__all__ = ["SlowFS", "latency_spec"]


def latency_spec(model: LatencyModel) -> str:
    """The ``--latency`` text that parses back to exactly ``model``."""
    return ",".join(f"{f.name}={getattr(model, f.name)!r}" for f in fields(model))


class SlowFS:
    """SRC mounted read-only at MOUNTPOINT through ``tierfeed slowfs``, slowed by ``model``.

    The server runs as a child process (``python -m tierfeed slowfs ...``) so that its
    FUSE threads never compete with the caller's GIL. Use as a context manager::

        with SlowFS(src, tmp_path / "mnt", LatencyModel.parse("nfs")) as fs:
            data = (fs.mountpoint / "a.jpg").read_bytes()
            print(fs.stats().opens)

    Args:
        src: source directory, never modified.
        mountpoint: an existing empty directory.
        model: latency model (default: no delay, a plain pass-through).
        options: kernel caching and threading (default ``SlowFSOptions()``).
        stats_file: the server writes its final counters there as JSON at unmount.
        ready_timeout: seconds to wait for the mount to come up.
    """

    def __init__(
        self,
        src: str | os.PathLike[str],
        mountpoint: str | os.PathLike[str],
        model: LatencyModel | None = None,
        options: SlowFSOptions | None = None,
        *,
        stats_file: str | os.PathLike[str] | None = None,
        ready_timeout: float = 30.0,
    ) -> None:
        self.src = Path(src)
        self.mountpoint = Path(mountpoint)
        self.model = model or LatencyModel()
        self.options = options or SlowFSOptions()
        self.stats_file = Path(stats_file) if stats_file is not None else None
        self._baseline = SlowFSStats()
        self._process = FuseProcess(
            self.argv(),
            self.mountpoint,
            ready=self._answers,
            ready_timeout=ready_timeout,
            name="tierfeed slowfs",
        )

    def argv(self) -> list[str]:
        """The server's command line."""
        argv = [sys.executable, "-m", "tierfeed", "slowfs", os.fspath(self.src)]
        argv += [os.fspath(self.mountpoint), "--latency", latency_spec(self.model)]
        argv += self.options.to_argv()
        if self.stats_file is not None:
            argv += ["--stats-file", os.fspath(self.stats_file)]
        return argv

    @property
    def pid(self) -> int | None:
        """Process id of the server (None when not running)."""
        return self._process.pid

    @property
    def stats_path(self) -> Path:
        """The live counters file inside the mount."""
        return self.mountpoint / STATS_PATH.lstrip("/")

    def _answers(self) -> bool:
        try:
            return self.stats_path.is_file()
        except OSError:
            return False

    def start(self) -> SlowFS:
        """Start the server and wait until the mount answers.

        Raises:
            StorageError: it did not come up; the message quotes the server's output.
        """
        self._process.start()
        return self

    def total_stats(self) -> SlowFSStats:
        """Counters since the mount came up."""
        try:
            return SlowFSStats.from_json(self.stats_path.read_bytes())
        except OSError as exc:
            raise StorageError(
                f"cannot read slowfs counters at {self.stats_path}: {exc}; "
                f"server output:\n{self._process.output().strip()}"
            ) from None

    def stats(self) -> SlowFSStats:
        """Counters since the last ``reset()`` (since the start when never reset)."""
        return self.total_stats() - self._baseline

    def reset(self) -> SlowFSStats:
        """Start counting from zero for ``stats()``; returns the totals at this point."""
        self._baseline = self.total_stats()
        return self._baseline

    def close(self) -> int | None:
        """Unmount (lazily if busy), stop and reap the server; safe to call twice.

        Returns:
            The server's exit code, None when it was never started.
        """
        return self._process.close()

    def __enter__(self) -> SlowFS:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
