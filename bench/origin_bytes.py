"""Origin bytes per epoch of tierfeed through a disk tier, as the slowed origin counts them.

Issue 16's goals: origin bytes per cold epoch <= 1.02x the store; per warm epoch 0 with a full
cache; with half the cache, <= the half not held. Packs random samples into a store, serves it
through `tierfeed slowfs`, and reads 3 epochs with 2 DataLoader workers and a disk tier of the
whole store's size (``full``) or half of it (``half``); slowfs's own counters (direct I/O, so
no page cache hides a read) give the bytes.

    .venv/bin/python bench/origin_bytes.py [--samples 20000] [--bytes 20000]
        [--chunk-mb 16] [--latency nfs] [--policy clairvoyant]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from bench.peers.common import origin_counters, random_tree  # noqa: E402
from tierfeed.format.pack import PackOptions, pack  # noqa: E402
from tierfeed.latency import LatencyModel  # noqa: E402
from tierfeed.slowfs import SlowFS  # noqa: E402
from tierfeed.slowfs.options import SlowFSOptions  # noqa: E402
from tierfeed.torch import Dataset, Loader, TierConfig  # noqa: E402


def epochs(store: Path, mnt: Path, cache: Path, quota: int, policy: str) -> list[int]:
    """Origin bytes of each of 3 epochs."""
    tiers = TierConfig(disk_dir=str(cache), disk_bytes=quota, policy=policy)
    ds = Dataset(store, "global", batch_size=64, decode=lambda s: len(s.fields["bin"]), tiers=tiers)
    out = []
    with Loader(ds, num_workers=2) as loader:
        for epoch in range(3):
            before = origin_counters(mnt)["bytes_read"]
            loader.set_epoch(epoch)
            for _ in loader:
                pass
            out.append(origin_counters(mnt)["bytes_read"] - before)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--bytes", type=int, default=20000, help="bytes per sample")
    p.add_argument("--chunk-mb", type=int, default=16)
    p.add_argument("--latency", default="nfs")
    p.add_argument("--policy", default="clairvoyant")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        random_tree(base / "raw", args.samples, args.bytes, classes=10)
        store = base / "origin" / "store"
        pack(base / "raw", store, PackOptions(chunk_size=args.chunk_mb * 2**20, progress=False))
        size = sum(f.stat().st_size for f in (store / "chunks").iterdir())
        mnt = base / "mnt"
        mnt.mkdir()
        # direct_io: every read reaches the counters (with the default, re-reads through a
        # descriptor the readers keep open come from the page cache and are never counted).
        options = SlowFSOptions(cache="direct")
        with SlowFS(base / "origin", mnt, LatencyModel.parse(args.latency), options):
            for cache, quota in (("full", size), ("half", size // 2)):
                got = epochs(mnt / "store", mnt, base / f"cache-{cache}", quota, args.policy)
                row = {"cache": cache, "store_bytes": size, "latency": args.latency,
                       "policy": args.policy, "origin_bytes": got,
                       "ratio": [round(b / size, 3) for b in got]}  # fmt: skip
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
