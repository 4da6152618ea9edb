"""LitData's ``json`` leaves: a list or dict of a sample, in LitData's compact binary layout
(``litdata/streaming/serializers.py``: ``_nested_dumps``), read back as the Python value.

A leaf whose first byte is above 0x20 is JSON text (older LitData). Otherwise its first byte is
a tag: 0 JSON text ``[u32 length][text]``; 1 strings, 2 int64s, 3 float64s, 4 bools, each
``[u32 count][items]`` (a string ``[u32 length][UTF-8]``, a bool one byte); 5 a dict
``[u32 count]`` then ``[key string][value]`` pairs; 6 records (a list of dicts of one key set)
``[u32 rows][u32 keys][key strings]`` then per row and key a value tagged 0x10 None, 0x11
string, 0x12 int64, 0x13 float64, 0x14 bool; 7 a string, 8 an int64, 9 a float64, 10 a bool,
11 None. Integers are little-endian.

Every count is checked against the bytes left before anything is made of that many items, and
nesting is bounded, so a damaged leaf is a `PackError`, never a runaway allocation.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from tierfeed.errors import PackError

__all__ = ["litdata_json"]

_MAX_DEPTH = 64
_SCALAR = {7: "str", 8: "<q", 9: "<d", 10: "bool", 11: "none"}
_ARRAYS = {2: "<i8", 3: "<f8"}
_RECORD = {0x10: 11, 0x11: 7, 0x12: 8, 0x13: 9, 0x14: 10}  # a record value's tag -> scalar tag


class _DamagedError(Exception):
    """The leaf ends early or holds a tag LitData does not write."""


class _Reader:
    def __init__(self, raw: bytes) -> None:
        self.raw, self.at = raw, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.raw):
            raise _DamagedError(f"needs {n} bytes at byte {self.at}, past its end")
        part = self.raw[self.at : self.at + n]
        self.at += n
        return part

    def u32(self) -> int:
        value: int = struct.unpack("<I", self.take(4))[0]
        return value

    def count(self, least_bytes_each: int) -> int:
        """A u32 count of items, each at least ``least_bytes_each`` bytes long."""
        n = self.u32()
        if n * least_bytes_each > len(self.raw) - self.at:
            raise _DamagedError(f"a count of {n} items at byte {self.at - 4} that cannot fit")
        return n

    def text(self) -> str:
        return self.take(self.u32()).decode("utf-8")

    def scalar(self, tag: int) -> Any:
        kind = _SCALAR[tag]
        if kind == "str":
            return self.text()
        if kind == "bool":
            return self.take(1) != b"\0"
        if kind == "none":
            return None
        return struct.unpack(kind, self.take(8))[0]

    def value(self, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise _DamagedError(f"nested deeper than {_MAX_DEPTH}")
        tag = self.take(1)[0]
        if tag in _SCALAR:
            return self.scalar(tag)
        if tag == 0:
            return json.loads(self.take(self.u32()))
        if tag == 1:
            return [self.text() for _ in range(self.count(4))]
        if tag in _ARRAYS:
            n = self.count(8)
            return np.frombuffer(self.take(8 * n), _ARRAYS[tag]).tolist()
        if tag == 4:
            return [b != 0 for b in self.take(self.count(1))]
        if tag == 5:
            return {self.text(): self.value(depth + 1) for _ in range(self.count(5))}
        if tag == 6:
            return self.records()
        raise _DamagedError(f"tag {tag} at byte {self.at - 1}, which LitData does not write")

    def records(self) -> list[dict[str, Any]]:
        rows = self.u32()
        keys = [self.text() for _ in range(self.count(4))]
        if rows and (not keys or rows * len(keys) > len(self.raw) - self.at):
            raise _DamagedError(f"{rows} records of {len(keys)} fields cannot fit")
        out = []
        for _ in range(rows):
            row = {}
            for key in keys:
                tag = _RECORD.get(self.take(1)[0])
                if tag is None:
                    raise _DamagedError(f"a record value's tag at byte {self.at - 1} is unknown")
                row[key] = self.scalar(tag)
            out.append(row)
        return out


def litdata_json(data: memoryview, where: str) -> Any:
    """The value of a LitData ``json`` leaf: JSON text as bytes (stored as it is), or the
    Python value of the compact layout.

    Raises:
        PackError: naming ``where``, for bytes that are neither.
    """
    raw = bytes(data)
    if raw[:1] > b"\x20":
        return raw  # JSON text, as older LitData wrote it
    reader = _Reader(raw)
    try:
        value = reader.value()
        if reader.at != len(raw):
            raise _DamagedError(f"{len(raw) - reader.at} bytes after its value")
    except (_DamagedError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PackError(
            f"{where}: not LitData's json layout ({exc}); the data is damaged"
        ) from None
    return value
