"""A file's open that hangs is made again by a reader waiting for it (issue 45): the reads of
the file wait a bounded time, the reader threads are not all held by one stalled open, and
the first open to end is kept (the other's descriptor closed)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tierfeed.storage import files
from tierfeed.storage.files import FdCache

pytestmark = pytest.mark.timeout(30)


class Hanging(FdCache):
    """Opens of ``path`` hang while ``hang`` holds tries left; each other open is plain."""

    def __init__(self, hang: int) -> None:
        super().__init__()
        self.hang, self.started, self.release = hang, 0, threading.Event()
        self.fds: list[int] = []
        self._count = threading.Lock()

    def _open_file(self, path: str) -> int:
        with self._count:
            self.started += 1
            hangs = self.started <= self.hang
        if hangs:
            assert self.release.wait(20)
        fd = super()._open_file(path)
        self.fds.append(fd)
        return fd


def _reader(cache: FdCache, path: str, out: list[object]) -> threading.Thread:
    def run() -> None:
        entry = cache.acquire(path)
        out.append(entry)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_hung_open_is_made_again_and_the_first_to_end_is_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "chunk")
    Path(path).write_bytes(b"x" * 100)
    cache = Hanging(hang=1)
    first: list[object] = []
    hung = _reader(cache, path, first)  # its open hangs
    time.sleep(0.05)
    waited: list[object] = []
    started = time.monotonic()
    _reader(cache, path, waited).join(10)
    took = time.monotonic() - started
    assert waited and took < files._OPEN_AGAIN_S + 2  # not until the hung open ends
    cache.release.set()  # the hung open ends now: its descriptor is closed, the kept one used
    hung.join(10)
    assert first[0] is waited[0] and cache.started == 2 and cache.opens == 2
    kept = waited[0].fd  # type: ignore[attr-defined]
    closed = [fd for fd in cache.fds if fd != kept]
    assert len(closed) == 1
    with pytest.raises(OSError):
        os.fstat(closed[0])  # closed (nothing else opened meanwhile to reuse the number)
    cache.close()


def test_opens_of_one_file_are_bounded_while_every_one_hangs(tmp_path: Path) -> None:
    path = str(tmp_path / "chunk")
    Path(path).write_bytes(b"x" * 100)
    cache = Hanging(hang=100)
    out: list[object] = []
    readers = [_reader(cache, path, out) for _ in range(8)]
    time.sleep(3 * files._OPEN_AGAIN_S + 1.0)  # time for every try the bound allows
    assert cache.started == files._OPEN_TRIES  # not one open per waiting reader
    cache.release.set()
    for thread in readers:
        thread.join(10)
    assert len(out) == 8 and len({id(e) for e in out}) == 1  # one descriptor for all
    cache.close()
