"""A chunk open the server never answers: how long until `StuckReadError`, how long `close()`.

    python bench/stuck_open.py [--hard-timeout 4] [--rounds 3] [--workers 0 2]

Packs a 400-file store (8 chunks), serves it through `tests.storage.faultyfs` with every open
of one chunk left unanswered (the kernel holds the opening thread until the mount goes away, as
a hung NFS server would), and reads it with `Dataset(deadline=DeadlineOptions(hard_timeout_s=
...))` through a `Loader` of 0 and 2 workers, without tiers and with a RAM tier. Prints, per
run, the seconds from the start of the epoch to the error, and those `Loader.close()` took.
Must run as root with fuse3 (it mounts); the bound under test is also asserted, with slack, by
tests/hostile/test_stuck_reads.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.storage.faultyfs, run as a module from the root

from tests.format.conftest import write_tree  # noqa: E402
from tierfeed.errors import StuckReadError  # noqa: E402
from tierfeed.format.pack import PackOptions, pack  # noqa: E402
from tierfeed.fuse.process import FuseProcess  # noqa: E402
from tierfeed.loader import DeadlineOptions  # noqa: E402
from tierfeed.torch import Dataset, Loader, TierConfig  # noqa: E402


def one_run(mnt: Path, workers: int, ram: bool, bound: float) -> tuple[float, float]:
    tiers = TierConfig(ram_bytes=64 << 20) if ram else None
    deadline = DeadlineOptions(hard_timeout_s=bound)
    ds = Dataset(mnt, batch_size=16, deadline=deadline, tiers=tiers)
    loader = Loader(ds, num_workers=workers)
    started = time.monotonic()
    try:
        for _ in loader:
            pass
        raise SystemExit("the epoch ended without StuckReadError: the stall did not happen")
    except StuckReadError:
        raised = time.monotonic() - started
    started = time.monotonic()
    loader.close()
    return raised, time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hard-timeout", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = p.parse_args()
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory(prefix="stuck-open-") as tmp:
        work = Path(tmp)
        files = {f"c{i % 4}/{i:03d}.bin".encode(): bytes([i % 256]) * 3000 for i in range(400)}
        write_tree(work / "tree", files)
        pack(work / "tree", work / "store", PackOptions(chunk_size=200_000, progress=False))
        print(f"hard timeout {args.hard_timeout:g} s; {args.rounds} rounds")
        for workers in args.workers:
            for ram in (False, True):
                raised, closed = [], []
                for _ in range(args.rounds):
                    mnt = Path(tempfile.mkdtemp(dir=work))
                    argv = [sys.executable, "-m", "tests.storage.faultyfs", str(work / "store")]
                    with FuseProcess([*argv, str(mnt), "--fault=stall:000003.tar:1000"], mnt):
                        r, c = one_run(mnt, workers, ram, args.hard_timeout)
                    raised.append(r)
                    closed.append(c)
                print(
                    f"workers={workers} tiers={'ram' if ram else 'none':4}  "
                    f"error after {' '.join(f'{x:.2f}' for x in raised)} s "
                    f"(median {statistics.median(raised):.2f})  "
                    f"close {' '.join(f'{x:.2f}' for x in closed)} s "
                    f"(median {statistics.median(closed):.2f})"
                )


if __name__ == "__main__":
    main()
