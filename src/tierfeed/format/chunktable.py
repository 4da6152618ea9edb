"""An index's chunk table as `ChunkInfo`s, each made (and, on an index checked on use, its
row checked) when first asked for."""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from tierfeed.format.chunkref import ChunkInfo
from tierfeed.format.chunkroot import chunk_root, chunk_url
from tierfeed.format.indexcheck import check_chunk_rows, damaged
from tierfeed.format.rowcheck import name_check

__all__ = ["ChunkTable"]


class ChunkTable(Sequence[ChunkInfo]):
    """An index's chunks as `ChunkInfo`, each made when first asked for (and, for an index
    checked on use, its row checked then): O(1) to set up at any number of chunks, where a
    list of them all cost time in every process in proportion to the chunks.

    It holds views of the chunk table's sections, so it outlives `Index.close` as a list did.
    ``root`` is the directory the chunk names are relative to: the index's own, or the chunk
    root its header records (`tierfeed.format.chunkroot`); ``url`` the URL they are relative
    to instead, when the header records one (``root`` is then the index's directory).
    """

    def __init__(self, arrays: dict[str, Any], where: Path, recorded_root: str | None) -> None:
        self._a = {name: arrays[name] for name in _CHUNK_SECTIONS if name in arrays}
        self._where = where
        self.root = chunk_root(where, recorded_root)
        self.url = chunk_url(recorded_root)
        self.checked = False  # every row checked (the index's checks ran, or a stamp)
        self._made: dict[int, ChunkInfo] = {}
        self._rows_done: npt.NDArray[np.bool_] | None = None

    def rows_done(self) -> npt.NDArray[np.bool_]:
        """A flag a chunk: its row checked here or by `check_samples` (made on first use)."""
        if self._rows_done is None:
            self._rows_done = np.zeros(len(self), dtype=bool)
        return self._rows_done

    def __len__(self) -> int:
        return len(self._a["chunk_size"])

    @overload
    def __getitem__(self, i: int) -> ChunkInfo: ...

    @overload
    def __getitem__(self, i: slice) -> list[ChunkInfo]: ...

    def __getitem__(self, i: int | slice) -> ChunkInfo | list[ChunkInfo]:
        if isinstance(i, slice):
            return [self[c] for c in range(*i.indices(len(self)))]
        c = operator.index(i)
        info = self._made.get(c)
        if info is not None:
            return info
        n = len(self)
        if not -n <= c < n:
            raise IndexError(f"chunk {c} out of range [0, {n})")
        c %= n
        if not self.checked and not self.rows_done()[c]:
            check_chunk_rows(self._a, self._where, np.array([c], dtype=np.int64))
            self.rows_done()[c] = True
        a = self._a
        lo, hi = int(a["chunk_name_offset"][c]), int(a["chunk_name_offset"][c + 1])
        raw = a["chunk_names"][lo:hi].tobytes()
        if (
            not self.checked
            and "chunk_check" in a
            and name_check(raw) != int(a["chunk_check"][c]) >> 32
        ):
            raise damaged(self._where, f"the name of chunk {c} does not match its check")
        name = os.fsdecode(raw)
        info = ChunkInfo(c, name, int(a["chunk_size"][c]), int(a["chunk_checksum"][c]))
        self._made[c] = info  # (two threads making one entry make equal ones)
        return info

    def total_size(self) -> int:
        """The chunks' bytes in all, exactly (vectorised, making no entry; the sizes as the
        index gives them: each chunk's is checked against its file on use)."""
        return int(self._a["chunk_size"].sum(dtype=np.int64))


# What `ChunkTable` keeps views of (the member sections for their dtype only; the row checks
# where the index has them).
_CHUNK_SECTIONS = (
    "chunk_name_offset",
    "chunk_names",
    "chunk_size",
    "chunk_checksum",
    "member_offset",
    "member_length",
    "chunk_check",
)
