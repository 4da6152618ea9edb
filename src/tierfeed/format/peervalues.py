"""Values inside another tool's sample bytes that MDS and LitData encode alike: little-endian
uint32 headers, raw numpy buffers, a PIL image as width, height, mode and pixels, and a list
of images as a count, the sizes and the images.

Every length read from the bytes is checked against the bytes before it is used, so a
damaged sample is a `PackError` naming it (``where``), not an allocation of the size it
claims.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np

from tierfeed.errors import ConfigError, PackError

__all__ = ["array_of", "image_list", "pil_image", "scalar", "u32s"]

# Bits per pixel of the PIL modes an image may be stored in ("1" is packed 8 to a byte, row
# by row); another mode is refused rather than guessed.
_MODE_BITS = {
    "1": 1,
    "L": 8,
    "P": 8,
    "I;16": 16,
    "I;16B": 16,
    "I;16L": 16,
    "LA": 16,
    "PA": 16,
    "La": 16,
    "RGB": 24,
    "YCbCr": 24,
    "LAB": 24,
    "HSV": 24,
    "RGBA": 32,
    "RGBa": 32,
    "RGBX": 32,
    "CMYK": 32,
    "I": 32,
    "F": 32,
}


def u32s(data: memoryview, offset: int, count: int, where: str) -> list[int]:
    """``count`` little-endian uint32 at ``offset`` of ``data``."""
    end = offset + 4 * count
    if count < 0 or end > len(data):
        raise PackError(
            f"{where}: {len(data)} bytes, too short for the {count} sizes its header needs; "
            "the data is damaged"
        )
    return np.frombuffer(data[offset:end], dtype="<u4").tolist()  # type: ignore[no-any-return]


def array_of(data: memoryview, dtype: np.dtype[Any], shape: tuple[int, ...], where: str) -> Any:
    """The array of ``shape`` and ``dtype`` whose values are all of ``data``."""
    want = math.prod(shape) * dtype.itemsize
    if want != len(data):
        raise PackError(
            f"{where}: an array of shape {shape} and dtype {dtype} takes {want} bytes, but "
            f"{len(data)} are stored; the data is damaged"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def scalar(data: memoryview, dtype: str, where: str) -> Any:
    """The one number of ``dtype`` (a numpy name, little-endian) that ``data`` holds."""
    value = array_of(data, np.dtype(dtype).newbyteorder("<"), (), where)
    return value.item()


def _pillow() -> Any:
    try:
        return importlib.import_module("PIL.Image")
    except ImportError:
        raise ConfigError(
            "converting a column of PIL images needs pillow: pip install pillow "
            "(or tierfeed[image])"
        ) from None


def pil_image(data: memoryview, where: str) -> Any:
    """The PIL image of ``[width u32][height u32][mode length u32][mode][pixels]``, the layout
    of an MDS ``pil`` column and a LitData ``pil`` leaf."""
    width, height, mode_size = u32s(data, 0, 3, where)
    if 12 + mode_size > len(data):
        raise PackError(f"{where}: the image's mode runs past its bytes; the data is damaged")
    mode = bytes(data[12 : 12 + mode_size]).decode("ascii", "replace")
    bits = _MODE_BITS.get(mode)
    if bits is None:
        raise PackError(f"{where}: a PIL image of mode {mode!r}, which tierfeed does not convert")
    row = (width * bits + 7) // 8
    pixels = data[12 + mode_size :]
    if row * height != len(pixels):
        raise PackError(
            f"{where}: a {mode} {width}x{height} image takes {row * height} bytes, but "
            f"{len(pixels)} are stored; the data is damaged"
        )
    return _pillow().frombytes(mode, (width, height), bytes(pixels))


def image_list(data: memoryview, where: str, skip: int = 0) -> list[memoryview]:
    """The items of ``[skip bytes][count u32][count sizes u32][items]``: a list of images (an
    MDS ``list[...]`` column has 4 bytes before the count, its ``jpeg_array`` and LitData's
    ``jpeg_array`` none)."""
    (count,) = u32s(data, skip, 1, where)
    sizes = u32s(data, skip + 4, count, where)
    start = skip + 4 + 4 * count
    if start + sum(sizes) != len(data):
        raise PackError(
            f"{where}: {count} images of {sum(sizes)} bytes in all, but {len(data) - start} "
            "are stored; the data is damaged"
        )
    items = []
    for size in sizes:
        items.append(data[start : start + size])
        start += size
    return items
