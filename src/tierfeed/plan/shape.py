"""What a plan knows of a dataset: each sample's chunk and size, and optionally its class."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError

__all__ = ["DatasetShape"]


@dataclass(frozen=True)
class DatasetShape:
    """Samples in store order: ``sample_chunk`` is non-decreasing (chunks hold runs of samples).

    Attributes:
        sample_chunk: chunk id of each sample.
        sample_bytes: size of each sample in bytes.
        labels: class of each sample (-1 when unknown), for shuffle-quality metrics.
    """

    sample_chunk: npt.NDArray[np.int64]
    sample_bytes: npt.NDArray[np.int64]
    labels: npt.NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        if len(self.sample_chunk) != len(self.sample_bytes):
            raise ConfigError("sample_chunk and sample_bytes must have one entry per sample")
        if len(self.sample_chunk) and np.any(np.diff(self.sample_chunk) < 0):
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
        """First sample of every chunk, plus num_samples at the end."""
        return np.searchsorted(
            self.sample_chunk, np.arange(self.num_chunks + 1), side="left"
        ).astype(np.int64)
