"""Image decoders for the common training path: decode in the workers (`ImageDecoder`), or hand
the JPEG bytes over raw (`JpegBytes`, `collate_jpegs`) for one decode of the batch on the device
(`tierfeed.torch.devicedecode`).

Both are a `Dataset`'s ``decode`` (a Sample to what a batch holds per sample), so a failure
reaches the caller as the feed's `DecodeError`, naming the sample key and its chunk.
torchvision is imported only when a decoder is asked to use it, and its absence is a
`ConfigError` saying what to install.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tierfeed.errors import ConfigError
from tierfeed.format.codecs import IMAGE_FORMATS, field_ext, open_image
from tierfeed.storage.store import Sample
from tierfeed.torch.imagetransform import (
    ImageTransform,
    crop_box,
    draw_flip,
    finish,
    transform_images,
)

__all__ = [
    "ImageDecoder",
    "JpegBatch",
    "JpegBytes",
    "collate_images",
    "collate_jpegs",
    "torchvision_io",
]

INSTALL_TORCHVISION = (
    "pip install torchvision (the build made for your torch: see "
    "https://pytorch.org/get-started/locally/)"
)
JPEG_START = b"\xff\xd8\xff"  # SOI, then the first marker


def torchvision_io() -> Any:
    """``torchvision.io``, imported now.

    Raises:
        ConfigError: torchvision does not import (missing, or built for another torch).
    """
    try:
        import torchvision.io  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:  # ImportError, or the RuntimeError of a mismatched build
        raise ConfigError(
            f"this decoder needs torchvision, which does not import here ({type(exc).__name__}: "
            f"{exc}): {INSTALL_TORCHVISION}"
        ) from exc
    return torchvision.io


def image_field(sample: Sample, name: str | None) -> tuple[str, bytes]:
    """The sample's image: the field ``name``, or its first image field; (name, bytes)."""
    if name is not None:
        if name not in sample.fields:
            raise ValueError(f"no field {name!r} (it has {sorted(sample.fields)})")
        return name, sample.fields[name]
    for key, data in sample.fields.items():
        if field_ext(key) in IMAGE_FORMATS:
            return key, data
    raise ValueError(f"no image field (it has {sorted(sample.fields)})")


def _is_jpeg(name: str, data: bytes) -> bool:
    """Whether the field is read as a JPEG: by its extension, or by its bytes where its
    extension names no image format (`tierfeed.format.codecs.open_image`'s rule)."""
    fmt = IMAGE_FORMATS.get(field_ext(name))
    return fmt == "JPEG" or (fmt is None and data.startswith(JPEG_START))


@dataclass(frozen=True)
class ImageDecoder:
    """A `Dataset` decode: a sample's image decoded in the worker and transformed to a fixed
    ``3 x size x size`` tensor, with its label: ``(image, label)``.

    Args:
        transform: the crop, resize, flip and normalization.
        field: the image's field (``"jpg"``); by default the sample's first image field.
        backend: ``"pil"`` (Pillow, decoding a JPEG at a reduced scale when the crop allows:
            the least CPU) or ``"torchvision"`` (``torchvision.io.decode_jpeg`` for JPEGs,
            Pillow for other formats; the transform in torch). Either reads an image as the
            format its field's extension names (`tierfeed.format.codecs.open_image`).
    """

    transform: ImageTransform = field(default_factory=ImageTransform)
    field: str | None = None
    backend: str = "pil"

    def __post_init__(self) -> None:
        if self.backend not in ("pil", "torchvision"):
            raise ConfigError(f"ImageDecoder(backend={self.backend!r}): 'pil' or 'torchvision'")
        if self.backend == "torchvision":
            torchvision_io()  # fail now, in the training process, not in every worker

    def __call__(self, sample: Sample) -> tuple[torch.Tensor, int]:
        name, data = image_field(sample, self.field)
        if self.backend == "torchvision" and _is_jpeg(name, data):
            io_ = torchvision_io()
            raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            image = io_.decode_jpeg(raw, mode=io_.ImageReadMode.RGB)
            return transform_images([image], self.transform)[0], sample.label
        return pil_image(data, self.transform, name), sample.label


def pil_image(data: bytes, transform: ImageTransform, name: str | None = None) -> torch.Tensor:
    """Image bytes decoded by Pillow and transformed: a JPEG is decoded at the smallest scale
    (1/2, 1/4, 1/8) that still leaves the crop at least ``size`` pixels on each side. The bytes
    are read as the format field ``name``'s extension names (`open_image`; any of its raster
    formats without a name)."""
    from PIL import Image

    size = transform.size
    ext = None if name is None else field_ext(name)
    where = "image" if name is None else f"field {name!r}"
    with open_image(data, ext, where) as img:
        width, height = img.size
        top, left, h, w = crop_box(height, width, transform)
        if img.format == "JPEG":
            img.draft("RGB", (math.ceil(width * size / w), math.ceil(height * size / h)))
        rgb = img.convert("RGB")
    sx, sy = rgb.size[0] / width, rgb.size[1] / height
    box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
    out = rgb.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if draw_flip(transform):
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1)
    if not transform.normalized:
        return image.contiguous()
    return finish(image.unsqueeze(0).float(), transform)[0]


def collate_images(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`ImageDecoder`'s samples as ``(images N x 3 x H x W, labels N)``."""
    images = torch.stack([image for image, _ in batch])
    return images, torch.tensor([label for _, label in batch], dtype=torch.int64)


@dataclass(frozen=True)
class JpegBytes:
    """A `Dataset` decode that leaves the image encoded: ``(jpeg bytes, label, key)``, for
    `collate_jpegs` and a device decoder. Bytes that are not a JPEG fail here, in the worker
    (the device decoder reads only JPEGs: decode such a store with `ImageDecoder`).

    Args:
        field: the image's field; by default the sample's first image field.
    """

    field: str | None = None

    def __call__(self, sample: Sample) -> tuple[bytes, int, str]:
        name, data = image_field(sample, self.field)
        if not _is_jpeg(name, data) or not data.startswith(JPEG_START):
            raise ValueError(
                f"field {name!r} is not a JPEG (by its extension, or its bytes, which start "
                f"with {data[:4]!r}): the device decoder reads JPEG fields only; use "
                "tierfeed.torch.ImageDecoder to decode other formats in the workers"
            )
        return data, sample.label, sample.key


@dataclass
class JpegBatch:
    """A batch's JPEG bytes, still encoded: one uint8 tensor (one transfer from a worker, not
    one per image), cut at ``offsets``; ``keys`` name the samples in errors."""

    data: torch.Tensor
    offsets: np.ndarray[Any, np.dtype[np.int64]]
    keys: list[str]

    def __len__(self) -> int:
        return len(self.keys)

    def images(self) -> list[torch.Tensor]:
        """Each image's bytes, as views of ``data``."""
        o = self.offsets.tolist()
        return [self.data[o[i] : o[i + 1]] for i in range(len(self.keys))]


def collate_jpegs(batch: Sequence[tuple[bytes, int, str]]) -> tuple[JpegBatch, torch.Tensor]:
    """`JpegBytes`'s samples as ``(JpegBatch, labels N)``."""
    sizes = np.fromiter((len(data) for data, _, _ in batch), dtype=np.int64, count=len(batch))
    offsets = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    joined = bytearray().join(d for d, _, _ in batch)  # one copy, into memory torch may use
    data = (
        torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
    )
    labels = torch.tensor([label for _, label, _ in batch], dtype=torch.int64)
    return JpegBatch(data, offsets, [key for _, _, key in batch]), labels
