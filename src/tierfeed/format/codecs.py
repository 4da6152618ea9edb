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

A number that is not a Python one is stored as the Python number it holds (``item()``), so it
reads back as that number would: a numpy scalar (``np.int64(3)``, ``np.float32(0.5)``), a 0-d
numpy array, or a 0-d torch tensor (``torch.tensor(3)``), of a bool, integer or float dtype, in
``cls``, ``txt`` and ``json`` fields, and inside a ``json`` value's lists and dicts. A float32
is the float it equals (``np.float32(0.1)`` is ``0.10000000149011612``). A bool (Python's,
numpy's, a 0-d bool tensor) is ``1`` or ``0`` in ``cls`` and ``cls2``, since a label is
integer text (WebDataset writes ``True``, which neither it nor tierfeed reads back as a label),
so it reads back as the int 1 or 0; in ``txt`` it is ``True`` or ``False``, as ``str`` gives
it; in ``json`` ``true`` or ``false``. An ``npy`` field takes a numpy scalar as a 0-d array.
Arrays and tensors with dimensions are taken only by ``npy``, ``pt`` and image fields.

Reading (`decode_field`) is the inverse for the same extensions: json, text, integers, numpy
arrays, torch's safe load (tensors only, no pickled objects), and images as PIL images (or left
as bytes). Torch is never imported here to write: a value made by torch means torch is loaded
already.

Every image tierfeed decodes is opened by `open_image`, as the format its extension names
(``.png`` as PNG only), or where no extension is known as one of `RASTER_FORMATS`; never as
whatever format Pillow guesses from the bytes, since some formats (EPS, PostScript) make
Pillow run an external program (Ghostscript) on them. An image is stored only in a format that
keeps its mode: one the format would refuse or change (an RGBA image in a bmp or jpg field
would lose its alpha) is a `PackError` saying what to do.
"""

from __future__ import annotations

import importlib
import io
import json
import pickle
import re
import sys
from typing import Any

import numpy as np

from tierfeed.errors import ConfigError, DecodeError, PackError

__all__ = [
    "IMAGE_FORMATS",
    "RASTER_FORMATS",
    "decode_field",
    "encode_field",
    "field_ext",
    "open_image",
]

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
# What an image of no known extension may be: Pillow decoders that run in-process only.
RASTER_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "TIFF", "PPM", "GIF")
# The modes each format stores and reads back unchanged (Pillow saves some others by dropping a
# band or clipping values: RGBA as BMP or PPM, I as PPM).
_KEEPS = {
    "JPEG": ("L", "RGB", "CMYK"),
    "PNG": ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"),
    "WEBP": ("RGB", "RGBA"),
    "BMP": ("1", "L", "P", "RGB"),
    "TIFF": ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "I", "I;16", "F"),
    "PPM": ("1", "L", "RGB", "F"),
}
_INT_EXTS = ("cls", "cls2", "txt")
_NUMBER_EXTS = (*_INT_EXTS, "json")  # the fields that take a numpy or torch scalar as a number
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


def _python_number(value: object) -> object:
    """The Python bool, int or float a numpy scalar, 0-d numpy array or 0-d torch tensor of such
    a dtype holds; any other value unchanged. Torch is not imported: a tensor means it is."""
    if isinstance(value, np.generic | np.ndarray):
        return value.item() if value.ndim == 0 and value.dtype.kind in "biuf" else value
    if _from_torch(value) and getattr(value, "ndim", None) == 0:
        number = value.item()  # type: ignore[attr-defined]
        return number if isinstance(number, int | float) else value  # (not a complex)
    return value


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
    if value.mode not in _KEEPS[fmt]:
        raise PackError(_mode_refused(where, value.mode, fmt))
    out = io.BytesIO()
    options = {"quality": quality} if fmt in ("JPEG", "WEBP") else {}
    try:
        value.save(out, format=fmt, **options)
    except (OSError, ValueError) as exc:  # too large for the format, an encoder's limit
        raise PackError(
            f"{where}: pillow cannot store this {value.mode} {value.size[0]}x{value.size[1]} "
            f"image as {fmt} ({exc}); resize it, or store it in a png or tiff field"
        ) from None
    return out.getvalue()


def _mode_refused(where: str, mode: str, fmt: str) -> str:
    others = [
        ext
        for ext in ("png", "tiff")
        if IMAGE_FORMATS[ext] != fmt and mode in _KEEPS[IMAGE_FORMATS[ext]]
    ]
    instead = f", or store it in a {' or '.join(others)} field" if others else ""
    return (
        f"{where}: {fmt} cannot store a {mode} image unchanged (pillow would refuse it, or drop "
        f"a band or bits; {fmt} keeps modes {', '.join(_KEEPS[fmt])}); convert it to one of "
        f"those first (image.convert('RGB') drops alpha knowingly){instead}"
    )


def encode_field(key: str, name: str, value: object, quality: int = 95) -> bytes | memoryview:
    """What field ``name`` of sample ``key`` stores for ``value`` (see the module's table).

    Raises:
        PackError: a value this field's extension cannot store (or cannot store unchanged: an
            image mode its format drops), naming the sample and field.
    """
    where = f"sample {key!r}: field {name!r}"
    try:
        return _encode(where, name, value, quality)
    except (PackError, ConfigError, MemoryError):
        raise
    except Exception as exc:  # a third-party encoder's own error, translated here
        raise PackError(
            f"{where}: storing this {type(value).__name__} failed with {type(exc).__name__}: "
            f"{exc}; convert it to a value the field's extension takes (tierfeed.format.codecs)"
        ) from exc


def _encode(where: str, name: str, value: object, quality: int) -> bytes | memoryview:
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
    number = _python_number(value) if ext in _NUMBER_EXTS else value
    if ext in _INT_EXTS and isinstance(number, int):
        # a bool: 1 or 0 in cls (a label is integer text), True or False in txt
        text = str(number) if ext == "txt" and isinstance(number, bool) else str(int(number))
        return text.encode()
    if ext == "txt" and isinstance(number, float):
        return repr(number).encode()
    if ext == "json" and isinstance(number, _JSON_TYPES):
        return _json_bytes(number, where)
    if ext in IMAGE_FORMATS and not isinstance(value, (int, float)):
        return _image_bytes(value, IMAGE_FORMATS[ext], quality, where)
    if ext == "npy" and (isinstance(value, np.ndarray | np.generic) or _from_torch(value)):
        array = value.detach().cpu().numpy() if _from_torch(value) else np.asarray(value)  # type: ignore[attr-defined]
        return _npy_bytes(array, where)
    if ext in ("pt", "pth") and "torch" in sys.modules:
        out = io.BytesIO()
        sys.modules["torch"].save(value, out)
        return out.getvalue()
    raise PackError(
        f"{where} is a {type(value).__name__}; this field takes bytes or str, or by its "
        f"extension an int or bool (cls, txt; numpy and 0-d torch ones too), a JSON value "
        f"(json), a PIL image or uint8 array (jpg, png, webp, ...), a numpy array (npy) or a "
        f"torch object (pt); encode it first"
    )


def _json_bytes(value: object, where: str) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_number).encode()
    except RecursionError:
        raise PackError(
            f"{where}: nested too deeply to store as JSON; flatten it, or store it as bytes "
            "you serialized yourself"
        ) from None
    except (TypeError, ValueError) as exc:
        raise PackError(f"{where}: not JSON ({exc})") from None


def _json_number(value: object) -> object:
    """``json.dumps``'s ``default``: a numpy or torch scalar as its Python number."""
    number = _python_number(value)
    if number is value:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return number


def _npy_bytes(array: np.ndarray[Any, Any], where: str) -> bytes:
    if array.dtype.hasobject:
        raise PackError(
            f"{where}: a numpy array of dtype {array.dtype} holds Python objects, which npy "
            "stores only pickled (never done here); convert it to a numeric dtype, or store "
            "the values in a json field"
        )
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def open_image(data: bytes, ext: str | None = None, where: str = "image") -> Any:
    """``data`` opened (not yet loaded) as the image format extension ``ext`` names
    (`IMAGE_FORMATS`, any case: ``JPG`` is JPEG), or as one of `RASTER_FORMATS` where ``ext``
    is None or names none; never as a format guessed from the bytes alone.

    Raises:
        DecodeError: the bytes are not that format (``where`` names them; `decode_read`
            adds the sample and chunk). An image that opens may still fail to load (OSError).
        ConfigError: pillow is not installed.
    """
    image_module = _pillow(where)
    fmt = IMAGE_FORMATS.get(ext.lower()) if ext is not None else None
    formats = [fmt] if fmt is not None else list(RASTER_FORMATS)
    try:
        return image_module.open(io.BytesIO(data), formats=formats)
    except image_module.UnidentifiedImageError:
        pass
    if fmt is None:
        raise DecodeError(
            f"{where}: the bytes (starting {data[:8]!r}) are none of the image formats read "
            f"without a known extension ({', '.join(RASTER_FORMATS)})"
        )
    seen = _raster_format(image_module, data)
    looks = f"they are a {seen} image" if seen else f"they start with {data[:8]!r}"
    raise DecodeError(
        f"{where}: the bytes are not a {fmt} image, as the extension {ext!r} says ({looks}); "
        "images are read only as the format their extension names: give the file its "
        "format's extension and re-pack"
    )


def _raster_format(image_module: Any, data: bytes) -> str | None:
    """The in-process format the bytes are, for an error message; None if none of them."""
    try:
        with image_module.open(io.BytesIO(data), formats=list(RASTER_FORMATS)) as image:
            return str(image.format)
    except Exception:  # any failure to identify: the message then shows the first bytes
        return None


def decode_field(name: str, data: bytes, images: str = "pil") -> Any:
    """The value field ``name`` holds, by its extension; bytes for an extension of no codec.

    Args:
        images: ``pil`` (a PIL image, loaded) or ``bytes`` (left as stored).

    Raises:
        DecodeError: an image that is not the format its extension names (`open_image`), or a
            pt file torch's safe loader refuses; naming the field.
        ValueError (json, text, integers, npy) or OSError (a damaged image): bytes that are not
            what the extension says; `tierfeed.loader.decode` names the sample.
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
        return _torch_load(name, data)
    if ext in IMAGE_FORMATS and images == "pil":
        image = open_image(data, ext, f"field {name!r}")
        image.load()
        return image
    return data


def _torch_load(name: str, data: bytes) -> Any:
    torch = importlib.import_module("torch")
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message advises loading the file unsafely, which would run what it holds
        found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.? Please use|\n|$)", str(exc))
        reason = f" ({found.group(1).strip()})" if found else ""
        raise DecodeError(
            f"field {name!r}: the file holds objects beyond tensors, and torch's safe loader "
            f"refused them{reason}; store tensors (or dicts and lists of them) in pt fields, "
            "other values in json or npy fields"
        ) from None
