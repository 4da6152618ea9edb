"""WebDataset in the side-by-side benchmark: `ShardWriter` tar shards, read by `WebDataset`.

Usage:
    python bench/peers/run_wds.py convert --src RAW --out DIR [--maxsize BYTES]
    python bench/peers/run_wds.py read --data DIR ... (see bench/peers/common.py)

`convert` writes the ImageFolder tree in sorted (class-sorted) order with
`webdataset.ShardWriter` (64 MiB shards by default); the reader shuffles.

`read` is the documented pipeline: `WebDataset(urls, shardshuffle=N, cache_dir, cache_size,
split_by_node, split_by_worker, seed)` -> `.shuffle(1000)` -> (JPEG length, label) ->
`.batched(batch)` -> `WebLoader(batch_size=None)`. Shards are dealt round-robin to the
workers before the shard shuffle, so each epoch yields every sample once; `empty_check=False`
(the option WebDataset's own error message points to) lets a worker without shards yield
nothing when there are fewer shards than workers.

Caching choice: in WebDataset 1.0.2 `FileCache.get_file` returns a plain path or a `file:`
URL unchanged, so `cache_dir` never applies to shards on a (slow) shared file system. The
documented way to have them cached is a `pipe:` URL, here ``pipe:cat PATH``: `FileCache`
copies the shard whole into ``cache_dir`` on first use and opens the local copy afterwards.
Its budget is enforced by `LRUCleanup`, which runs before a download, deletes the oldest
files by ctime (first-in, first-out: a hit does not refresh a file), and once it has deleted
anything sleeps 30 s in that worker; so the cache can exceed ``cache_size`` by the shards
downloaded meanwhile.

DataLoader workers are forked afresh each epoch, so a shuffle seeded once would repeat the
same order every epoch; the pipeline is therefore built per epoch, seeded from (seed, epoch).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import torch
import webdataset as wds

from bench.peers.common import (
    ReadArgs,
    measure,
    parse_read,
    raw_samples,
    run_command,
    tree_bytes,
)

SYSTEM = "webdataset"
PATTERN = "shard-%06d.tar"
SAMPLE_SHUFFLE = 1000


def convert(src: Path, out: Path, maxsize: int) -> None:
    """Write RAW's samples, in sorted order, into tar shards of about ``maxsize`` bytes."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / PATTERN), maxsize=maxsize, verbose=0) as sink:
        for path, label, key in raw_samples(src):
            sample = {"__key__": key.replace("/", "_"), "jpg": path.read_bytes(), "cls": label}
            sink.write(sample)
    seconds = time.perf_counter() - started
    shards = len(list(out.glob("shard-*.tar")))
    print(json.dumps({"system": SYSTEM, "convert_s": round(seconds, 2),
                      "bytes": tree_bytes(out), "shards": shards}))  # fmt: skip


def shard_urls(data: Path) -> list[str]:
    """``pipe:cat PATH`` for every shard under ``data``, so that `FileCache` caches them."""
    paths = sorted(data.glob("shard-*.tar"))
    if not paths:
        raise SystemExit(f"no shard-*.tar in {data}: run `run_wds.py convert` first")
    return [f"pipe:cat {shlex.quote(str(p))}" for p in paths]


def epoch_seed(seed: int, epoch: int) -> int:
    """A seed of its own for every (seed, epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def length_and_label(sample: dict[str, bytes]) -> tuple[int, int]:
    """What every system delivers per sample: the JPEG's length and the label."""
    return len(sample["jpg"]), int(sample["cls"])


def dataset(urls: list[str], args: ReadArgs, epoch: int) -> wds.WebDataset:
    """The samples of one epoch, as dicts, split across nodes and workers, shuffled."""
    seed = epoch_seed(args.seed, epoch)
    ds = wds.WebDataset(
        urls,
        shardshuffle=len(urls),
        cache_dir=str(args.cache),
        cache_size=args.cache_bytes,
        nodesplitter=wds.split_by_node,
        workersplitter=wds.split_by_worker,
        empty_check=False,
        seed=seed,
    )
    return ds.shuffle(SAMPLE_SHUFFLE, seed=seed)


def loader(urls: list[str], args: ReadArgs, epoch: int) -> wds.WebLoader:
    """Batches of (lengths, labels), assembled in the DataLoader workers."""
    batches = dataset(urls, args, epoch).map(length_and_label).batched(args.batch)
    return wds.WebLoader(batches, batch_size=None, num_workers=args.workers)


def read(argv: list[str]) -> None:
    args = parse_read(SYSTEM, argv)
    torch.set_num_threads(1)
    args.cache.mkdir(parents=True, exist_ok=True)
    urls = shard_urls(Path(args.data))
    extra = {"shards": len(urls), "opener": "pipe:cat + FileCache"}
    measure(SYSTEM, args, lambda epoch: loader(urls, args, epoch), extra=extra)


def convert_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="run_wds.py convert")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--maxsize", type=int, default=64 * 2**20, help="bytes per shard")
    return p.parse_args(argv)


def main() -> None:
    def convert_argv(argv: list[str]) -> None:
        a = convert_args(argv)
        convert(a.src, a.out, a.maxsize)

    run_command(convert_argv, read)


if __name__ == "__main__":
    main()
