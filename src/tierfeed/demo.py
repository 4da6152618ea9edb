"""`make demo`: a per-file PyTorch loader against tierfeed, both on a slowed heavy-tailed origin.

Generates an ImageFolder dataset of real JPEGs with ImageNet-like sizes, packs it, serves both
trees through ``tierfeed slowfs`` (the same seeded latency model with a heavy tail), runs two
epochs of (a) a plain per-file Dataset + DataLoader and (b) tierfeed, prints a side-by-side
table and a verdict per epoch, writes the report PNG and says where its data lies. Epochs are
numbered from 1, as in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from tierfeed.format.codecs import open_image
from tierfeed.format.pack import PackOptions, pack
from tierfeed.latency import LatencyModel
from tierfeed.loader import DeadlineOptions, PrefetchOptions
from tierfeed.slowfs import SlowFS
from tierfeed.storage.store import Sample
from tierfeed.synth import SynthSpec, make_imagefolder
from tierfeed.telemetry import EpochMeter, RunRecorder
from tierfeed.telemetry.report import draw_report
from tierfeed.torch import Dataset, Loader, TierConfig
from tierfeed.units import human

__all__ = ["main"]

SIDE = 64  # decoded images are scaled down in the JPEG decoder (draft mode): I/O dominates


def decode_jpeg(data: bytes) -> torch.Tensor:
    """JPEG bytes -> a SIDE x SIDE uint8 CHW tensor."""
    with open_image(data, "jpg") as img:
        img.draft("RGB", (SIDE, SIDE))
        small = img.convert("RGB").resize((SIDE, SIDE))
    return torch.from_numpy(np.asarray(small, dtype=np.uint8).copy()).permute(2, 0, 1)


class PerFileImageFolder(TorchDataset[tuple[torch.Tensor, int]]):
    """What most training scripts do: one open and read per file, straight from the tree."""

    def __init__(self, root: Path) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [
            (str(path), label)
            for label, c in enumerate(classes)
            for path in sorted((root / c).iterdir())
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with open(path, "rb") as fh:
            return decode_jpeg(fh.read()), label


def tierfeed_decode(sample: Sample) -> tuple[torch.Tensor, int]:
    """A store sample -> (image tensor, label)."""
    return decode_jpeg(sample.fields["jpg"]), sample.label


def _timed_epochs(
    name: str,
    epochs: int,
    run: Callable[[int], Iterable[Any]],
    fs: SlowFS,
    rec: RunRecorder,
    tiers: Callable[[], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for epoch in range(epochs):
        fs.reset()
        meter = EpochMeter(epoch + 1)  # the loader counts from 0; people and BENCHMARKS from 1
        asked = time.perf_counter()
        for images, _ in run(epoch):
            meter.batch(len(images), time.perf_counter() - asked)
            asked = time.perf_counter()
        s = fs.stats()
        meter.extra = {
            "system": name,
            "origin": {"opens": s.opens, "stats": s.stats, "reads": s.reads, "bytes": s.bytes_read},
            # Reads served per tier; a per-file loader reads everything from the origin.
            "tiers": tiers() if tiers is not None else {"origin": {"hits": s.reads}},
        }
        record = meter.record()
        rec.write(record)
        rows.append(record)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'loader':<10} {'epoch':>5} {'samples/s':>10} {'p50 wait':>9} {'p99.99 wait':>12} "
    head += f"{'origin opens':>13} {'origin reads':>13} {'origin MB':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        w, o = r["batch_wait"], r["origin"]
        lines.append(
            f"{r['system']:<10} {r['epoch']:>5} {r['samples_per_s']:>10,.0f} "
            f"{w['p50'] * 1e3:>7.1f}ms {w['p99.99'] * 1e3:>10.1f}ms {o['opens']:>13,} "
            f"{o['reads']:>13,} {o['bytes'] / 1e6:>10.1f}"
        )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """One line per epoch from the measured records: tierfeed's samples/s as a multiple of the
    per-file loader's, and how many times fewer opens reached the origin."""
    by = {(r["system"], r["epoch"]): r for r in rows}
    lines = []
    for epoch in sorted(e for system, e in by if system == "tierfeed"):
        tf, per_file = by[("tierfeed", epoch)], by.get(("per-file", epoch))
        if per_file is None:
            continue
        speed = tf["samples_per_s"] / max(per_file["samples_per_s"], 1e-9)
        opens_tf, opens_pf = tf["origin"]["opens"], per_file["origin"]["opens"]
        fewer = (
            f"{opens_pf / opens_tf:,.0f}× fewer origin opens ({opens_tf:,} against {opens_pf:,})"
            if opens_tf
            else f"no origin opens (the per-file loader: {opens_pf:,})"
        )
        lines.append(
            f"epoch {epoch}: {speed:.1f}× the per-file loader ({tf['samples_per_s']:,.0f} against "
            f"{per_file['samples_per_s']:,.0f} samples/s), {fewer}"
        )
    return lines


def disk_usage(root: Path) -> int:
    """Bytes of disk that the files under ``root`` take (symlinks not followed)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # vanished while walking: it takes no space
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def _where_the_data_lies(work: Path) -> str:
    size = human(disk_usage(work))
    how = f"`rm -rf {work}`"
    if work == Path("demo-data").absolute() and Path("Makefile").is_file():
        how = f"`make clean` (which removes .venv too) or {how}"
    return (
        f"demo data: {size} in {work} (the JPEGs, their store, the disk cache, run records); "
        f"remove it with {how}"
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="tierfeed demo: per-file loader vs tierfeed")
    parser.add_argument(
        "--workdir", default="demo-data", help="where the data goes (default demo-data)"
    )
    parser.add_argument("--images", type=int, default=3000, help="JPEGs to make (default 3000)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per loader (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="loader workers (default 2)")
    parser.add_argument("--latency", default="heavy-tail", help="slowfs latency model")
    return parser.parse_args(argv)


def _make_store(raw: Path, store: Path, images: int) -> None:
    """The JPEG tree (made once, kept between demos) and its store (packed anew)."""
    spec = SynthSpec(classes=20, per_class=max(1, images // 20), jpeg=True, seed=1)
    if (
        not (raw / "class_000").exists()
        or len(list((raw / "class_000").iterdir())) != spec.per_class
    ):
        shutil.rmtree(raw, ignore_errors=True)
        print(f"generating {spec.classes * spec.per_class} JPEGs (ImageNet-like sizes) in {raw}")
        make_imagefolder(raw, spec, progress=True)
    shutil.rmtree(store, ignore_errors=True)
    report = pack(raw, store, PackOptions(chunk_size=32 * 2**20))
    print(f"packed {report.samples} images into {report.chunks} chunks in {report.seconds:.1f} s")


def _tierfeed_loader(store: Path, cache: Path, workers: int) -> Loader:
    """tierfeed over the slowed store: a RAM and a disk tier, hedged reads, many threads."""
    shutil.rmtree(cache, ignore_errors=True)  # a cold start for every demo
    ds = Dataset(
        store,
        "global",
        batch_size=64,
        decode=tierfeed_decode,
        # Many threads: a read stuck behind a stalled open or lookup blocks its thread.
        prefetch=PrefetchOptions(window=256, threads=64),
        deadline=DeadlineOptions(hedge_after_ms=0),  # hedge a late read at its deadline
        tiers=TierConfig(ram_bytes=256 * 2**20, disk_dir=str(cache), disk_bytes=2 * 2**30),
    )
    return Loader(ds, num_workers=workers)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    args = _arguments(argv)
    work = Path(args.workdir).absolute()
    origin = work / "origin"
    _make_store(origin / "raw", origin / "store", args.images)
    model = LatencyModel.parse(args.latency)
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    run_file = work / "run.jsonl"
    run_file.unlink(missing_ok=True)
    rows: list[dict[str, Any]] = []
    with SlowFS(origin, mnt, model) as fs, RunRecorder(run_file, {"demo": True}) as rec:
        print(f"origin served through slowfs ({args.latency}: {model})")
        per_file = PerFileImageFolder(mnt / "raw")
        loader = DataLoader(per_file, batch_size=64, shuffle=True, num_workers=args.workers)
        rows += _timed_epochs("per-file", args.epochs, lambda e: loader, fs, rec)
        tf = _tierfeed_loader(mnt / "store", work / "cache", args.workers)

        def tierfeed_epoch(epoch: int) -> Loader:
            tf.set_epoch(epoch)
            return tf

        def tier_hits() -> dict[str, Any]:
            return tf.last_epoch["tiers"] if tf.last_epoch else {}

        with tf:
            rows += _timed_epochs("tierfeed", args.epochs, tierfeed_epoch, fs, rec, tier_hits)
    print()
    print(_table(rows))
    png = draw_report([run_file], work / "report.png")
    print(f"\nrun records: {run_file}\nreport: {png}")
    print("\nverdict:")
    for line in verdict(rows):
        print(f"  {line}")
    print(_where_the_data_lies(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
