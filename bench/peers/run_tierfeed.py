"""tierfeed in the side-by-side benchmark: `tierfeed pack`, then its Dataset and Loader.

Usage:
    python bench/peers/run_tierfeed.py convert --src RAW --out DIR
    python bench/peers/run_tierfeed.py read --data DIR ... (see bench/peers/common.py)

The store is read through a local-disk tier of ``--cache-bytes`` (clairvoyant placement fed the
plan), shared by the DataLoader workers; batches are assembled in the workers.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from bench.peers.common import measure, parse_read, run_command, tree_bytes
from tierfeed.format.pack import PackOptions, pack
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, TierConfig


def convert(src: Path, out: Path) -> None:
    started = time.perf_counter()
    report = pack(src, out, PackOptions(chunk_size=64 * 2**20, progress=False))
    seconds = time.perf_counter() - started
    print(json.dumps({"system": "tierfeed", "convert_s": round(seconds, 2),
                      "bytes": tree_bytes(out), "chunks": report.chunks}))  # fmt: skip


def length_and_label(sample: Sample) -> tuple[int, int]:
    """What every system delivers per sample: the JPEG's length and the label."""
    return len(sample.fields["jpg"]), sample.label


def read(argv: list[str]) -> None:
    args = parse_read("tierfeed", argv)
    torch.set_num_threads(1)
    tiers = TierConfig(disk_dir=str(args.cache), disk_bytes=args.cache_bytes)
    ds = Dataset(args.data, "global", batch_size=args.batch, decode=length_and_label, tiers=tiers)
    loader = Loader(ds, num_workers=args.workers)

    def epoch_batches(epoch: int) -> Any:
        loader.set_epoch(epoch)
        return loader

    with loader:
        measure("tierfeed", args, epoch_batches)


def main() -> None:
    def convert_argv(argv: list[str]) -> None:
        convert(Path(argv[argv.index("--src") + 1]), Path(argv[argv.index("--out") + 1]))

    run_command(convert_argv, read)


if __name__ == "__main__":
    main()
