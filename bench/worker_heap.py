"""What a worker's reads cost when each batch's memory is handed back to the kernel and faulted
in again, against the same reads with the freed heap kept (`tierfeed.torch.workerheap`).

Each child process reads batches of ``--batch`` samples of ``--kb`` KiB (one ``os.pread`` each,
at random offsets of a page-cached file, as `Store.read_samples` reads a warm tier), keeps the
batch, frees it, and goes on to the next; it reports the median µs per read over the batches
after the first. ``default`` leaves glibc's malloc as it is; ``kept`` calls `keep_worker_heap`
first; ``reused`` reads into one buffer (no allocation: the copy alone). Modes alternate, each
in a fresh process, ``--runs`` times:

    .venv/bin/python bench/worker_heap.py [--kb 64] [--batch 64] [--batches 200] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src")]

MODES = ("default", "kept", "reused")


def child(mode: str, path: str, kb: int, batch: int, batches: int) -> float:
    """Median µs per read of ``batches`` batches (the first left out) in this process."""
    if mode == "kept":
        from tierfeed.torch.workerheap import keep_worker_heap

        assert keep_worker_heap(), "'kept' needs glibc's malloc, untuned by the environment"
    size = kb * 1024
    fd = os.open(path, os.O_RDONLY)
    end = os.fstat(fd).st_size - size
    rng = random.Random(0)
    buf = bytearray(size)
    per_read = []
    for _ in range(batches):
        offsets = [rng.randrange(0, end) for _ in range(batch)]
        started = time.perf_counter()
        if mode == "reused":
            for offset in offsets:
                os.preadv(fd, [buf], offset)
        else:
            held = [os.pread(fd, size, offset) for offset in offsets]
            del held  # the batch is done with: its memory freed
        per_read.append((time.perf_counter() - started) / batch * 1e6)
    os.close(fd)
    return statistics.median(per_read[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kb", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(child(a.child, a.file, a.kb, a.batch, a.batches))
        return
    # What makes tierfeed leave malloc alone (`worker_heap_wanted`): cleared for the children.
    tuning = ("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD", "TIERFEED_WORKER_HEAP")
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuning)}
    results: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "data")
        path.write_bytes(os.urandom(64 * 2**20))  # written: in the page cache
        for _ in range(a.runs):
            for mode in MODES:
                sizes = ["--kb", str(a.kb), "--batch", str(a.batch), "--batches", str(a.batches)]
                argv = [sys.executable, __file__, "--child", mode, "--file", str(path), *sizes]
                done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
                results[mode].append(round(float(done.stdout), 2))
    print(json.dumps({"kb": a.kb, "batch": a.batch, "us_per_read": results}))


if __name__ == "__main__":
    main()
