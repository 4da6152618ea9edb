"""AWS's s3torchconnector in the object-store benchmark (`bench/s3_compare.py`): one object per
sample, read with its `S3MapDataset` and a torch DataLoader.

Usage:
    python bench/peers/run_s3torch.py convert --src RAW --out DIR
    python bench/peers/run_s3torch.py read --data s3://BUCKET/PREFIX ... (see bench/peers/common.py)

`convert` lays the ImageFolder tree out as the objects its users upload: every JPEG as it is,
at ``<class>/<file>.jpg`` (hard links where the file system allows, else copies). `read` lists
the prefix with ``S3MapDataset.from_prefix`` and reads one whole object per sample through the
connector's CRT client (its sequential reader, the default for datasets), pointed at
``AWS_ENDPOINT_URL``. It has no cache of its own (``--cache`` stays empty): every epoch gets
every object again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from s3torchconnector import S3ClientConfig, S3MapDataset, S3Reader, S3ReaderConstructor
from torch.utils.data import DataLoader

from bench.peers.common import (
    check_epochs,
    counted,
    is_url,
    measure,
    parse_read,
    raw_samples,
    run_command,
    tree_bytes,
)

SYSTEM = "s3torchconnector"
REGION = "us-east-1"


def convert(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="run_s3torch.py convert")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    started = time.perf_counter()
    objects = 0
    for path, _, _ in raw_samples(a.src):
        target = a.out / path.relative_to(a.src)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:  # another file system, or no hard links there
            shutil.copy2(path, target)
        objects += 1
    seconds = time.perf_counter() - started
    print(json.dumps({"system": SYSTEM, "convert_s": round(seconds, 2),
                      "bytes": tree_bytes(a.out), "objects": objects}))  # fmt: skip


class LengthAndLabel:
    """The dataset's transform: read the whole object and deliver what every system delivers
    per sample, the JPEG's length and the label (the index of its class folder)."""

    def __init__(self, classes: list[str]) -> None:
        self.labels = {name: i for i, name in enumerate(classes)}

    def __call__(self, reader: S3Reader) -> tuple[int, int]:
        data = reader.read()
        return len(data), self.labels[reader.key.rsplit("/", 2)[-2]]


def read(argv: list[str]) -> None:
    args = parse_read(SYSTEM, argv)
    if not is_url(args.data):
        raise SystemExit(f"{SYSTEM}: reads only from S3 (an s3:// URL), not {args.data}")
    torch.set_num_threads(1)
    # The benchmark's S3 endpoint (the slowed proxy, plain http on loopback), from the variable
    # the other SDKs read, given as the connector's own `endpoint`; buckets addressed by path,
    # as moto's server and the proxy expect.
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    prefix = args.data.rstrip("/") + "/"  # not also s3://bucket/<name>.converted.json etc.
    config = S3ClientConfig(force_path_style=True)
    # The labels are the class folders' indices: from a first listing, whose items are lazy
    # readers (no GET until read; the listing gave their sizes, so no HEAD either).
    index = S3MapDataset.from_prefix(prefix, region=REGION, endpoint=endpoint,
                                     s3client_config=config)  # fmt: skip
    classes = sorted({index[i].key.rsplit("/", 2)[-2] for i in range(len(index))})
    # The map-style dataset, not S3IterableDataset: the README's way to random access, and the
    # one a DataLoader shuffles globally every epoch, as it does the per-file loader's (the
    # iterable one yields the listing in its order, each worker a slice of it with
    # enable_sharding). One whole-object GET per sample, in the worker that asked for it, with
    # the sequential reader (the README's choice for reading whole objects).
    ds = S3MapDataset.from_prefix(prefix, region=REGION, endpoint=endpoint,
                                  transform=LengthAndLabel(classes), s3client_config=config,
                                  reader_constructor=S3ReaderConstructor.sequential())  # fmt: skip
    len(ds)  # its own listing, in this process before the workers fork: not in epoch 1
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        generator=generator)  # fmt: skip
    tallies: list[tuple[int, int]] = []
    extra = {"dataset_samples": len(ds), "classes": len(classes)}
    measure(SYSTEM, args, lambda epoch: counted(loader, tallies), extra=extra)
    check_epochs(SYSTEM, tallies, len(ds))


def main() -> None:
    run_command(convert, read)


if __name__ == "__main__":
    main()
