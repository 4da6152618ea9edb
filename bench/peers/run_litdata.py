"""LitData in the side-by-side benchmark: `litdata.optimize`, then its StreamingDataset and
StreamingDataLoader.

Usage:
    python bench/peers/run_litdata.py convert --src RAW --out DIR
    python bench/peers/run_litdata.py read --data DIR ... (see bench/peers/common.py)

The converted directory is read as a network drive (``local:`` URL, LitData's documented way
to stream from a shared mount): its chunks are copied into ``--cache`` and read from there,
with ``max_cache_size=--cache-bytes`` as LitData's eviction budget.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import litdata
import torch

from bench.peers.common import is_url, measure, parse_read, raw_samples, run_command, tree_bytes

SYSTEM = "litdata"


def jpeg_and_label(item: tuple[str, int]) -> dict[str, Any]:
    """`optimize`'s fn: one sample, the JPEG's bytes as they are (not decoded) and its label."""
    path, label = item
    with open(path, "rb") as fh:
        return {"jpg": fh.read(), "label": label}


def chunk_count(out: str | Path) -> int:
    """Chunks listed in the converted dataset's index.json (a directory or a URL)."""
    if is_url(out):
        import fsspec

        with fsspec.open(f"{out}/index.json") as index:
            return len(json.loads(index.read())["chunks"])
    return len(json.loads((Path(out) / "index.json").read_text())["chunks"])


def convert(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="run_litdata.py convert")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    inputs = [(str(path), label) for path, label, _ in raw_samples(a.src)]
    started = time.perf_counter()
    litdata.optimize(fn=jpeg_and_label, inputs=inputs, output_dir=str(a.out),
                     chunk_bytes="64MB", num_workers=2, verbose=False)  # fmt: skip
    seconds = time.perf_counter() - started
    print(json.dumps({"system": SYSTEM, "convert_s": round(seconds, 2),
                      "bytes": tree_bytes(a.out), "chunks": chunk_count(a.out)}))  # fmt: skip


def length_and_label(item: dict[str, Any]) -> tuple[int, int]:
    """What every system delivers per sample: the JPEG's length and the label."""
    return len(item["jpg"]), int(item["label"])


def check_epochs(rows: list[dict[str, Any]], expected: int) -> None:
    """Fail if an epoch did not deliver every sample exactly once by count."""
    short = [(row["epoch"], row["samples"]) for row in rows if row["samples"] != expected]
    if short:
        raise SystemExit(f"litdata delivered (epoch, samples) {short}, expected {expected} each")


def read(argv: list[str]) -> None:
    args = parse_read(SYSTEM, argv)
    torch.set_num_threads(1)
    if is_url(args.data) and os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        # The benchmark's S3 endpoint is plain http on loopback; LitData's obstore path (what
        # its users get from real S3, over https) refuses http unless told.
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS,
                                              "allow_http": "true"}  # fmt: skip
    ds = litdata.StreamingDataset(
        # A network drive: cached, not read in place (an s3:// URL: the SDK's own endpoint).
        input_dir=args.data if is_url(args.data) else "local:" + str(Path(args.data).resolve()),
        cache_dir=str(args.cache),
        shuffle=True,
        seed=args.seed,
        max_cache_size=args.cache_bytes,
        transform=length_and_label,
    )
    loader = litdata.StreamingDataLoader(ds, batch_size=args.batch, num_workers=args.workers)
    # The loader advances its own epoch (and the dataset's shuffle) on every iter().
    extra = {"dataset_samples": len(ds), "chunks": chunk_count(args.data)}
    rows = measure(SYSTEM, args, lambda epoch: loader, extra=extra)
    check_epochs(rows, len(ds))


def main() -> None:
    run_command(convert, read)


if __name__ == "__main__":
    main()
