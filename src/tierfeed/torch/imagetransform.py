"""The image transform of the common training path: a crop, a resize to a fixed square, a flip
and a normalization, as plain torch on CHW tensors, the same on the CPU and on the device.

`ImageTransform` says what to do; `crop_box` draws (or centers) the crop of one image in its
own coordinates, so a decoder can crop before it resizes (or decode at a reduced scale first);
`transform_images` applies the whole transform to a list of decoded images of any sizes and
returns one batch tensor. Random draws come from torch's default generator, as torchvision's
``RandomResizedCrop`` and ``RandomHorizontalFlip`` take theirs: a DataLoader seeds it in each
worker, ``torch.manual_seed`` in the training process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.functional import interpolate

from tierfeed.errors import ConfigError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImageTransform", "crop_box", "transform_images"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageTransform:
    """A decoded image made a ``size`` x ``size`` tensor.

    Attributes:
        size: the side of the output square.
        crop: ``"center"`` (evaluation: the shorter side resized to ``resize``, then the
            center ``size`` square, as torchvision's Resize + CenterCrop) or ``"random"``
            (training: torchvision's RandomResizedCrop with ``scale`` and ``ratio``).
        resize: the shorter side before the center crop (default ``size * 256 / 224``).
        scale: the random crop's area range, as a fraction of the image's.
        ratio: the random crop's aspect-ratio range.
        flip: flip horizontally with probability 0.5.
        mean: per-channel mean (in [0, 1] units) to subtract; with ``std``, the output is
            float32 ``(x / 255 - mean) / std``. Without both, the output is uint8.
        std: per-channel standard deviation to divide by.
    """

    size: int = 224
    crop: str = "center"
    resize: int | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        if self.size <= 0 or (self.resize is not None and self.resize < self.size):
            raise ConfigError(
                f"ImageTransform(size={self.size}, resize={self.resize}): give size > 0 and "
                "resize >= size (or none)"
            )
        if self.crop not in ("center", "random"):
            raise ConfigError(f"ImageTransform(crop={self.crop!r}): 'center' or 'random'")
        if (self.mean is None) != (self.std is None):
            raise ConfigError("ImageTransform: give both mean and std (normalized) or neither")
        if self.std is not None and min(self.std) <= 0:
            raise ConfigError(f"ImageTransform(std={self.std}): every std must be > 0")
        low, high = self.scale
        if not 0 < low <= high <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(
                f"ImageTransform(scale={self.scale}, ratio={self.ratio}): "
                "0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1]"
            )

    @property
    def shorter_side(self) -> int:
        """The shorter side the center crop is taken from."""
        return self.resize if self.resize is not None else round(self.size * 256 / 224)

    @property
    def normalized(self) -> bool:
        """Whether the output is normalized float32 (else uint8)."""
        return self.mean is not None


def _uniform(low: float, high: float) -> float:
    return float(torch.empty(1).uniform_(low, high).item())


def crop_box(height: int, width: int, transform: ImageTransform) -> tuple[int, int, int, int]:
    """``(top, left, crop_height, crop_width)`` of the part of a ``height`` x ``width`` image that
    becomes the output square: a random crop drawn as torchvision's RandomResizedCrop draws it
    (10 tries, then the center crop of the clamped ratio), or the center crop."""
    if transform.crop == "random":
        area = height * width
        log_ratio = (math.log(transform.ratio[0]), math.log(transform.ratio[1]))
        for _ in range(10):
            target = area * _uniform(*transform.scale)
            aspect = math.exp(_uniform(*log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, (1,)).item())
                left = int(torch.randint(0, width - w + 1, (1,)).item())
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < transform.ratio[0]:
            w, h = width, round(width / transform.ratio[0])
        elif in_ratio > transform.ratio[1]:
            h, w = height, round(height * transform.ratio[1])
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w
    # Resize the shorter side to `shorter_side`, then take the center `size` square: in the
    # image's own coordinates that square is `size / scale` pixels on a side.
    side = max(
        1, min(height, width, round(transform.size * min(height, width) / transform.shorter_side))
    )
    return (height - side) // 2, (width - side) // 2, side, side


def draw_flip(transform: ImageTransform) -> bool:
    """Whether this image is flipped (drawn only when the transform flips)."""
    return transform.flip and bool(torch.rand(1).item() < 0.5)


def _resized(image: torch.Tensor, size: int) -> torch.Tensor:
    """A CHW uint8 (or float) crop resized to ``size`` x ``size``, float32 in [0, 255]."""
    x = image.unsqueeze(0).float()
    if x.shape[-2:] != (size, size):
        x = interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x[0]


def transform_images(
    images: Sequence[torch.Tensor], transform: ImageTransform, out: torch.device | None = None
) -> torch.Tensor:
    """One ``N x 3 x size x size`` tensor of ``images`` (CHW uint8, one or three channels, any
    sizes, on one device) each cropped, resized, flipped and normalized by ``transform``:
    uint8, or float32 when it normalizes. On ``out`` (default: the images' device)."""
    device = out if out is not None else (images[0].device if images else torch.device("cpu"))
    size = transform.size
    batch = torch.empty((len(images), 3, size, size), dtype=torch.float32, device=device)
    for i, image in enumerate(images):
        top, left, h, w = crop_box(int(image.shape[-2]), int(image.shape[-1]), transform)
        x = _resized(image[:, top : top + h, left : left + w], size)
        if draw_flip(transform):
            x = x.flip(-1)
        batch[i] = x.expand(3, size, size) if x.shape[0] == 1 else x[:3]
    return finish(batch, transform)


def finish(batch: torch.Tensor, transform: ImageTransform) -> torch.Tensor:
    """A float ``N x 3 x H x W`` batch in [0, 255] as the transform's output: normalized
    float32, or uint8 rounded and clamped."""
    if transform.mean is None or transform.std is None:
        return batch.round_().clamp_(0, 255).to(torch.uint8)
    mean = torch.tensor(transform.mean, device=batch.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(transform.std, device=batch.device).view(1, 3, 1, 1) * 255
    return batch.sub_(mean).div_(std)
