"""Synthetic indexes of any size (no chunk data), for tests and benchmarks of the index itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tierfeed.format.index import IndexContent, write_index

__all__ = ["synthetic_index"]


def synthetic_index(path: Path, samples: int, per_chunk: int = 500, classes: int = 1000) -> None:
    """Write an index of ``samples`` one-member samples named ``cNNNN/SSSSSSSSS.jpg``.

    Member offsets and lengths are consistent with chunks of ``per_chunk`` samples, but no
    chunk file exists: the index alone is being exercised.
    """
    rng = np.random.Generator(np.random.PCG64(samples))
    length = rng.integers(1_000, 200_000, size=samples, dtype=np.int64).astype(np.uint64)
    chunk = (np.arange(samples) // per_chunk).astype(np.uint32)
    footprint = (length + np.uint64(512 + 511)) // np.uint64(512) * np.uint64(512)
    offset = np.zeros(samples, dtype=np.uint64)
    num_chunks = int(chunk[-1]) + 1 if samples else 0
    chunk_size = np.zeros(num_chunks, dtype=np.uint64)
    for c in range(num_chunks):
        lo, hi = c * per_chunk, min(samples, (c + 1) * per_chunk)
        ends = np.cumsum(footprint[lo:hi])
        offset[lo:hi] = ends - footprint[lo:hi] + np.uint64(512)
        chunk_size[c] = ends[-1] + np.uint64(1024)
    label = (np.arange(samples) * classes // max(samples, 1)).astype(np.int32)
    keys = [b"c%04d/%09d" % (lab, i) for i, lab in enumerate(label.tolist())]
    write_index(
        path,
        IndexContent(
            keys=keys,
            labels=label,
            member_start=np.arange(samples + 1, dtype=np.uint64),
            member_chunk=chunk,
            member_offset=offset,
            member_length=length,
            member_checksum=rng.integers(0, 2**63, size=samples, dtype=np.int64).astype(np.uint64),
            member_ext=np.zeros(samples, dtype=np.uint16),
            exts=[b".jpg"],
            chunk_names=[f"chunks/{c:06d}.tar" for c in range(num_chunks)],
            chunk_size=chunk_size,
            chunk_checksum=np.zeros(num_chunks, dtype=np.uint64),
            classes=[f"c{c:04d}" for c in range(classes)],
        ),
    )
