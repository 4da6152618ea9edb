"""Field values by extension, WebDataset's way: what a writer stores for a Python value, and
what a reader makes of the stored bytes.

A field's extension is its name's last dot-separated part (``"jpg"``, ``"seg.png"`` -> png),
lower-cased. Writing (`encode_field`): bytes-like values are stored as they are and ``str`` as
UTF-8, whatever the field; besides them

============================  ============================================================
extension                     value
============================  ============================================================
``cls``, ``cls2``, ``txt``    an ``int`` (decimal text; ``txt`` also takes a float)
``json``                      a dict, list, number, bool or None (``json.dumps``)
``jpg`` ``jpeg`` ``png``      a PIL image, or a uint8 numpy array (H, W) or (H, W, C) with
``webp`` ``bmp`` ``tif``      C in 1, 3, 4 (``quality`` for jpg and webp; needs pillow)
``tiff`` ``ppm``
``npy``                       a numpy array (or a torch tensor), ``numpy.save`` without pickle
``pt``, ``pth``               what ``torch.save`` takes (a tensor, a dict of them)
============================  ============================================================

Reading (`decode_field`) is the inverse for the same extensions: json, text, integers, numpy
arrays, ``torch.load(weights_only=True)``, and images as PIL images (or left as bytes). Torch
is never imported here to write: a value made by torch means torch is loaded already.
"""

from __future__ import annotations

import importlib
import io
import json
import sys
from typing import Any

import numpy as np

from tierfeed.errors import ConfigError, PackError

__all__ = ["IMAGE_FORMATS", "decode_field", "encode_field", "field_ext"]

# Extension -> the format name pillow saves it under.
IMAGE_FORMATS = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "bmp": "BMP",
    "tif": "TIFF",
    "tiff": "TIFF",
    "ppm": "PPM",
}
_INT_EXTS = ("cls", "cls2", "txt")
_JSON_TYPES = (dict, list, int, float, bool, type(None))


def field_ext(name: str) -> str:
    """The extension that decides a field's encoding: the last dot-separated part, lower."""
    return name.rsplit(".", 1)[-1].lower()


def _pillow(what: str) -> Any:
    try:
        return importlib.import_module("PIL.Image")
    except ImportError:
        raise ConfigError(f"{what} needs pillow: pip install pillow (or tierfeed[image])") from None


def _from_torch(value: object) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def _image_bytes(value: Any, fmt: str, quality: int, where: str) -> bytes:
    image_module = _pillow(f"{where}: an image field")
    if isinstance(value, np.ndarray):
        if (
            value.dtype != np.uint8
            or value.ndim not in (2, 3)
            or (value.ndim == 3 and value.shape[2] not in (1, 3, 4))
        ):
            raise PackError(
                f"{where}: an image array must be uint8 (H, W) or (H, W, C) with C in 1, 3, 4; "
                f"got {value.dtype} {value.shape}"
            )
        value = image_module.fromarray(
            value[:, :, 0] if value.ndim == 3 and value.shape[2] == 1 else value
        )
    if not isinstance(value, image_module.Image):
        raise PackError(
            f"{where} is a {type(value).__name__}; give bytes, a PIL image or a uint8 array"
        )
    if fmt == "JPEG" and value.mode not in ("L", "RGB", "CMYK"):
        value = value.convert("RGB")  # JPEG has no alpha: what PIL would refuse to save
    out = io.BytesIO()
    options = {"quality": quality} if fmt in ("JPEG", "WEBP") else {}
    value.save(out, format=fmt, **options)
    return out.getvalue()


def encode_field(key: str, name: str, value: object, quality: int = 95) -> bytes | memoryview:
    """What field ``name`` of sample ``key`` stores for ``value`` (see the module's table).

    Raises:
        PackError: a value this field's extension cannot store, naming the sample and field.
    """
    where = f"sample {key!r}: field {name!r}"
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, memoryview):
        return value.cast("B") if value.c_contiguous else value.tobytes()
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise PackError(f"{where} is a str that is not valid Unicode") from None
    ext = field_ext(name)
    if ext in _INT_EXTS and isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    if ext == "txt" and isinstance(value, float):
        return repr(value).encode()
    if ext == "json" and isinstance(value, _JSON_TYPES):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise PackError(f"{where}: not JSON ({exc})") from None
    if ext in IMAGE_FORMATS and not isinstance(value, (int, float)):
        return _image_bytes(value, IMAGE_FORMATS[ext], quality, where)
    if ext == "npy" and (isinstance(value, np.ndarray) or _from_torch(value)):
        array = value if isinstance(value, np.ndarray) else value.detach().cpu().numpy()  # type: ignore[attr-defined]
        out = io.BytesIO()
        np.save(out, array, allow_pickle=False)
        return out.getvalue()
    if ext in ("pt", "pth") and "torch" in sys.modules:
        out = io.BytesIO()
        sys.modules["torch"].save(value, out)
        return out.getvalue()
    raise PackError(
        f"{where} is a {type(value).__name__}; this field takes bytes or str, or by its "
        f"extension an int (cls, txt), a JSON value (json), a PIL image or uint8 array "
        f"(jpg, png, webp, ...), a numpy array (npy) or a torch object (pt); encode it first"
    )


def decode_field(name: str, data: bytes, images: str = "pil") -> Any:
    """The value field ``name`` holds, by its extension; bytes for an extension of no codec.

    Args:
        images: ``pil`` (a PIL image, loaded) or ``bytes`` (left as stored).

    Raises:
        ValueError (json, text, integers, npy) or OSError (images): bytes that are not what
            the extension says; `tierfeed.loader.decode` names the sample.
    """
    ext = field_ext(name)
    if ext == "json":
        return json.loads(data)
    if ext == "txt":
        return data.decode("utf-8")
    if ext in ("cls", "cls2"):
        return int(data)
    if ext == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if ext in ("pt", "pth"):
        torch = importlib.import_module("torch")
        return torch.load(io.BytesIO(data), weights_only=True)
    if ext in IMAGE_FORMATS and images == "pil":
        image = _pillow(f"field {name!r}").open(io.BytesIO(data))
        image.load()
        return image
    return data
