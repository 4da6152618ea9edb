"""Generate ImageFolder-like datasets for demos, tests and benchmarks (seeded, ImageNet-like)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tierfeed.errors import ConfigError

__all__ = ["SynthSpec", "make_imagefolder"]


@dataclass(frozen=True)
class SynthSpec:
    """Shape of a generated dataset.

    Attributes:
        classes: number of class directories.
        per_class: files per class.
        median_bytes: median file size (ImageNet train JPEGs: ~110 KB).
        sigma: lognormal shape of the size distribution (ImageNet: ~0.6).
        jpeg: write real JPEGs (Pillow) instead of random bytes of the drawn size.
        seed: seed of sizes and contents.
    """

    classes: int = 10
    per_class: int = 100
    median_bytes: int = 110_000
    sigma: float = 0.6
    jpeg: bool = False
    seed: int = 0


def _jpeg(rng: np.random.Generator, target: int) -> bytes:
    from PIL import Image  # optional dependency, only for jpeg=True

    # This texture compresses to about 0.75 bytes per pixel at quality 85: size the image so.
    pixels = max(64, int(target * 1.3))
    side = max(8, int(pixels**0.5))
    low = rng.integers(0, 256, size=(side // 4 + 1, side // 4 + 1, 3), dtype=np.uint8)
    base = np.kron(low, np.ones((4, 4, 1), dtype=np.uint8))[:side, :side]
    noise = rng.integers(-40, 40, size=base.shape, dtype=np.int16)
    img = np.clip(base.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def make_imagefolder(root: str | Path, spec: SynthSpec, progress: bool = False) -> int:
    """Write ``root/class_XXX/img_YYYYYY.jpg`` files; returns the total bytes written.

    The same spec gives the same tree (names, sizes, and bytes) on every machine.
    """
    if spec.classes < 1 or spec.per_class < 1 or spec.median_bytes < 1:
        raise ConfigError(f"synthetic dataset needs at least one class and file: {spec}")
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    total = spec.classes * spec.per_class
    sizes = np.maximum(64, rng.lognormal(np.log(spec.median_bytes), spec.sigma, size=total)).astype(
        np.int64
    )
    written = 0
    root = Path(root)
    with tqdm(total=total, desc="generate", unit="file", disable=not progress) as bar:
        for c in range(spec.classes):
            folder = root / f"class_{c:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(spec.per_class):
                size = int(sizes[c * spec.per_class + i])
                data = _jpeg(rng, size) if spec.jpeg else rng.bytes(size)
                (folder / f"img_{i:06d}.jpg").write_bytes(data)
                written += len(data)
                bar.update()
    return written
