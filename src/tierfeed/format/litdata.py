"""Reading a LitData optimized dataset (``index.json`` and ``chunk-*.bin`` files) sample by
sample, for `tierfeed convert`.

The layout, as LitData 0.2 writes it with its default ``PyTreeLoader``
(``litdata/streaming/writer.py``, ``item_loader.py``, ``serializers.py``): ``index.json``
holds ``{"chunks": [{"filename", "chunk_bytes", "chunk_size", ...}], "config": {...}}``, the
config giving each leaf's serializer (``data_format``, such as ``"jpeg"`` or
``"no_header_numpy:1"``) and the sample's structure (``data_spec``, a PyTorch pytree spec as
JSON: a dict's keys, a tuple's length). A chunk is ``[count u32][count + 1 offsets u32]
[items]``, the offsets counted from the start of the file; an item is one u32 size per leaf,
then the leaves' bytes in order. All integers are little-endian, except the header of a
``tensor`` leaf, which is big-endian.

A leaf of a nested dict is the column ``outer.inner``; a tuple's items are the columns
``"0"``, ``"1"``, ...; a sample that is one value is the column ``""``. Chunks compressed
whole (``chunk-*.zstd.bin``) are inflated where zstd can be; LitData's framed compression,
encryption, and the token, Parquet and Arrow-table layouts are refused with what to do.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierfeed.errors import PackError
from tierfeed.format.litjson import litdata_json
from tierfeed.format.peercolumns import PeerColumn, decoded_utf8, safe_ext
from tierfeed.format.peerfiles import (
    INDEX_JSON,
    check_compression,
    count_in,
    decompress,
    entry,
    read_shard,
    shard_path,
)
from tierfeed.format.peervalues import array_of, image_list, pil_image, scalar, u32s

__all__ = ["LitDataDataset"]

_ARROW_MAGIC = b"LDARW01\0"  # the end of a chunk that carries its rows as an Arrow table
_REWRITE = (
    "read it with litdata.StreamingDataset and write its samples with tierfeed.Writer, or "
    "optimize it again without that option"
)
_UNZIPPED = "run litdata.optimize again without compression"
# numpy dtypes by LitData's index (constants._NUMPY_DTYPES_MAPPING; object and text refused)
_NUMPY = ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16", "?")
# numpy dtypes of torch's by LitData's index (_TORCH_DTYPES_MAPPING; 10, bfloat16, refused)
_TORCH = (
    *("f4", "f4", "f8", "f8", "c8", "c8", "c16", "c16", "f2", "f2", None, "u1", "i1", "i2"),
    *("i2", "i4", "i4", "i8", "i8", "?", "u2"),
)
# serializer -> (extension, holds integers) of the leaves stored as they are or as one value
_KINDS = {
    "str": ("txt", False),
    "text": ("txt", False),
    "int": ("json", True),
    "float": ("json", False),
    "bool": ("json", False),
    "pil": ("png", False),
    "jpeg": ("jpg", False),
    "bytes": ("bin", False),
    "numpy": ("npy", False),
    "no_header_numpy": ("npy", False),
    "tensor": ("npy", False),
    "no_header_tensor": ("npy", False),
    "json": ("json", False),
    "pickle": ("pkl", False),
    "pdf": ("pdf", False),
    "tiff": ("tiff", False),
    "tifffile": ("tiff", False),
}
# serializers that store a file's bytes, the extension after the colon (and without one)
_MEDIA = {"image": "jpg", "file": "bin", "video": "mp4", "audio": "wav", "nifti": "nii"}
_MEDIA |= {"mesh": "glb"}


@dataclass(frozen=True)
class _Chunk:
    path: Path
    size: int  # chunk_bytes: its size, uncompressed
    samples: int


def _column(name: str, fmt: object, where: str) -> PeerColumn:
    if not isinstance(fmt, str):
        raise PackError(f"{where}: a data_format entry is {fmt!r}, not a serializer's name")
    serializer, _, detail = fmt.partition(":")
    if serializer in _MEDIA:
        return PeerColumn(name, fmt, safe_ext(detail or _MEDIA[serializer]))
    if serializer == "jpeg_array":
        return PeerColumn(name, fmt, "jpg", many=True)
    kind = _KINDS.get(serializer)
    if kind is None:
        raise PackError(
            f"{where}: leaf {name!r} was written by LitData's {fmt!r} serializer, which tierfeed "
            f"does not convert; {_REWRITE}"
        )
    if serializer.startswith("no_header_"):
        _flat_dtype(fmt, where)  # refused before anything is written
    return PeerColumn(name, fmt, kind[0], integer=kind[1])


def _leaf_names(node: Any, path: list[str], out: list[str], where: str) -> None:
    """Append the column name of every leaf under the pytree spec ``node`` to ``out``."""
    if not isinstance(node, dict) or len(path) > 32:
        raise PackError(f"{where}: 'data_spec' is not a pytree spec LitData writes")
    kind, children = node.get("type"), node.get("children_spec")
    if kind is None:
        out.append(".".join(path))
        return
    if not isinstance(children, list):
        raise PackError(f"{where}: 'data_spec' is not a pytree spec LitData writes")
    if kind in ("builtins.dict", "collections.OrderedDict"):
        try:
            keys = json.loads(node.get("context") or "null")
        except ValueError:
            keys = None
        if not isinstance(keys, list) or len(keys) != len(children):
            raise PackError(f"{where}: 'data_spec' names a dict's keys wrongly")
        names = [str(k) for k in keys]
    elif kind in ("builtins.list", "builtins.tuple"):
        names = [str(i) for i in range(len(children))]
    else:
        raise PackError(
            f"{where}: its samples are {kind} values; tierfeed converts samples that are dicts, "
            f"lists, tuples or single values; {_REWRITE}"
        )
    for name, child in zip(names, children, strict=True):
        _leaf_names(child, [*path, name], out, where)


def _columns(config: Any, where: str) -> list[PeerColumn]:
    formats = entry(config, "data_format", list, where)
    try:
        spec = json.loads(entry(config, "data_spec", str, where))
    except (ValueError, RecursionError):
        raise PackError(f"{where}: 'data_spec' is not JSON") from None
    if not isinstance(spec, list) or len(spec) != 2 or spec[0] != 1:
        raise PackError(f"{where}: 'data_spec' is not a pytree spec LitData writes")
    names: list[str] = []
    _leaf_names(spec[1], [], names, where)
    if len(names) != len(formats) or not names:
        raise PackError(
            f"{where}: 'data_spec' has {len(names)} leaves, 'data_format' {len(formats)}"
        )
    return [_column(n, f, where) for n, f in zip(names, formats, strict=True)]


def _check_config(config: Any, where: str) -> str | None:
    """The whole-chunk compression, if any; PackError for what tierfeed does not read."""
    loader = config.get("item_loader")
    if loader not in (None, "PyTreeLoader"):
        raise PackError(
            f"{where}: written with LitData's {loader}, whose chunks tierfeed does not read "
            f"(it reads the default PyTreeLoader's); {_REWRITE}"
        )
    if config.get("encryption"):
        raise PackError(f"{where}: the chunks are encrypted; {_REWRITE}")
    compression: str | None = entry(config, "compression", (str, type(None)), where)
    level = config.get("compression_level")
    if compression is not None and level not in (None, "chunk"):
        raise PackError(
            f"{where}: compressed with {compression!r} in LitData's framed layout (compression_"
            f"level {level!r}), which tierfeed does not read; {_REWRITE}"
        )
    return compression


def _numpy(data: memoryview, where: str) -> Any:
    """``[dtype index u32][ndim u32][shape u32 each][values]``, LitData's ``numpy`` leaf."""
    code, ndim = u32s(data, 0, 2, where)
    shape = tuple(u32s(data, 8, ndim, where))
    dtype = _NUMPY[code] if code < len(_NUMPY) else None
    if dtype is None:
        raise PackError(
            f"{where}: an array of LitData dtype {code}, which tierfeed does not convert"
        )
    return array_of(data[8 + 4 * ndim :], np.dtype("<" + dtype), shape, where)


def _tensor(data: memoryview, where: str) -> Any:
    """``[dtype index u32][rank u32][shape u32 each][values]``, LitData's ``tensor`` leaf, its
    header big-endian: stored as a numpy array (npy)."""
    if len(data) < 8:
        raise PackError(f"{where}: a tensor's header is cut short; the data is damaged")
    code, rank = np.frombuffer(data[:8], ">u4").tolist()
    if 8 + 4 * rank > len(data):
        raise PackError(f"{where}: a tensor's shape runs past its bytes; the data is damaged")
    shape = tuple(np.frombuffer(data[8 : 8 + 4 * rank], ">u4").tolist())
    dtype = _TORCH[code] if code < len(_TORCH) else None
    if dtype is None:
        raise PackError(
            f"{where}: a tensor of torch dtype {code} (LitData's index), which numpy cannot hold"
        )
    return array_of(data[8 + 4 * rank :], np.dtype("<" + dtype), shape, where)


def _flat_dtype(fmt: str, where: str) -> np.dtype[Any]:
    """The dtype N of a ``no_header_numpy:N`` or ``no_header_tensor:N`` leaf."""
    table = _NUMPY if fmt.startswith("no_header_numpy") else _TORCH
    code = fmt.partition(":")[2]
    dtype = table[int(code)] if code.isdigit() and int(code) < len(table) else None
    if dtype is None:
        raise PackError(f"{where}: {fmt!r} names no dtype tierfeed converts")
    return np.dtype("<" + dtype)


def _flat(column: PeerColumn, data: memoryview, where: str) -> Any:
    """A ``no_header_numpy:N`` or ``no_header_tensor:N`` leaf: a 1-D array of dtype N."""
    dtype = _flat_dtype(column.encoding, where)
    return array_of(data, dtype, (len(data) // dtype.itemsize,), where)


def _value(column: PeerColumn, data: memoryview, where: str) -> Any:
    """The value of ``column`` whose bytes are ``data`` (`tierfeed.format.peercolumns`)."""
    serializer = column.encoding.partition(":")[0]
    if serializer in ("str", "text"):
        return decoded_utf8(data, where)
    if serializer in ("int", "float"):
        return scalar(data, "int64" if serializer == "int" else "float64", where)
    if serializer == "bool":
        return scalar(data, "bool", where)
    if serializer == "pil":
        return pil_image(data, where)
    if serializer == "numpy":
        return _numpy(data, where)
    if serializer == "tensor":
        return _tensor(data, where)
    if serializer.startswith("no_header_"):
        return _flat(column, data, where)
    if serializer == "json":
        return litdata_json(data, where)
    if column.many:
        return image_list(data, where)
    return data  # jpeg, bytes, pickle and the files of the media serializers, as they are


class LitDataDataset:
    """A LitData dataset in the directory ``src``, whose parsed ``index.json`` is ``index``.

    Raises:
        PackError: a layout tierfeed does not read (see the module), or a damaged index.
    """

    kind = "LitData"

    def __init__(self, src: Path, index: Any) -> None:
        self.src = src
        where = f"{src / INDEX_JSON}"
        config = entry(index, "config", dict, where)
        self._compression = _check_config(config, where)
        self.columns = _columns(config, where)
        chunks = entry(index, "chunks", list, where)
        if not chunks:
            raise PackError(f"{where}: lists no chunk; the dataset is empty")
        self._chunks = [_chunk(src, c, f"{where}, chunk {i}") for i, c in enumerate(chunks)]
        if self._compression is not None:  # refused before anything is written
            check_compression(self._compression, str(self._chunks[0].path), _UNZIPPED)
        self.samples = sum(c.samples for c in self._chunks)
        self.files = len(self._chunks)

    def __iter__(self) -> Iterator[tuple[str, list[Any]]]:
        for chunk in self._chunks:
            where = str(chunk.path)
            data = memoryview(self._read(chunk))
            ends = _item_offsets(data, chunk.samples, where)
            for j in range(chunk.samples):
                at = f"{where}, sample {j}"
                yield at, self._sample(data[ends[j] : ends[j + 1]], at)

    def _read(self, chunk: _Chunk) -> bytes:
        where = str(chunk.path)
        if self._compression is None:
            return read_shard(chunk.path, where, chunk.size)
        packed = read_shard(chunk.path, where, limit=chunk.size + chunk.size // 64 + 4096)
        return decompress(packed, self._compression, chunk.size, where, _UNZIPPED)

    def _sample(self, data: memoryview, where: str) -> list[Any]:
        """The leaf values of one item's bytes."""
        sizes = u32s(data, 0, len(self.columns), where)
        at = 4 * len(sizes)
        if at + sum(sizes) != len(data):
            raise PackError(
                f"{where}: its leaves take {sum(sizes)} bytes, but {len(data) - at} are stored; "
                "the data is damaged"
            )
        values = []
        for column, size in zip(self.columns, sizes, strict=True):
            values.append(_value(column, data[at : at + size], f"{where}, leaf {column.name!r}"))
            at += size
        return values


def _chunk(src: Path, chunk: Any, where: str) -> _Chunk:
    return _Chunk(
        path=shard_path(src, entry(chunk, "filename", str, where), where),
        size=count_in(chunk, "chunk_bytes", where),
        samples=count_in(chunk, "chunk_size", where),
    )


def _item_offsets(data: memoryview, samples: int, where: str) -> list[int]:
    """Where each item of a chunk starts, and the end of the last one; checked."""
    (count,) = u32s(data, 0, 1, where)
    if count != samples:
        raise PackError(f"{where}: holds {count} items, but the index says {samples}")
    offsets = u32s(data, 4, count + 1, where)
    ordered = all(a <= b for a, b in itertools.pairwise(offsets))
    arrow = bytes(data[-len(_ARROW_MAGIC) :]) == _ARROW_MAGIC
    if count and arrow and offsets[-1] == offsets[0]:
        raise PackError(
            f"{where}: its rows are stored as an Arrow table (LitData does so for samples of "
            f"text, numbers and lists alone, with pyarrow installed); {_REWRITE}"
        )
    end_ok = offsets[-1] == len(data) or (arrow and offsets[-1] < len(data))
    if offsets[0] != 4 * (count + 2) or not ordered or not end_ok:
        raise PackError(f"{where}: its table of item offsets is damaged")
    return offsets
