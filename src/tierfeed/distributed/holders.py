"""Who holds which sample after stage-in: pure functions of the dataset shape, plan and world.

Every rank computes the same answer without talking to the others, which is what lets every
rank schedule every exchange ahead of time.

Partition plans (``local``, ``partial``) cut the store into runs balanced to the sample, so a
run may begin or end inside a chunk. A chunk inside one rank's run is staged whole by that
rank; a chunk cut between ranks is *split*: each of its ranks stages the members of its own
samples (a part, kept beside the rank's inbox), and no node holds it whole. At most M - 1
chunks are split. ``global`` keeps whole chunks: contiguous runs balanced by bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tierfeed.plan import DatasetShape, PlanSpec
from tierfeed.plan.shuffle import local_bounds
from tierfeed.world import World

__all__ = ["SPLIT", "Part", "SampleHolders", "chunk_holders"]

IntArray = npt.NDArray[np.int64]
SPLIT = -1  # the holder of a chunk cut between ranks: each holds its own samples of it


def chunk_holders(
    shape: DatasetShape, chunk_bytes: npt.ArrayLike, spec: PlanSpec, world_size: int
) -> IntArray:
    """The rank that stages (copies from the origin, then serves) each chunk whole, or
    `SPLIT` for a chunk whose samples begin the partitions of several ranks.

    Partition plans (``local``, ``partial``): the rank whose initial partition holds the
    chunk, so that each rank starts with its own partition on local storage. ``global``:
    contiguous runs of chunks balanced by bytes (a chunk goes to the rank its middle byte
    falls to).
    """
    sizes = np.asarray(chunk_bytes, dtype=np.int64)
    if spec.policy in ("local", "partial"):
        bounds = local_bounds(shape.num_samples, world_size)
        starts = shape.first_samples(np.arange(len(sizes) + 1))
        first = np.searchsorted(bounds, starts[:-1], side="right") - 1
        last = np.searchsorted(bounds, np.maximum(starts[1:] - 1, starts[:-1]), side="right") - 1
        first, last = np.clip(first, 0, world_size - 1), np.clip(last, 0, world_size - 1)
        return np.where(first == last, first, SPLIT).astype(np.int64)
    total = max(1, int(sizes.sum()))
    middle = np.cumsum(sizes) - sizes / 2.0
    return np.minimum((middle * world_size // total).astype(np.int64), world_size - 1)


@dataclass(frozen=True)
class Part:
    """The samples ``[first, end)`` of chunk ``chunk`` that one rank stages (a split chunk)."""

    chunk: int
    first: int
    end: int


@dataclass(frozen=True)
class SampleHolders:
    """Where each sample lives after stage-in, and what each rank can read without a peer.

    Attributes:
        holder: per chunk, the rank that staged it whole, or `SPLIT`.
        shape: the samples' chunks.
        bounds: partition plans: rank r staged samples [bounds[r], bounds[r+1]) (None for
            ``global``, whose holders are whole chunks).
        local_world_size: ranks per node (they share the node's staged chunks).
        per_rank: partition plans: a rank reads only its own staged chunks, since it deletes
            what it sends to peers (ranks of a node do not share a partition).
    """

    holder: IntArray
    shape: DatasetShape
    bounds: IntArray | None = None
    local_world_size: int = 1
    per_rank: bool = False

    @classmethod
    def of(
        cls, shape: DatasetShape, chunk_bytes: npt.ArrayLike, spec: PlanSpec, world: World
    ) -> SampleHolders:
        """Who holds what in a job: ``world`` gives the ranks and the ranks per node."""
        holder = chunk_holders(shape, chunk_bytes, spec, world.world_size)
        partitions = spec.policy in ("local", "partial")
        bounds = local_bounds(shape.num_samples, world.world_size) if partitions else None
        return cls(holder, shape, bounds, world.local_world_size, spec.policy == "partial")

    def node_of(self, rank: int | IntArray) -> IntArray:
        """Node index of ``rank`` (ranks are laid out node by node)."""
        return np.asarray(rank, dtype=np.int64) // self.local_world_size

    def local_to(self, rank: int) -> npt.NDArray[np.bool_]:
        """Per chunk: can ``rank`` read it whole from its node's local storage?"""
        if self.per_rank:
            return np.asarray(self.holder == rank, dtype=bool)
        whole = self.holder != SPLIT
        return np.asarray(whole & (self.node_of(self.holder) == self.node_of(rank)), dtype=bool)

    def sample_holder(self, samples: IntArray) -> IntArray:
        """The rank that staged each of ``samples`` (whole chunk or part)."""
        samples = np.asarray(samples, dtype=np.int64)
        if self.bounds is None:
            return np.asarray(self.holder[self.shape.sample_chunk[samples]], dtype=np.int64)
        return (np.searchsorted(self.bounds, samples, side="right") - 1).astype(np.int64)

    def local_to_ranks(self, ranks: IntArray, samples: IntArray) -> npt.NDArray[np.bool_]:
        """Per row: can rank ``ranks[i]`` read sample ``samples[i]`` from local storage?"""
        ranks, samples = np.asarray(ranks, np.int64), np.asarray(samples, np.int64)
        holder = self.holder[self.shape.sample_chunk[samples]]
        whole = holder != SPLIT
        same = self.node_of(holder) == self.node_of(ranks)  # a node's ranks share its chunks
        here = holder == ranks if self.per_rank else same
        in_part = ~whole & (self.sample_holder(samples) == ranks)
        return np.asarray((whole & here) | in_part, dtype=bool)

    def samples_staged_by(self, rank: int) -> IntArray:
        """The samples ``rank`` copies from the origin (its whole chunks and its parts), in
        store order. O(its samples + chunks)."""
        chunks = self.staged_by(rank)
        firsts = self.shape.first_samples(chunks)
        ends = self.shape.first_samples(chunks + 1)
        runs = [np.arange(lo, hi, dtype=np.int64) for lo, hi in zip(firsts, ends, strict=True)]
        runs += [np.arange(q.first, q.end, dtype=np.int64) for q in self.parts_of(rank)]
        if not runs:
            return np.zeros(0, dtype=np.int64)
        return np.sort(np.concatenate(runs))

    def local_samples(self, rank: int, samples: IntArray) -> npt.NDArray[np.bool_]:
        """Per sample of ``samples``: can ``rank`` read it from local storage (a whole chunk
        of its node, or its own part of a split chunk)?"""
        samples = np.asarray(samples, dtype=np.int64)
        return self.local_to_ranks(np.full(len(samples), rank, dtype=np.int64), samples)

    def staged_by(self, rank: int) -> IntArray:
        """Chunk ids ``rank`` copies whole from the origin during stage-in."""
        return np.flatnonzero(self.holder == rank).astype(np.int64)

    def parts_of(self, rank: int) -> list[Part]:
        """The parts of split chunks ``rank`` copies from the origin during stage-in."""
        if self.bounds is None:
            return []
        lo, hi = int(self.bounds[rank]), int(self.bounds[rank + 1])
        if lo == hi:
            return []
        out = []
        for chunk in sorted(
            {int(self.shape.sample_chunk[lo]), int(self.shape.sample_chunk[hi - 1])}
        ):
            if self.holder[chunk] != SPLIT:
                continue
            first, end = self.shape.first_samples([chunk, chunk + 1]).tolist()
            out.append(Part(chunk, max(lo, first), min(hi, end)))
        return out
