"""What every system's runner shares: its command line, and one way to measure an epoch.

A runner is `python bench/peers/run_<system>.py convert --src RAW --out DIR` (the system's own
conversion tool, on local disk) and `python bench/peers/run_<system>.py read --data DIR ...`
(the system's own loader, reading DIR through `tierfeed slowfs`). Every runner builds an
iterable of batches per epoch and hands it to `measure`, so that every figure of every system
is taken the same way: batch waits in the consumer, origin counters from slowfs, peak RSS of
the process and its workers, bytes in the local cache directory.

Every system delivers, per sample, the length of its JPEG bytes and its label: the same
(trivial) work after the bytes arrive, so the comparison is of the data path, not of decoding.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierfeed.slowfs.stats import SlowFSStats
from tierfeed.telemetry import batch_len

STATS = ".slowfs/stats.json"
COUNTERS = ("opens", "stats", "reads", "bytes_read")


@dataclass(frozen=True)
class ReadArgs:
    """What `read` is told: the same for every system in a run."""

    data: str  # the system's converted dataset: under the slowfs mountpoint, or an s3:// URL
    slowfs: str  # the slowfs mountpoint, or the slowed S3 proxy's URL (counters per epoch)
    cache: Path  # a local directory the system may cache in (empty at the start)
    cache_bytes: int  # the local cache budget
    epochs: int
    workers: int
    batch: int
    seed: int
    out: Path  # JSON lines, one per epoch


def read_parser(system: str) -> argparse.ArgumentParser:
    """The `read` command line every runner accepts."""
    p = argparse.ArgumentParser(prog=f"run_{system}.py read")
    p.add_argument("--data", required=True, help="a directory, or an s3:// URL")
    p.add_argument("--slowfs", required=True, help="a slowfs mountpoint, or an S3 proxy's URL")
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--cache-bytes", type=int, required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    return p


def parse_read(system: str, argv: list[str]) -> ReadArgs:
    a = read_parser(system).parse_args(argv)
    return ReadArgs(a.data, a.slowfs, a.cache, a.cache_bytes, a.epochs, a.workers, a.batch,
                    a.seed, a.out)  # fmt: skip


def origin_counters(slowfs: str | Path) -> dict[str, int]:
    """slowfs's counters since it was mounted, or a slowed S3 proxy's (tests/s3proxy.py): its
    HEADs as stats, GETs as reads, the bytes of their bodies."""
    where = str(slowfs)
    if where.startswith("http"):
        with urllib.request.urlopen(f"{where}/__proxy__/counters", timeout=10) as answer:
            proxy = json.loads(answer.read())
        return {"opens": 0, "stats": proxy["heads"], "reads": proxy["gets"],
                "bytes_read": proxy["bytes_out"]}  # fmt: skip
    stats = SlowFSStats.from_json((Path(where) / STATS).read_bytes())
    return {k: int(getattr(stats, k)) for k in COUNTERS}


def is_url(data: str | Path) -> bool:
    return str(data).startswith("s3://")


def dataset_bytes(data: str) -> int:
    """Bytes of a converted dataset: a directory's files, or the objects under a URL."""
    if not is_url(data):
        return tree_bytes(Path(data))
    import fsspec

    fs, root = fsspec.core.url_to_fs(data)
    return int(fs.du(root))


def random_tree(root: Path, samples: int, nbytes: int, classes: int) -> None:
    """``samples`` files of ``nbytes`` random bytes in ``classes`` folders under ``root``."""
    for i in range(samples):
        folder = root / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{i:06d}.bin").write_bytes(os.urandom(nbytes))


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (the local cache's size)."""
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):  # removed by an eviction meanwhile
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _peak_rss_mb() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return round(own, 1), round(children, 1)


def measure(
    system: str,
    args: ReadArgs,
    epoch_batches: Callable[[int], Iterable[Any]],
    extra: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Iterate ``epoch_batches(epoch)`` for every epoch and write one JSON line per epoch.

    Batch wait = time from asking for the next batch to having it (what a training step
    waits for); the first batch's (``first_batch_ms``) counts from asking for the epoch's
    iterator, its start-up included. Origin counters are slowfs's deltas over the epoch.
    """
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as out:
        for epoch in range(args.epochs):
            before = origin_counters(args.slowfs)
            waits: list[float] = []
            samples = 0
            started = asked = time.perf_counter()
            for batch in epoch_batches(epoch):
                now = time.perf_counter()
                waits.append(now - asked)
                samples += batch_len(batch)
                asked = time.perf_counter()
            seconds = time.perf_counter() - started
            after = origin_counters(args.slowfs)
            w = np.asarray(waits) * 1e3 if waits else np.zeros(1)
            own, children = _peak_rss_mb()
            row = {
                "system": system, "epoch": epoch, "samples": samples,
                "seconds": round(seconds, 3), "samples_per_s": round(samples / seconds, 1),
                "wait_p50_ms": round(float(np.percentile(w, 50)), 2),
                "wait_p99_ms": round(float(np.percentile(w, 99)), 2),
                "wait_p9999_ms": round(float(np.percentile(w, 99.99)), 2),
                "wait_max_ms": round(float(w.max()), 2),
                "first_batch_ms": round(float(w[0]), 2),
                # The guard's bound is on the batches after the first (start-up is its own).
                "wait_max_after_first_ms": round(float(w[1:].max()) if len(w) > 1 else 0.0, 2),
                "wait_p99_after_first_ms": round(
                    float(np.percentile(w[1:], 99)) if len(w) > 1 else 0.0, 2
                ),
                **{f"origin_{k}": after[k] - before[k] for k in COUNTERS},
                "peak_rss_mb": own, "peak_rss_children_mb": children,
                "cache_bytes": tree_bytes(args.cache),
                **(extra or {}),
            }  # fmt: skip
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)
    return rows


def raw_samples(src: Path) -> list[tuple[Path, int, str]]:
    """The ImageFolder tree's files in sorted order: (path, label, key 'class/name')."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    out = []
    for label, cls in enumerate(classes):
        for f in sorted((src / cls).iterdir()):
            out.append((f, label, f"{cls}/{f.stem}"))
    return out


def run_command(convert: Callable[[list[str]], None], read: Callable[[list[str]], None]) -> None:
    """A runner's entry point: ``convert ...`` or ``read ...`` from the command line."""
    command, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "convert":
        convert(rest)
    elif command == "read":
        read(rest)
    else:
        raise SystemExit(f"unknown command {command!r}: convert or read")


def counted(loader: Iterable[Any], tallies: list[tuple[int, int]]) -> Iterator[Any]:
    """Yield ``loader``'s batches (JPEG lengths first), appending (samples, JPEG bytes) of the
    epoch to ``tallies``."""
    samples = jpg_bytes = 0
    for batch in loader:
        samples += len(batch[0])
        jpg_bytes += int(batch[0].sum())
        yield batch
    tallies.append((samples, jpg_bytes))


def check_epochs(system: str, tallies: list[tuple[int, int]], expected: int) -> None:
    """Fail unless every epoch delivered ``expected`` samples and the same bytes in all."""
    counts = {samples for samples, _ in tallies}
    sums = {jpg_bytes for _, jpg_bytes in tallies}
    if counts != {expected} or len(sums) != 1:
        raise SystemExit(f"{system}: epochs delivered (samples, JPEG bytes) {tallies}, "
                         f"expected {expected} samples and equal bytes in every epoch")  # fmt: skip
