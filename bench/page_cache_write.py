"""What writing a chunk's bytes into fresh page-cache pages costs on this machine.

A cold epoch lands every chunk it copies in the disk tier: one buffered write of the store's
bytes into new files (`tierfeed.storage.filelanding`). This writes ``--mib`` MiB in 4 MiB
pieces (a copy's piece) into a new file under ``--dir``, ``--trials`` times, each file removed
after, and prints the seconds of each write: the first in a fresh process takes pages the
kernel has not handed out lately; later ones reuse the pages the earlier file freed. On a
virtual machine the first can cost ten times the later ones (the host backs each page on its
first touch); the CPU seconds are the writer's, beside whatever else the epoch does.

With ``--pause S``, each trial waits S seconds first: on a virtual machine that gives freed
memory back to its host (virtio-balloon free page reporting), the pages the last file freed
are gone again by then, as they are between two runs of a benchmark, and every trial pays the
first touch.

Usage:
    python bench/page_cache_write.py [--dir /tmp] [--mib 128] [--trials 3] [--pause 0]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

_PIECE = 4 * 2**20


def write_once(directory: str, mib: int, piece: bytes) -> tuple[float, float]:
    """Seconds and CPU seconds of writing ``mib`` MiB into a new file (removed after)."""
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(mib * 2**20 // _PIECE):
            os.pwrite(fd, piece, i * _PIECE)
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--pause", type=float, default=0.0, help="seconds to wait before each trial")
    a = p.parse_args()
    piece = os.urandom(_PIECE)
    for trial in range(a.trials):
        time.sleep(a.pause)
        wall, cpu = write_once(a.dir, a.mib, piece)
        print(f"trial {trial}: {a.mib} MiB in {wall:.3f} s ({cpu:.3f} CPU s)", flush=True)


if __name__ == "__main__":
    main()
