"""Reading a MosaicML Streaming MDS dataset (``index.json`` and ``shard.NNNNN.mds`` files,
maybe compressed) sample by sample, for `tierfeed convert`.

The layout, as Streaming 0.13 writes it (``streaming/base/format/mds``): ``index.json`` holds
``{"version": 2, "shards": [...]}``; each shard entry gives the columns (names, encodings and
fixed sizes, the same in every shard), its sample count, ``raw_data`` (the uncompressed file:
basename, bytes, hashes) and ``zip_data`` (the compressed file, or null). A shard is
``[count u32][count + 1 offsets u32][its config JSON][samples]``, each offset the position of
a sample from the start of the file, the last one the file's end. A sample is one u32 size
per column of variable size (a ``column_sizes`` entry of null), in column order, then the
columns' bytes in column order. All integers are little-endian.

Each column's encoding (``encodings.py``) becomes a value `tierfeed.format.peercolumns`
stores: a ``jpeg`` or ``png`` column its bytes as they are, ``pil`` an image (pixels, stored
as PNG), ``ndarray`` an array (npy), numbers JSON, ``str`` text, ``json`` its JSON text,
``bytes`` and ``pkl`` their bytes (a pickle is never unpickled: it is stored as a ``.pkl``
field, which tierfeed's decoders leave as bytes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierfeed.errors import PackError
from tierfeed.format.peercolumns import PeerColumn, decoded_utf8
from tierfeed.format.peerfiles import (
    INDEX_JSON,
    check_compression,
    check_hashes,
    count_in,
    decompress,
    entry,
    read_shard,
    shard_path,
)
from tierfeed.format.peervalues import array_of, image_list, pil_image, scalar, u32s

__all__ = ["MdsDataset"]

# Encoding -> numpy dtype of the scalar columns.
_SCALARS = {
    "int": "int64",
    **{t: t for t in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32")},
    **{t: t for t in ("int64", "float16", "float32", "float64")},
}
# Encoding -> (extension, holds integers, a list of images) of the other columns.
_KINDS = {
    "bytes": ("bin", False, False),
    "str": ("txt", False, False),
    "str_decimal": ("txt", False, False),
    "str_int": ("json", True, False),
    "str_float": ("json", False, False),
    "jpeg": ("jpg", False, False),
    "png": ("png", False, False),
    "pil": ("png", False, False),
    "list[pil]": ("png", False, True),
    "list[jpeg]": ("jpg", False, True),
    "list[png]": ("png", False, True),
    "jpeg_array": ("jpg", False, True),
    "jpegarray": ("jpg", False, True),
    "json": ("json", False, False),
    "pkl": ("pkl", False, False),
}
# Streaming's ndarray codes: the byte before a value's data names its dtype and the width of
# its shape's integers when the column does not fix them.
_ARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32"}
_ARRAY_DTYPES |= {33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_SHAPE_DTYPES = ("<u1", "<u2", "<u4", "<u8")


@dataclass(frozen=True)
class _Shard:
    path: Path  # the file to read
    size: int  # its size in bytes
    raw_size: int  # uncompressed
    compression: str | None
    hashes: object  # of the file
    raw_hashes: object  # of its uncompressed bytes
    samples: int


def _column(name: object, encoding: object, where: str) -> PeerColumn:
    if not isinstance(name, str) or not isinstance(encoding, str):
        raise PackError(f"{where}: a column's name and encoding must be strings")
    if encoding in _SCALARS:
        return PeerColumn(name, encoding, "json", integer="int" in _SCALARS[encoding])
    if encoding == "ndarray" or encoding.startswith("ndarray:"):
        _array_config(encoding, where)
        return PeerColumn(name, encoding, "npy")
    kind = _KINDS.get(encoding)
    if kind is None:
        raise PackError(
            f"{where}: column {name!r} has the MDS encoding {encoding!r}, which tierfeed does "
            f"not convert (it converts {', '.join(sorted([*_SCALARS, *_KINDS, 'ndarray']))})"
        )
    ext, integer, many = kind
    return PeerColumn(name, encoding, ext, integer, many)


def _array_config(encoding: str, where: str) -> tuple[str | None, tuple[int, ...] | None]:
    """The fixed dtype and shape of an ``ndarray[:dtype[:d0,d1,...]]`` column (None: each
    value says its own)."""
    parts = encoding.split(":")[1:]
    dtype = parts[0] if parts else None
    if len(parts) > 2 or (dtype is not None and dtype not in _ARRAY_DTYPES.values()):
        raise PackError(f"{where}: {encoding!r} is not an ndarray encoding Streaming writes")
    if len(parts) < 2:
        return dtype, None
    try:
        shape = tuple(int(d) for d in parts[1].split(","))
    except ValueError:
        raise PackError(
            f"{where}: {encoding!r} is not an ndarray encoding Streaming writes"
        ) from None
    if any(d < 1 for d in shape):
        raise PackError(f"{where}: {encoding!r} is not an ndarray encoding Streaming writes")
    return dtype, shape


def _ndarray(encoding: str, data: memoryview, where: str) -> Any:
    """A value of an ``ndarray`` column: ``[dtype code u8]`` unless the column fixes the dtype,
    ``[ndim << 2 | shape width u8][shape]`` unless it fixes the shape, then the values."""
    dtype, shape = _array_config(encoding, where)
    at = 0
    if dtype is None:
        code = data[0] if len(data) > 0 else -1
        dtype = _ARRAY_DTYPES.get(code)
        if dtype is None:
            raise PackError(f"{where}: array dtype code {code} is none Streaming writes")
        at = 1
    if shape is None:
        if at >= len(data):
            raise PackError(f"{where}: the array's shape is missing; the data is damaged")
        ndim, width = data[at] >> 2, data[at] & 3
        end = at + 1 + ndim * 2**width
        if end > len(data):
            raise PackError(f"{where}: the array's shape runs past its bytes; the data is damaged")
        shape = tuple(np.frombuffer(data[at + 1 : end], _SHAPE_DTYPES[width]).tolist())
        at = end
    return array_of(data[at:], np.dtype(dtype).newbyteorder("<"), shape, where)


def _number(text: str, integer: bool, where: str) -> int | float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        raise PackError(f"{where}: {text[:40]!r} is not a number") from None


def _value(column: PeerColumn, data: memoryview, where: str) -> Any:
    """The value of ``column`` whose bytes are ``data`` (`tierfeed.format.peercolumns`)."""
    encoding = column.encoding
    if encoding in _SCALARS:
        return scalar(data, _SCALARS[encoding], where)
    if column.ext == "npy":
        return _ndarray(encoding, data, where)
    if encoding in ("str", "str_decimal"):
        return decoded_utf8(data, where)
    if encoding in ("str_int", "str_float"):
        return _number(decoded_utf8(data, where), encoding == "str_int", where)
    if encoding == "pil":
        return pil_image(data, where)
    if column.many:
        items = image_list(data, where, skip=4 if encoding.startswith("list[") else 0)
        return [pil_image(i, where) for i in items] if encoding == "list[pil]" else items
    return data  # bytes, jpeg, png, json, pkl: stored as they are


class MdsDataset:
    """An MDS dataset in the directory ``src``, whose parsed ``index.json`` is ``index``.

    Raises:
        PackError: the index is not one of Streaming's MDS format version 2, or its shards
            disagree on their columns.
    """

    kind = "MDS"

    def __init__(self, src: Path, index: Any) -> None:
        self.src = src
        where = f"{src / INDEX_JSON}"
        version = entry(index, "version", int, where)
        if version != 2:
            raise PackError(f"{where}: MDS index version {version}; tierfeed reads version 2")
        shards = entry(index, "shards", list, where)
        if not shards:
            raise PackError(f"{where}: lists no shard; the dataset is empty")
        self.columns = self._columns(shards[0], f"{where}, shard 0")
        self._sizes: list[int | None] = []
        self._shards = [self._shard(s, f"{where}, shard {i}") for i, s in enumerate(shards)]
        self.samples = sum(s.samples for s in self._shards)
        self.files = len(self._shards)

    def _columns(self, shard: Any, where: str) -> list[PeerColumn]:
        names = entry(shard, "column_names", list, where)
        encodings = entry(shard, "column_encodings", list, where)
        if len(names) != len(encodings) or not names:
            raise PackError(f"{where}: the column names and encodings do not pair up")
        return [_column(n, e, where) for n, e in zip(names, encodings, strict=True)]

    def _shard(self, shard: Any, where: str) -> _Shard:
        fmt = entry(shard, "format", str, where)
        if fmt != "mds":
            raise PackError(
                f"{where}: a shard of Streaming's {fmt!r} format; tierfeed converts MDS shards"
            )
        if self._columns(shard, where) != self.columns:
            raise PackError(f"{where}: its columns differ from shard 0's; the index is damaged")
        sizes = entry(shard, "column_sizes", list, where)
        if len(sizes) != len(self.columns) or not all(
            s is None or (type(s) is int and s >= 0) for s in sizes
        ):
            raise PackError(f"{where}: 'column_sizes' does not fit its columns")
        if self._sizes and sizes != self._sizes:
            raise PackError(f"{where}: its column sizes differ from shard 0's")
        self._sizes = sizes
        raw = entry(shard, "raw_data", dict, where)
        packed = entry(shard, "zip_data", (dict, type(None)), where)
        compression = entry(shard, "compression", (str, type(None)), where)
        if (packed is None) != (compression is None):
            raise PackError(f"{where}: 'compression' and 'zip_data' disagree")
        info = packed if packed is not None else raw
        path = shard_path(self.src, entry(info, "basename", str, where), where)
        if compression is not None:  # refused before anything is written
            check_compression(compression, str(path))
        return _Shard(
            path=path,
            size=count_in(info, "bytes", where),
            raw_size=count_in(raw, "bytes", where),
            compression=compression,
            hashes=info.get("hashes"),
            raw_hashes=raw.get("hashes"),
            samples=count_in(shard, "samples", where),
        )

    def __iter__(self) -> Iterator[tuple[str, list[Any]]]:
        for shard in self._shards:
            data = memoryview(self._read(shard))
            where = str(shard.path)
            ends = _sample_offsets(data, shard.samples, where)
            for j in range(shard.samples):
                at = f"{where}, sample {j}"
                yield at, self._sample(data[ends[j] : ends[j + 1]], at)

    def _read(self, shard: _Shard) -> bytes:
        where = str(shard.path)
        data = read_shard(shard.path, where, shard.size)
        check_hashes(data, shard.hashes, where)
        if shard.compression is not None:
            data = decompress(data, shard.compression, shard.raw_size, where)
            check_hashes(data, shard.raw_hashes, f"{where} (decompressed)")
        return data

    def _sample(self, data: memoryview, where: str) -> list[Any]:
        """The column values of one sample's bytes."""
        variable = u32s(data, 0, sum(1 for s in self._sizes if not s), where)
        lengths = iter(variable)
        at = 4 * len(variable)
        values = []
        for column, fixed in zip(self.columns, self._sizes, strict=True):
            size = fixed or next(lengths)
            if at + size > len(data):
                raise PackError(f"{where}: column {column.name!r} runs past the sample's end")
            values.append(_value(column, data[at : at + size], f"{where}, column {column.name!r}"))
            at += size
        if at != len(data):
            raise PackError(f"{where}: {len(data) - at} bytes after its last column")
        return values


def _sample_offsets(data: memoryview, samples: int, where: str) -> list[int]:
    """Where each sample of a shard starts, and the end of the last one; checked."""
    (count,) = u32s(data, 0, 1, where)
    if count != samples:
        raise PackError(f"{where}: holds {count} samples, but the index says {samples}")
    offsets = u32s(data, 4, count + 1, where)
    ordered = all(a <= b for a, b in itertools.pairwise(offsets))
    if offsets[0] < 4 * (count + 2) or not ordered or offsets[-1] != len(data):
        raise PackError(f"{where}: its table of sample offsets is damaged")
    return offsets
