"""A per-file PyTorch loader over the slowed origin, and the same loader over `tierfeed mount`.

Usage:
    python bench/mount_bench.py [--images 3000] [--latency nfs] [--workers 2]

The raw ImageFolder tree and its packed store sit side by side on one slowed origin
(`tierfeed slowfs`). Loader A reads the raw tree through it; loader B, unchanged, reads the
mount of the store (local-disk tier, so epoch 2 is served locally). Origin counters come
from slowfs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from torch.utils.data import DataLoader

from tierfeed.demo import PerFileImageFolder
from tierfeed.format.pack import PackOptions, pack
from tierfeed.fuse.process import FuseProcess
from tierfeed.latency import LatencyModel
from tierfeed.slowfs import SlowFS
from tierfeed.synth import SynthSpec, make_imagefolder


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (0 for none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def epochs(
    root: Path, fs: SlowFS, name: str, workers: int, server: int | None = None
) -> list[dict[str, object]]:
    loader = DataLoader(PerFileImageFolder(root), batch_size=64, shuffle=True, num_workers=workers)
    rows = []
    for epoch in range(2):
        fs.reset()
        cpu0, t0 = cpu_seconds(server), time.perf_counter()
        n = sum(len(x) for x, _ in loader)
        seconds = time.perf_counter() - t0
        s = fs.stats()
        rows.append({"loader": name, "epoch": epoch, "samples_per_s": round(n / seconds, 1),
                     "seconds": round(seconds, 2), "origin_opens": s.opens,
                     "origin_stats": s.stats, "origin_reads": s.reads,
                     "origin_MB": round(s.bytes_read / 1e6, 1),
                     "mount_cpu_s": round(cpu_seconds(server) - cpu0, 2)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--latency", default="nfs")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        origin = work / "origin"
        spec = SynthSpec(classes=20, per_class=args.images // 20, jpeg=True, seed=1)
        make_imagefolder(origin / "raw", spec)
        pack(origin / "raw", origin / "store", PackOptions(chunk_size=64 * 2**20, progress=False))
        slow, mnt = work / "slow", work / "mnt"
        slow.mkdir()
        mnt.mkdir()
        with SlowFS(origin, slow, LatencyModel.parse(args.latency)) as fs:
            epochs(slow / "raw", fs, "per-file on origin", args.workers)
            argv = [sys.executable, "-m", "tierfeed", "mount", str(slow / "store"), str(mnt)]
            argv += ["--foreground", "--disk", str(work / "cache"), "--disk-size", "4GiB"]
            fs.reset()
            with FuseProcess(argv, mnt) as server:
                # The mount reads the index once when it starts: count it apart from the epochs.
                print(json.dumps({"loader": "mount itself", "origin_opens": fs.stats().opens}))
                epochs(mnt, fs, "per-file on mount", args.workers, server.pid)


if __name__ == "__main__":
    main()
