"""Many-core scaling of the fast path: samples/s of tierfeed's Loader at 1, 2, 4, 8, 14 workers,
bytes only and with CPU decode, against a per-file DataLoader and a plain DataLoader over
`open_store`, from a slowed origin (cold: epoch 1) and warm (epoch 2), in one run.

The origin is slowed in process (`tierfeed.storage.SlowDriver` under a latency model, the
same for every loader: a file's open and read pay it). Generates ImageNet-like JPEGs in
parallel and packs them; also the setup `bench/device_check.py` uses.

    PYTHONPATH=src python bench/scaling.py --images 2000 --workers 1,2 --out scaling.json
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import PackOptions, pack
from tierfeed.latency import LatencyModel, LatencySampler
from tierfeed.loader.compose import TierConfig, tier_stack
from tierfeed.storage import PosixDriver, SlowDriver
from tierfeed.storage.store import Sample, Store
from tierfeed.torch import Dataset, ImageDecoder, ImageTransform, Loader, collate_images
from tierfeed.torch.decoders import pil_image

LATENCY = "median_ms=2,sigma=0.5,bandwidth_mbps=400"  # a shared file system's, per operation
TRAIN = ImageTransform(size=224, crop="random", flip=True)


def _one_jpeg(args: tuple[Path, int, int]) -> int:
    from PIL import Image

    path, seed, quality = args
    rng = np.random.default_rng(seed)
    w, h = int(rng.integers(360, 500)), int(rng.integers(300, 400))
    # Smooth colour fields plus noise: compresses like a photo (ImageNet's ~110 KB median).
    base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR)
    pixels = np.asarray(img, dtype=np.int16) + rng.integers(-40, 40, (h, w, 3), dtype=np.int16)
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    path.write_bytes(out.getvalue())
    return len(out.getvalue())


def make_jpegs(root: Path, images: int, classes: int = 100, processes: int | None = None) -> int:
    """An ImageFolder tree of ``images`` JPEGs under ``root``, made in parallel; its bytes."""
    for c in range(classes):
        (root / f"n{c:05d}").mkdir(parents=True, exist_ok=True)
    jobs = [(root / f"n{i % classes:05d}" / f"img{i:06d}.JPEG", i, 85) for i in range(images)]
    with multiprocessing.get_context("fork").Pool(processes or os.cpu_count()) as pool:
        return sum(pool.imap_unordered(_one_jpeg, jobs, chunksize=64))


def make_store(root: Path, images: int, processes: int | None = None) -> tuple[Path, Path, int]:
    """``(tree, store, bytes)``: generated JPEGs and their packed store, under ``root``."""
    tree, store = root / "tree", root / "store"
    nbytes = make_jpegs(tree, images, processes=processes)
    pack(tree, store, PackOptions(chunk_size=64 * 2**20, progress=False))
    return tree, store, nbytes


@dataclass(frozen=True)
class SlowOpener:
    """A store whose origin is slowed by ``latency``, read through a disk tier at ``cache``
    (none when None): picklable, so each worker opens its own."""

    store: str
    cache: str | None
    latency: str = LATENCY

    def __call__(self) -> Store:
        index = Index(Path(self.store) / INDEX_NAME, lazy=True)
        origin = SlowDriver(
            PosixDriver(self.store, read_only=True), LatencyModel.parse(self.latency)
        )
        tiers = TierConfig(disk_dir=self.cache) if self.cache else TierConfig()
        return Store(index, tier_stack(index, tiers, origin))


def nbytes_and_label(sample: Sample) -> tuple[int, int]:
    """The bytes-only decode: what every loader hands over per sample, without decoding."""
    return sum(len(v) for v in sample.fields.values()), sample.label


class PerFile(TorchDataset[Any]):
    """The per-file baseline: each sample is a file of the tree, opened and read through the
    same latency model (an open and a read), as torchvision's ImageFolder reads them."""

    def __init__(self, tree: Path, decode: bool, latency: str = LATENCY) -> None:
        classes = sorted(p.name for p in tree.iterdir() if p.is_dir())
        self.files = [
            (f, c) for c, name in enumerate(classes) for f in sorted((tree / name).iterdir())
        ]
        self.decode, self.latency = decode, latency
        self._sampler: LatencySampler | None = None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        if self._sampler is None:  # one per process, made after the fork
            self._sampler = LatencySampler(LatencyModel.parse(self.latency))
        path, label = self.files[i]
        time.sleep(self._sampler.delay())
        data = path.read_bytes()
        time.sleep(self._sampler.delay(len(data)))
        return (pil_image(data, TRAIN), label) if self.decode else (len(data), label)


class OverStore(TorchDataset[Any]):
    """The plain baseline: a map-style dataset over `open_store` (one sample per index)."""

    def __init__(self, opener: SlowOpener, decode: Callable[[Sample], Any]) -> None:
        self.opener, self.decode = opener, decode
        self.n = len(Index(Path(opener.store) / INDEX_NAME))
        self._store: Store | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self._store is None:
            self._store = self.opener()
        return self.decode(self._store.read_sample(i))


def timed_epochs(
    make: Callable[[], Iterable[Any]], epochs: int, limit_s: float
) -> list[dict[str, float]]:
    """Samples/s of ``epochs`` epochs of the iterable ``make()`` returns (one iterable for all
    epochs); an epoch past ``limit_s`` is cut there and its rate taken over what it read."""
    loader = make()
    out = []
    try:
        for epoch in range(epochs):
            n, start = 0, time.perf_counter()
            for batch in loader:
                n += len(batch[1])
                if time.perf_counter() - start > limit_s:
                    break
            seconds = time.perf_counter() - start
            out.append(
                {"epoch": epoch, "samples": n, "seconds": seconds, "samples_per_s": n / seconds}
            )
    finally:
        close = getattr(loader, "close", None)
        if callable(close):
            close()
    return out


def collate_pairs(batch: list[tuple[Any, int]]) -> tuple[Any, torch.Tensor]:
    if isinstance(batch[0][0], torch.Tensor):
        return collate_images(batch)
    return [x for x, _ in batch], torch.tensor([y for _, y in batch])


def scaling_point(
    system: str,
    mode: str,
    workers: int,
    tree: Path,
    store: Path,
    cache: Path,
    batch: int,
    limit_s: float,
) -> list[dict[str, float]]:
    """One row: ``system`` (tierfeed, per-file, over-store) reading ``mode`` (bytes, decode)
    with ``workers`` workers: a cold epoch (empty ``cache``) and a warm one."""
    decode: Callable[[Sample], Any] = nbytes_and_label if mode == "bytes" else ImageDecoder(TRAIN)
    opener = SlowOpener(str(store), str(cache))
    extra: dict[str, Any] = {"prefetch_factor": 4} if workers else {}
    if system == "tierfeed":
        collate = collate_images if mode == "decode" else collate_pairs

        def make() -> Any:
            ds = Dataset(opener, plan="global", batch_size=batch, decode=decode, collate=collate)
            return Loader(ds, num_workers=workers, **extra)
    else:

        def make() -> Any:
            ds: Any = (
                PerFile(tree, mode == "decode")
                if system == "per-file"
                else OverStore(opener, decode)
            )
            return DataLoader(
                ds,
                batch_size=batch,
                shuffle=True,
                num_workers=workers,
                collate_fn=collate_pairs,
                persistent_workers=workers > 0,
                **extra,
            )

    return timed_epochs(make, 2, limit_s)


def scaling(
    tree: Path,
    store: Path,
    workers: list[int],
    modes: list[str],
    systems: list[str],
    batch: int,
    limit_s: float,
    record: Callable[[dict[str, Any]], None],
) -> None:
    """Every (mode, system, workers) point, each with a fresh cache; ``record`` gets each row."""
    for mode in modes:
        for system in systems:
            for w in workers:
                with tempfile.TemporaryDirectory(prefix="tf-scaling-") as cache:
                    try:
                        epochs = scaling_point(
                            system, mode, w, tree, store, Path(cache), batch, limit_s
                        )
                    except Exception as exc:  # one point's failure is a row, not the end
                        record({"mode": mode, "system": system, "workers": w, "error": repr(exc)})
                        continue
                record({"mode": mode, "system": system, "workers": w,
                        "cold": epochs[0]["samples_per_s"], "warm": epochs[1]["samples_per_s"],
                        "epochs": epochs})  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The scaling rows as a text table (samples/s; x1: the same system's 1-worker warm rate)."""
    lines = [
        f"{'mode':7} {'system':10} {'workers':>7} {'cold/s':>9} {'warm/s':>9} {'vs 1 worker':>11}"
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"{r['mode']:7} {r['system']:10} {r['workers']:>7} error: {r['error'][:60]}"
            )
            continue
        one = [x for x in rows if x.get("warm") and x["mode"] == r["mode"]
               and x["system"] == r["system"] and x["workers"] in (0, 1)]  # fmt: skip
        ratio = f"{r['warm'] / one[0]['warm']:.2f}x" if one else "-"
        lines.append(f"{r['mode']:7} {r['system']:10} {r['workers']:>7} {r['cold']:>9.0f} "
                     f"{r['warm']:>9.0f} {ratio:>11}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--workers", default="1,2", help="e.g. 1,2,4,8,14")
    p.add_argument("--modes", default="bytes,decode")
    p.add_argument("--systems", default="tierfeed,per-file,over-store")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--limit-s", type=float, default=60.0, help="bound of one epoch")
    p.add_argument("--data", type=Path, help="reuse this directory (tree/ and store/)")
    p.add_argument("--out", type=Path, default=Path("scaling.json"))
    a = p.parse_args(argv)
    root = a.data or Path(tempfile.mkdtemp(prefix="tf-scaling-data-"))
    if not (root / "store" / INDEX_NAME).exists():
        make_store(root, a.images)
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        a.out.write_text(json.dumps({"rows": rows, "images": a.images}, indent=1))
        print(json.dumps({k: v for k, v in row.items() if k != "epochs"}), file=sys.stderr)

    scaling(root / "tree", root / "store", [int(w) for w in a.workers.split(",")],
            a.modes.split(","), a.systems.split(","), a.batch, a.limit_s, record)  # fmt: skip
    print(table(rows))


if __name__ == "__main__":
    main()
