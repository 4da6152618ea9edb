"""What a plan knows of a dataset: each sample's chunk and size, and optionally its class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError

__all__ = ["DatasetShape"]


_BLOCK = 1 << 24  # elements checked at a time: no temporary the size of the dataset


@dataclass(frozen=True)
class DatasetShape:
    """Samples in store order: ``sample_chunk`` is non-decreasing (chunks hold runs of samples).

    The arrays may be views of an index's mapped sections (any integer dtype): a plan reads
    only the part of them its rank needs.

    Attributes:
        sample_chunk: chunk id of each sample.
        sample_bytes: size of each sample in bytes (what `tierfeed simulate` counts), or None.
        labels: class of each sample (-1 when unknown), for shuffle-quality metrics.
        ordered: skip the check that ``sample_chunk`` is non-decreasing (an index's column:
            checked on open, or checked on use and not needed, plans reading the chunk runs
            through `chunk_starts`); otherwise it is checked here, a block at a time.
    """

    sample_chunk: npt.NDArray[np.integer[Any]]
    sample_bytes: npt.NDArray[np.int64] | None = None
    labels: npt.NDArray[np.integer[Any]] | None = None
    ordered: bool = field(default=False, repr=False, compare=False)  # an index's column

    def __post_init__(self) -> None:
        n = len(self.sample_chunk)
        if self.sample_bytes is not None and n != len(self.sample_bytes):
            raise ConfigError("sample_chunk and sample_bytes must have one entry per sample")
        if self.ordered:  # an index's column: no page of it is read here
            return
        for lo in range(0, max(0, n - 1), _BLOCK):
            block = self.sample_chunk[lo : lo + _BLOCK + 1]
            if np.any(block[1:] < block[:-1]):
                raise ConfigError("samples must be in chunk order (sample_chunk non-decreasing)")

    @classmethod
    def uniform(
        cls, num_samples: int, samples_per_chunk: int, sample_bytes: int = 110_000
    ) -> DatasetShape:
        """A synthetic shape: equal chunks of ``samples_per_chunk`` samples of equal size."""
        chunk = np.arange(num_samples, dtype=np.int64) // max(1, samples_per_chunk)
        return cls(chunk, np.full(num_samples, sample_bytes, dtype=np.int64))

    @property
    def num_samples(self) -> int:
        """Number of samples."""
        return len(self.sample_chunk)

    @property
    def num_chunks(self) -> int:
        """Number of chunks (ids are 0..num_chunks-1)."""
        return int(self.sample_chunk[-1]) + 1 if self.num_samples else 0

    def chunk_starts(self) -> npt.NDArray[np.int64]:
        """First sample of every chunk, plus num_samples at the end: from 0 to num_samples and
        non-decreasing whatever the column holds (an index checked on use has not checked its
        chunk order), so the chunks' runs always partition the samples and a plan built on
        them stays a permutation."""
        starts = self.first_samples(np.arange(self.num_chunks + 1))
        starts[0], starts[-1] = 0, self.num_samples
        return np.maximum.accumulate(starts)

    def first_samples(self, chunks: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The first sample of each of ``chunks`` (num_samples past the last): a binary search
        in the array's own dtype, so that numpy never copies the whole array to compare."""
        dtype = self.sample_chunk.dtype
        wanted = np.asarray(chunks, dtype=np.int64)
        top = np.iinfo(dtype).max
        found = np.searchsorted(
            self.sample_chunk, np.minimum(wanted, top).astype(dtype), side="left"
        ).astype(np.int64)
        return np.where(wanted > top, self.num_samples, found)
