"""What a pack keeps at its destination while it runs: the lock, and the journal of finished
chunks that lets an interrupted pack resume; clearing what a pack leaves behind (what it
replaces is cleared as the destination is claimed: `tierfeed.format.storetarget`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from tierfeed.errors import PackError
from tierfeed.publish import is_temporary

__all__ = [
    "JOURNAL",
    "LOCK",
    "append_journal",
    "lock_destination",
    "read_journal",
    "remove_leftovers",
    "unlock_destination",
]

JOURNAL = ".tierfeed-pack.journal"
LOCK = ".tierfeed-pack.lock"
_LOCK_TRIES = 3  # takes of the lock file another writer removed meanwhile


def lock_destination(dst: Path) -> int:
    """Hold the destination's lock file: one pack or Writer at a time per destination (the
    kernel drops the lock if the process dies). Returns the descriptor; `unlock_destination`
    lets it go.

    Raises:
        PackError: another pack or Writer holds it.
        OSError: the lock file cannot be created.
    """
    for _ in range(_LOCK_TRIES):
        fd = os.open(dst / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PackError(
                f"{dst}: another tierfeed writer (a `tierfeed pack` or a Writer) is writing "
                "here; wait for it"
            ) from None
        # The writer before this one removes the file it held as it lets it go: a lock taken
        # on that file, opened just before, locks nothing. Hold the file the name holds now.
        try:
            if os.stat(dst / LOCK).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise PackError(f"{dst}: other tierfeed writers keep taking this destination; try again")


def unlock_destination(dst: Path, fd: int) -> None:
    """Let the lock `lock_destination` took go, its file removed first: a finished store
    keeps no lock file (a writer killed before this leaves one, which the next takes)."""
    with contextlib.suppress(OSError):
        os.unlink(dst / LOCK)
    with contextlib.suppress(OSError):
        os.close(fd)


def remove_leftovers(dst: Path, num_chunks: int) -> None:
    """Remove partial chunks (temporaries: under the lock no one else writes here) and chunks
    beyond this pack's count (from an earlier pack)."""
    for path in (dst / "chunks").iterdir():
        stem = path.name.split(".", 1)[0]
        beyond = path.name.endswith(".tar") and stem.isdigit() and int(stem) >= num_chunks
        if beyond or is_temporary(path.name):
            path.unlink()


def read_journal(dst: Path) -> dict[int, dict[str, Any]]:
    """The journal's entries by chunk number (none when there is no journal)."""
    entries: dict[int, dict[str, Any]] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in (dst / JOURNAL).read_text().splitlines():
            try:
                entry = json.loads(line)
                entries[int(entry["chunk"])] = entry
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line from an interrupted run
    return entries


def append_journal(dst: Path, entry: dict[str, Any]) -> None:
    """Record a finished chunk in the journal, durably, before the next one is written."""
    with open(dst / JOURNAL, "a") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
