"""The device check of issue 36: a ResNet-50 training loop fed by tierfeed, against its ceiling.

Generates ImageNet-like JPEGs, packs them, serves them from an origin slowed in process
(`tierfeed.storage.SlowDriver`; not FUSE, which a container seldom has), and trains (bf16
autocast, channels_last, SGD) on batches from: synthetic uint8 tensors already on the device
(the ceiling), tierfeed with CPU decode in the workers, tierfeed with the JPEG bytes decoded on
the device (`DeviceJpegDecoder`), and a per-file torchvision ImageFolder + DataLoader; each for
a cold epoch and a warm one, every epoch bounded in time. Then bench/scaling.py's table. Every
input is uint8 on the device and normalized inside the step, the same work for every row.
Prints one table and writes JSON after every row, so a run stopped by its time bound (or by
SIGTERM) still leaves what it measured.

    bash bench/device_check.sh                       # the device: ~20,000 images, < 8 minutes
    PYTHONPATH=src python bench/device_check.py --cpu --tiny --out tiny.json   # CI, on CPU
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from bench.scaling import (  # noqa: E402
    SlowOpener,
    collate_pairs,
    make_store,
    scaling,
)
from bench.scaling import table as scaling_table  # noqa: E402
from tierfeed.torch import (  # noqa: E402
    IMAGENET_MEAN,
    IMAGENET_STD,
    Dataset,
    DeviceJpegDecoder,
    DevicePrefetcher,
    ImageDecoder,
    ImageTransform,
    JpegBytes,
    Loader,
    collate_images,
    collate_jpegs,
)
from tierfeed.torch.decoders import pil_image, torchvision_io  # noqa: E402


class StopError(Exception):
    """The run's time is up (SIGTERM or the budget)."""


class Tiny(nn.Module):
    """A small CNN: the same loop as the ResNet-50 in CI, on the CPU."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out


class Trainer:
    """One model, its optimizer, and the step every row times."""

    def __init__(self, device: torch.device, tiny: bool, classes: int) -> None:
        if tiny:
            model: nn.Module = Tiny(classes)
        else:
            import torchvision.models  # type: ignore[import-not-found,unused-ignore]

            model = torchvision.models.resnet50(weights=None, num_classes=classes)
        self.device = device
        self.model = model.to(device, memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        self.cuda = device.type == "cuda"

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x = ((x.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def epoch(self, batches: Iterable[Any], limit_s: float, deadline: float) -> dict[str, Any]:
        """Train on ``batches`` until they end, ``limit_s`` passes or ``deadline``: images/s,
        the data wait per step (host time blocked on the next batch), the GPU busy share."""
        waits: list[float] = []
        spans: list[Any] = []
        n, start = 0, time.perf_counter()
        asked = start
        for x, y in batches:
            waits.append(time.perf_counter() - asked)
            if self.cuda:
                begin, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                begin.record()
                self.step(x, y)
                end.record()
                spans.append((begin, end))
            else:
                t = time.perf_counter()
                self.step(x, y)
                spans.append(time.perf_counter() - t)
            n += len(y)
            asked = time.perf_counter()
            if asked - start > limit_s or asked > deadline:
                break
        self.sync()
        wall = time.perf_counter() - start
        busy = sum(s if isinstance(s, float) else s[0].elapsed_time(s[1]) / 1e3 for s in spans)
        waits_ms = sorted(w * 1e3 for w in waits[1:]) or [0.0]  # the first: the start-up
        return {
            "images": n, "seconds": wall, "images_per_s": n / wall if wall else 0.0,
            "steps": len(waits), "first_batch_s": waits[0] if waits else None,
            "wait_mean_ms": statistics.fmean(waits_ms),
            "wait_p99_ms": waits_ms[min(len(waits_ms) - 1, int(0.99 * len(waits_ms)))],
            "gpu_busy": busy / wall if wall else 0.0, "step_ms": 1e3 * busy / max(1, len(spans)),
        }  # fmt: skip


def ceiling(trainer: Trainer, batch: int, size: int, classes: int, steps: int) -> dict[str, Any]:
    """Synthetic uint8 batches already on the device: what the step alone allows."""
    x = torch.randint(0, 255, (batch, 3, size, size), dtype=torch.uint8, device=trainer.device)
    y = torch.randint(0, classes, (batch,), device=trainer.device)
    for _ in range(3):
        trainer.step(x, y)  # warm-up: kernels chosen, memory allocated
    return trainer.epoch(((x, y) for _ in range(steps)), float("inf"), float("inf"))


def feeders(a: argparse.Namespace, tree: Path, store: Path, cache: Path, device: torch.device,
            transform: ImageTransform) -> list[tuple[str, Callable[[], Any]]]:  # fmt: skip
    """(row name, a function making its loader of device batches), in the order they run."""
    opener = SlowOpener(str(store), str(cache))
    rows: list[tuple[str, Callable[[], Any]]] = []
    for w in a.workers:

        def cpu(w: int = w) -> Any:
            ds = Dataset(opener, batch_size=a.batch, decode=ImageDecoder(transform),
                         collate=collate_images, drop_last=True)  # fmt: skip
            return DevicePrefetcher(Loader(ds, num_workers=w, prefetch_factor=4), device)

        rows.append((f"tierfeed cpu-decode w={w}", cpu))

    def gpu() -> Any:
        torchvision_io()  # the row is skipped, with the reason, where torchvision is absent
        ds = Dataset(opener, batch_size=a.batch, decode=JpegBytes(), collate=collate_jpegs,
                     drop_last=True)  # fmt: skip
        decoder = DeviceJpegDecoder(transform, device, store=ds.store)
        loader = Loader(ds, num_workers=a.gpu_decode_workers, prefetch_factor=4)
        return DevicePrefetcher(loader, device, on_device=decoder)

    rows.append((f"tierfeed gpu-decode w={a.gpu_decode_workers}", gpu))

    def per_file() -> Any:
        from tierfeed.latency import LatencyModel, LatencySampler

        sampler = LatencySampler(LatencyModel.parse(opener.latency))

        def load(path: str) -> torch.Tensor:
            time.sleep(sampler.delay())
            data = Path(path).read_bytes()
            time.sleep(sampler.delay(len(data)))
            return pil_image(data, transform)

        import torchvision.datasets  # type: ignore[import-not-found,unused-ignore]

        ds = torchvision.datasets.ImageFolder(str(tree), loader=load)
        w = max(a.workers)
        loader = DataLoader(
            ds,
            batch_size=a.batch,
            shuffle=True,
            num_workers=w,
            collate_fn=collate_pairs,
            drop_last=True,
            persistent_workers=True,
            prefetch_factor=4,
        )
        return DevicePrefetcher(loader, device)

    rows.append((f"per-file ImageFolder w={max(a.workers)}", per_file))
    return rows


def summary(result: dict[str, Any]) -> str:
    """The one table: each row's epochs, against the ceiling."""
    top = result.get("ceiling", {}).get("images_per_s") or 0.0
    step = result.get("ceiling", {}).get("step_ms") or 0.0
    lines = [f"device: {result['device']}; origin: {result['origin']}; images: {result['images']}",
             f"{'row':30} {'epoch':>5} {'img/s':>8} {'% ceil':>7} {'wait ms':>8} "
             f"{'p99 ms':>8} {'p99/step':>8} {'busy':>6}"]  # fmt: skip
    if top:
        lines.append(f"{'synthetic on device (ceiling)':30} {'-':>5} {top:>8.0f} {'100%':>7}"
                     f"{'':>27}{result['ceiling']['gpu_busy']:>7.0%}")  # fmt: skip
    for row in result["rows"]:
        if "error" in row:
            lines.append(f"{row['name']:30} {row['error'][:80]}")
            continue
        for e in row["epochs"]:
            pct = f"{e['images_per_s'] / top:.0%}" if top else "-"
            p99 = f"{e['wait_p99_ms'] / step:.0%}" if step else "-"
            lines.append(f"{row['name']:30} {e['epoch']:>5} {e['images_per_s']:>8.0f} {pct:>7} "
                         f"{e['wait_mean_ms']:>8.1f} {e['wait_p99_ms']:>8.1f} {p99:>8} "
                         f"{e['gpu_busy']:>6.0%}")  # fmt: skip
    if result["scaling"]:
        lines += ["", "scaling (samples/s, from the slowed origin: cold = epoch 1, warm = 2)",
                  scaling_table(result["scaling"])]  # fmt: skip
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="run on the CPU (the same code path)")
    p.add_argument("--tiny", action="store_true", help="a tiny CNN on 500 small images (CI)")
    p.add_argument("--images", type=int, help="default 20000 (--tiny: 500)")
    p.add_argument("--batch", type=int, help="default 256 (--tiny: 32)")
    p.add_argument("--workers", help="CPU-decode rows' workers, default 8,14 (--tiny: 2)")
    p.add_argument("--gpu-decode-workers", type=int, help="default 4 (--tiny: 1)")
    p.add_argument("--scaling-workers", help="default 1,2,4,8,14 (--tiny: 1,2)")
    p.add_argument("--scaling-images", type=int, help="default 4000 (--tiny: 200)")
    p.add_argument("--epoch-s", type=float, help="bound of one epoch, default 45 (--tiny: 20)")
    p.add_argument("--budget-s", type=float, default=420.0, help="the whole run's bound")
    p.add_argument("--data", type=Path, help="working directory (default: a temporary one)")
    p.add_argument("--out", type=Path, default=Path("device_check.json"))
    a = p.parse_args(argv)
    tiny = a.tiny
    a.images = a.images or (500 if tiny else 20000)
    a.batch = a.batch or (32 if tiny else 256)
    a.workers = [int(w) for w in (a.workers or ("2" if tiny else "8,14")).split(",")]
    a.gpu_decode_workers = a.gpu_decode_workers or (1 if tiny else 4)
    a.scaling_workers = [
        int(w) for w in (a.scaling_workers or ("1,2" if tiny else "1,2,4,8,14")).split(",")
    ]
    a.scaling_images = a.scaling_images or (200 if tiny else 4000)
    a.epoch_s = a.epoch_s or (20.0 if tiny else 45.0)
    return a


def run(a: argparse.Namespace, result: dict[str, Any], save: Callable[[], None]) -> None:
    """Everything, in order, each row saved as it ends; rows past the budget are skipped."""
    deadline = time.perf_counter() + a.budget_s
    device = torch.device("cpu" if a.cpu else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("device_check: error: no CUDA device here (give --cpu to run on the CPU)")
    size, classes = (64, 10) if a.tiny else (224, 100)
    transform = ImageTransform(size=size, crop="random", flip=True)
    root = a.data or Path(tempfile.mkdtemp(prefix="tf-device-check-"))
    started = time.perf_counter()
    tree, store, nbytes = make_store(root / "train", a.images)
    result["data"] = {"root": str(root), "bytes": nbytes, "make_s": time.perf_counter() - started}
    trainer = Trainer(device, a.tiny, classes if not a.tiny else 100)
    result["ceiling"] = ceiling(trainer, a.batch, size, 100, 10 if a.tiny else 40)
    save()
    for name, make in feeders(a, tree, store, root / "cache", device, transform):
        if time.perf_counter() > deadline - 20:
            result["rows"].append({"name": name, "error": "skipped: out of time"})
            continue
        try:
            loader = make()
        except Exception as exc:  # e.g. torchvision absent: the row says so
            result["rows"].append({"name": name, "error": f"skipped: {exc}"})
            save()
            continue
        with loader:
            epochs = []
            for epoch in range(2):
                record = trainer.epoch(loader, a.epoch_s, deadline)
                epochs.append({"epoch": epoch + 1, **record})
        result["rows"].append({"name": name, "epochs": epochs})
        save()
    scale = root / "scaling"
    if not (scale / "store").exists():
        make_store(scale, a.scaling_images)
    left = max(1.0, (deadline - time.perf_counter()) / (len(a.scaling_workers) * 4 * 2))
    for mode, systems in (
        ("bytes", ["tierfeed", "per-file", "over-store"]),
        ("decode", ["tierfeed"]),
    ):
        if time.perf_counter() > deadline - 10:
            break
        bound, batch = min(left, a.epoch_s), max(8, a.batch // 4)

        def keep(row: dict[str, Any]) -> None:
            result["scaling"].append(row)
            save()

        scaling(
            scale / "tree", scale / "store", a.scaling_workers, [mode], systems, batch, bound, keep
        )


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    device = (
        "cpu" if a.cpu else (torch.cuda.get_device_name() if torch.cuda.is_available() else "?")
    )
    result: dict[str, Any] = {
        "device": device, "cores": os.cpu_count(), "images": a.images, "batch": a.batch,
        "model": "tiny CNN" if a.tiny else "torchvision resnet50", "torch": torch.__version__,
        "origin": "in-process SlowDriver (median_ms=2,sigma=0.5,bandwidth_mbps=400)",
        "rows": [], "scaling": [], "complete": False,
    }  # fmt: skip

    def save() -> None:
        a.out.write_text(json.dumps(result, indent=1, default=str))

    main_pid = os.getpid()

    def stop(signum: int, frame: Any) -> None:
        if os.getpid() != main_pid:  # a forked worker inherited this handler: end as usual
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise StopError(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    # SIGUSR1 prints every thread's stack, in this process and in each worker it forks (the
    # handler is inherited): what a run that hangs was waiting on. And the budget is a bound:
    # a minute past it, the stacks are printed and the run ends (rows are saved as they end).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.dump_traceback_later(a.budget_s + 60, exit=True)
    try:
        run(a, result, save)
        result["complete"] = True
    except StopError as exc:
        result["stopped"] = str(exc)
    finally:
        save()
        print(summary(result), flush=True)
        print(f"JSON: {a.out}", flush=True)


if __name__ == "__main__":
    main()
