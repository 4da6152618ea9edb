"""MosaicML Streaming's runner for the side-by-side benchmark (see `common.py`).

Usage:
    python bench/peers/run_streaming.py convert --src RAW --out DIR [--size-limit 64mb]
    python bench/peers/run_streaming.py read --data MNT/DIR --slowfs MNT --cache C \
        --cache-bytes B [--epochs 3 --workers 2 --batch 64 --seed 0] --out OUT.jsonl

`convert` writes uncompressed MDS shards with `MDSWriter`; `read` streams them with
`StreamingDataset` (remote = DIR through slowfs, local = C, `cache_limit` = B when B is
smaller than the dataset) and a `StreamingDataLoader`, with Streaming's defaults otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.peers.common import (
    ReadArgs,
    check_epochs,
    counted,
    measure,
    parse_read,
    raw_samples,
    tree_bytes,
)
from bench.peers.common import dataset_bytes as stored_bytes

SYSTEM = "streaming"
COLUMNS = {"jpg": "bytes", "cls": "int"}


class LengthLabelDataset(StreamingDataset):
    """A StreamingDataset whose samples are (length of the JPEG bytes, label)."""

    def __getitem__(self, idx: Any) -> tuple[int, int]:
        sample = super().__getitem__(idx)
        return len(sample["jpg"]), int(sample["cls"])


def convert(src: Path, out: Path, size_limit: str) -> dict[str, Any]:
    """Write the ImageFolder tree ``src`` as MDS shards under ``out``."""
    started = time.perf_counter()
    with MDSWriter(out=str(out), columns=COLUMNS, compression=None, size_limit=size_limit) as w:
        for path, label, _ in raw_samples(src):
            w.write({"jpg": path.read_bytes(), "cls": label})
    seconds = time.perf_counter() - started
    shards = len(json.loads((out / "index.json").read_text())["shards"])
    return {"system": SYSTEM, "convert_s": round(seconds, 3), "bytes": tree_bytes(out),
            "shards": shards}  # fmt: skip


def read(args: ReadArgs) -> None:
    """Read the dataset through slowfs for ``args.epochs`` epochs and record each one."""
    torch.set_num_threads(1)
    # A killed earlier run may have left its state in /dev/shm (it also unlinks a live one's:
    # run one Streaming process at a time).
    clean_stale_shared_memory()
    dataset_bytes = stored_bytes(args.data)
    cache_limit = args.cache_bytes if args.cache_bytes < dataset_bytes else None
    try:
        ds = LengthLabelDataset(remote=args.data, local=str(args.cache), shuffle=True,
                                shuffle_seed=args.seed, batch_size=args.batch,
                                cache_limit=cache_limit)  # fmt: skip
    except ValueError as exc:  # e.g. a cache_limit under 4 x the largest shard
        raise SystemExit(f"streaming: cannot read {args.data}: {exc}") from exc
    loader = StreamingDataLoader(ds, batch_size=args.batch, num_workers=args.workers)
    tallies: list[tuple[int, int]] = []
    extra = {"shards": ds.num_shards, "dataset_bytes": dataset_bytes, "cache_limit": cache_limit,
             "predownload": ds.predownload}  # fmt: skip
    measure(SYSTEM, args, lambda epoch: counted(loader, tallies), extra=extra)
    check_epochs(SYSTEM, tallies, ds.num_samples)


def main(argv: list[str]) -> None:
    if argv[:1] == ["read"]:
        read(parse_read(SYSTEM, argv[1:]))
        return
    p = argparse.ArgumentParser(prog="run_streaming.py convert")
    p.add_argument("command", choices=["convert"])
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--size-limit", default="64mb", help="MDS shard size limit (default 64mb)")
    a = p.parse_args(argv)
    print(json.dumps(convert(a.src, a.out, a.size_limit)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
