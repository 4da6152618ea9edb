"""Sampling plans: pure functions of (shape, spec, epoch, world) returning numpy arrays.

Policies:
    global      one permutation of all samples per epoch, split across ranks with equal
                counts (DistributedSampler semantics: padded by wrapping, or drop_last).
    local       each rank owns a fixed partition, a contiguous run of the store balanced to
                the sample (floor or ceil of N/M; a chunk may be split at a run's ends),
                and permutes it each epoch.
    partial(q)  partial local shuffling (PLS): partitions evolve; each epoch every rank sends
                a random q-fraction of its partition to a peer and receives as many.
    chunkwise   (composes with the three) DIESEL's window shuffle instead of a full one.

Partial shuffling without history replay: every rank has slots 0..n_r-1, initially holding its
local partition in order. At epoch t a slot set J_t (k = floor(q * min n) indices drawn from
[0, min n)) is common to all ranks and split into G = min(M, 32) groups; each group g has its
own random ring sigma_{t,g} (one cycle through all ranks, a one-to-one matching; a keyed
Feistel permutation of the ranks, so one rank's sender is computed without the others):
slot (r, j) of group g receives what slot (sigma_{t,g}^-1(r), j) held, so a rank receives from
up to G peers and q = 1 mixes like a global shuffle. Slot indices never move, so the content
of slot (r, j) at epoch e is the initial content of slot (R, j), where R follows the inverse
rings back through the epochs t <= e with j in J_t. One rank's plan at epoch e costs
O(e * N/M) time and O(N/M) memory, with no communication, and every rank can compute every
other rank's plan and the whole exchange schedule.

`PLANS` names this generation of the local and partial plans; a loader state records it, and a
local or partial state saved under another generation is refused (its positions name other
samples).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError
from tierfeed.plan.bijection import ROUNDS, feistel_invert, feistel_permute
from tierfeed.plan.shape import DatasetShape
from tierfeed.plan.shuffle import (
    PURPOSE_ORDER,
    PURPOSE_RING,
    PURPOSE_SLOTS,
    local_bounds,
    rng_for,
    shuffle_samples,
)

__all__ = ["PLANS", "Exchange", "Plan", "PlanSpec"]

IntArray = npt.NDArray[np.int64]
POLICIES = ("global", "local", "partial")
# Generations of the local and partial plans: 1, partitions of whole chunks and rings drawn
# whole (states written before generations were recorded, before 2026-11-26); 2, partitions
# balanced to the sample and rings evaluated per rank. The global plan is the same in both.
PLANS = 2
_GROUPS = 32  # rings per epoch in partial(q): a rank receives from up to this many peers


@dataclass(frozen=True)
class PlanSpec:
    """A sampling policy: ``global``, ``local`` or ``partial`` with fraction ``q``.

    Attributes:
        policy: global, local or partial.
        q: fraction of each partition exchanged per epoch (partial only).
        window: chunk-wise shuffle in windows of this many chunks; 0 shuffles samples fully.
        drop_last: cut every rank to the smallest count instead of padding by wrapping.
        seed: the seed of every random choice.
    """

    policy: str = "global"
    q: float = 0.0
    window: int = 0
    drop_last: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown plan policy {self.policy!r}; use one of {POLICIES}")
        if not 0.0 <= self.q <= 1.0:
            raise ConfigError(f"partial fraction q must lie in [0, 1], got {self.q}")
        if self.window < 0:
            raise ConfigError(f"chunkwise window must be >= 0, got {self.window}")

    @classmethod
    def parse(cls, text: str, seed: int = 0, drop_last: bool = False) -> PlanSpec:
        """Read ``global``, ``local``, ``partial:0.3``, ``chunkwise:8`` (global + window) or
        combinations such as ``partial:0.1,chunkwise:4``."""
        policy, q, window = "global", 0.0, 0
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = re.fullmatch(r"(global|local|partial|chunkwise)(?::([0-9.]+))?", part)
            if m is None:
                raise ConfigError(
                    f"cannot read plan {text!r}: write global, local, partial:Q, chunkwise:K "
                    "or a policy and a window joined by a comma"
                )
            name, arg = m.group(1), m.group(2)
            if name == "chunkwise":
                window = int(arg or 8)
            else:
                policy = name
                q = float(arg) if name == "partial" and arg else q
        return cls(policy, q, window, drop_last, seed)

    def __str__(self) -> str:
        text = self.policy + (f":{self.q:g}" if self.policy == "partial" else "")
        return text + (f",chunkwise:{self.window}" if self.window else "")


@dataclass(frozen=True)
class Exchange:
    """Transfers that make the partitions of ``epoch``: each row one sample moving.

    ``step`` is the batch of epoch ``epoch - 1`` after which the sender no longer needs the
    sample (it has read it), so the transfer overlaps that epoch's training.
    """

    epoch: int
    sample: IntArray
    src: IntArray
    dst: IntArray
    step: IntArray


@dataclass
class Plan:
    """The plan of a dataset under a spec; every method is a pure function of its arguments."""

    shape: DatasetShape
    spec: PlanSpec = field(default_factory=PlanSpec)
    _bounds_of: dict[int, IntArray] = field(default_factory=dict, repr=False, compare=False)

    # --- partitions -------------------------------------------------------------------

    def _bounds(self, world_size: int) -> IntArray:
        if world_size > self.shape.num_samples and self.spec.policy != "global":
            raise ConfigError(
                f"{world_size} ranks but only {self.shape.num_samples} samples: local and "
                "partial plans give every rank a partition of at least one sample; use fewer "
                "ranks or the global plan"
            )
        if world_size not in self._bounds_of:
            self._bounds_of[world_size] = local_bounds(self.shape.num_samples, world_size)
        return self._bounds_of[world_size]

    def exchange_size(self, world_size: int) -> int:
        """Samples each rank sends (and receives) per epoch under partial(q)."""
        if self.spec.policy != "partial" or world_size < 2:
            return 0
        return int(self.spec.q * int(np.diff(self._bounds(world_size)).min()))

    def _senders(self, epoch: int, world_size: int, group: IntArray, rank: IntArray) -> IntArray:
        """The rank that each ``rank`` receives from in ring ``group`` of ``epoch``.

        Ring g is a keyed permutation pi of the ranks (`feistel_permute`, keys of its own)
        read as one cycle: pi[i] receives from pi[i - 1]. It is evaluated at the ranks asked
        about only, so tracing one rank's slots costs nothing per rank of the world.
        """
        groups = min(world_size, _GROUPS)
        words = self._words(epoch, PURPOSE_RING, groups * ROUNDS)
        keys = words.reshape(groups, ROUNDS).T[:, group]  # (ROUNDS, len(rank)): each its ring
        at = feistel_invert(rank, world_size, keys)  # where each rank sits on its ring
        return feistel_permute((at - 1) % world_size, world_size, keys)

    def _slot_set(self, epoch: int, world_size: int, n_min: int) -> tuple[IntArray, IntArray]:
        """The exchanged slots of ``epoch`` and the ring group of each."""
        k = self.exchange_size(world_size)
        rng = rng_for(self.spec.seed, epoch, PURPOSE_SLOTS)
        slots = rng.choice(n_min, k, replace=False)
        return slots, rng.integers(0, min(world_size, _GROUPS), size=k)

    def partition(self, epoch: int, rank: int, world_size: int) -> IntArray:
        """Samples rank ``rank`` holds in ``epoch`` (local, partial), in slot order."""
        bounds = self._bounds(world_size)
        n_r = int(bounds[rank + 1] - bounds[rank])
        src = np.full(n_r, rank, dtype=np.int64)
        if self.spec.policy == "partial" and self.exchange_size(world_size) > 0:
            n_min = int(np.diff(bounds).min())
            for t in range(epoch, 0, -1):  # trace back: the latest exchange first
                j, g = self._slot_set(t, world_size, n_min)
                src[j] = self._senders(t, world_size, g, src[j])
        return bounds[src] + np.arange(n_r, dtype=np.int64)

    # --- orders ------------------------------------------------------------------------

    def _per_rank(self, world_size: int) -> int:
        """Positions each rank reads in a global epoch: N/M rounded up (padded) or down
        (drop_last)."""
        n = self.shape.num_samples
        return n // world_size if self.spec.drop_last else -(-n // world_size)

    def _global_positions(self, rank: int, world_size: int) -> IntArray:
        """Positions of rank's share in the epoch's permutation padded to equal counts.

        Positions >= num_samples are padding: they wrap to the permutation's start, as
        DistributedSampler pads. drop_last cuts the permutation instead.
        """
        per = self._per_rank(world_size)
        if self.spec.window:  # chunk-wise: contiguous shares keep whole windows on a rank
            return np.arange(rank * per, (rank + 1) * per, dtype=np.int64)
        return np.arange(rank, per * world_size, world_size, dtype=np.int64)

    def _words(self, epoch: int, purpose: int, count: int) -> npt.NDArray[np.uint64]:
        """``count`` keys for the Feistel networks of ``epoch``'s ``purpose``."""
        seq = np.random.SeedSequence([self.spec.seed, epoch, purpose])
        return np.asarray(seq.generate_state(count, np.uint64), dtype=np.uint64)

    def _order_words(self, epoch: int) -> npt.NDArray[np.uint64]:
        return self._words(epoch, PURPOSE_ORDER, 8)

    def readers(
        self, epoch: int, samples: IntArray, world_size: int
    ) -> tuple[IntArray, IntArray, IntArray]:
        """Where ``samples`` are read in ``epoch`` of a global plan, without any rank's order:
        rows (sample, rank, index in that rank's order), one per read (a padded epoch reads a
        few samples twice, drop_last none of some). Sample-level: O(len(samples)), by the
        inverse of the shuffle's bijection; chunk-wise: O(chunks + the samples of the windows
        the samples fall in).

        Raises:
            ConfigError: the plan is not ``global``.
        """
        if self.spec.policy != "global":
            raise ConfigError(f"readers() needs a global plan, not {self.spec}")
        n = self.shape.num_samples
        samples = np.asarray(samples, dtype=np.int64)
        per = self._per_rank(world_size)
        end = per * world_size  # positions [0, end) are read; those >= n wrap (padding)
        if not n or not len(samples):
            first = samples.copy()
        elif self.spec.window:
            first = self._chunkwise_positions(epoch, samples)
        else:
            first = feistel_invert(samples, n, self._order_words(epoch))
        # The same permutation entry again at every wrap of the padding (more than once only
        # where the ranks outnumber the samples).
        wraps = np.arange(max(1, -(-end // max(1, n))), dtype=np.int64) * n
        position = (first[None, :] + wraps[:, None]).reshape(-1)
        sample = np.tile(samples, len(wraps))
        read = position < end
        position, sample = position[read], sample[read]
        if self.spec.window:  # chunk-wise: rank r reads the block [r*per, (r+1)*per)
            return sample, position // per, position % per
        return sample, position % world_size, position // world_size

    def _windows(self, epoch: int) -> tuple[IntArray, IntArray, IntArray]:
        """Chunk-wise: (chunk at each slot, first position of each window, chunk starts)."""
        starts = self.shape.chunk_starts()
        chunks = rng_for(self.spec.seed, epoch, PURPOSE_ORDER).permutation(self.shape.num_chunks)
        sizes = np.diff(starts)[chunks]
        window_of_slot = np.arange(len(chunks)) // self.spec.window
        window_start = np.zeros(int(window_of_slot[-1]) + 2, dtype=np.int64)
        np.cumsum(np.bincount(window_of_slot, weights=sizes).astype(np.int64), out=window_start[1:])
        return chunks, window_start, starts

    def _window_sequence(self, epoch: int, w: int, chunks: IntArray, starts: IntArray) -> IntArray:
        """Chunk-wise: the samples of window ``w`` in the order the epoch reads them."""
        members = chunks[w * self.spec.window : (w + 1) * self.spec.window]
        samples = np.concatenate([np.arange(starts[c], starts[c + 1]) for c in members])
        return rng_for(self.spec.seed, epoch, PURPOSE_ORDER, rank=w + 1).permutation(samples)

    def _chunkwise_positions(self, epoch: int, samples: IntArray) -> IntArray:
        """Chunk-wise: the position of each of ``samples`` in the epoch's permutation."""
        chunks, window_start, starts = self._windows(epoch)
        slot = np.empty(len(chunks), dtype=np.int64)
        slot[chunks] = np.arange(len(chunks))
        windows = slot[np.asarray(self.shape.sample_chunk[samples], dtype=np.int64)]
        windows //= self.spec.window
        out = np.empty(len(samples), dtype=np.int64)
        for w in np.unique(windows).tolist():
            sequence = self._window_sequence(epoch, w, chunks, starts)
            order = np.argsort(sequence, kind="stable")
            here = windows == w
            out[here] = window_start[w] + order[np.searchsorted(sequence[order], samples[here])]
        return out

    def _global_at(self, epoch: int, positions: IntArray) -> IntArray:
        """The epoch's global permutation at ``positions``, without building all of it.

        Sample-level: a keyed bijection of [0, N). Chunk-wise: a permutation of the chunks,
        and the samples of only the windows the positions fall in, each window shuffled by a
        generator of its own.
        """
        n = self.shape.num_samples
        if not self.spec.window:
            return feistel_permute(positions, n, self._order_words(epoch))
        chunks, window_start, starts = self._windows(epoch)
        windows = np.searchsorted(window_start, positions, side="right") - 1
        out = np.empty(len(positions), dtype=np.int64)
        for w in np.unique(windows).tolist():
            sequence = self._window_sequence(epoch, w, chunks, starts)
            here = windows == w
            out[here] = sequence[positions[here] - window_start[w]]
        return out

    def _unpadded(self, epoch: int, rank: int, world_size: int) -> IntArray:
        spec, shape = self.spec, self.shape
        if spec.policy == "global":
            positions = self._global_positions(rank, world_size)
            return self._global_at(epoch, positions[positions < shape.num_samples])
        rng = rng_for(spec.seed, epoch, PURPOSE_ORDER, rank)
        return shuffle_samples(self.partition(epoch, rank, world_size), shape, rng, spec.window)

    def order(self, epoch: int, rank: int, world_size: int) -> IntArray:
        """Sample ids rank ``rank`` reads in ``epoch``, in order, with equal counts per rank."""
        if self.spec.policy == "global":
            positions = self._global_positions(rank, world_size) % max(1, self.shape.num_samples)
            return self._global_at(epoch, positions)
        counts = self.counts(epoch, world_size)
        target = min(counts) if self.spec.drop_last else max(counts)
        return _fit(self._unpadded(epoch, rank, world_size), target)

    def counts(self, epoch: int, world_size: int) -> list[int]:
        """Unpadded samples per rank in ``epoch`` (cheap: no shuffle is computed)."""
        n = self.shape.num_samples
        if self.spec.policy == "global":  # O(M): positions below n, counted, not listed
            per = self._per_rank(world_size)
            r = np.arange(world_size, dtype=np.int64)
            if self.spec.window:  # rank r: positions [r*per, (r+1)*per)
                mine = np.clip(n - r * per, 0, per)
            else:  # rank r: positions r, r+M, ... below per*M
                mine = np.minimum(per, np.maximum(0, -(-(n - r) // world_size)))
            return [int(c) for c in mine]
        return [int(c) for c in np.diff(self._bounds(world_size))]

    # --- exchanges (partial) -----------------------------------------------------------

    def exchange(self, epoch: int, world_size: int, batch_size: int = 1) -> Exchange:
        """Every transfer that turns the partitions of ``epoch - 1`` into those of ``epoch``."""
        k = self.exchange_size(world_size)
        empty = np.zeros(0, dtype=np.int64)
        if epoch < 1 or k == 0:
            return Exchange(epoch, empty, empty, empty, empty)
        bounds = self._bounds(world_size)
        n_min = int(np.diff(bounds).min())
        j, g = self._slot_set(epoch, world_size, n_min)
        # Exchanged slots lie below the smallest partition: every rank's first n_min slots.
        held = np.stack(
            [self.partition(epoch - 1, r, world_size)[:n_min] for r in range(world_size)]
        )
        # The step after which the sender no longer needs each sample in epoch - 1: its last
        # read (a padded order reads some samples twice).
        last_use = np.zeros(self.shape.num_samples, dtype=np.int64)
        for r in range(world_size):
            order = self.order(epoch - 1, r, world_size)
            np.maximum.at(last_use, order, np.arange(len(order)) // max(1, batch_size))
        dst = np.repeat(np.arange(world_size, dtype=np.int64), k)  # rank by rank, slot order
        src = self._senders(epoch, world_size, np.tile(g, world_size), dst)
        sample = held[src, np.tile(j, world_size)]
        return Exchange(epoch, sample, src, dst, last_use[sample])


def _fit(order: IntArray, target: int) -> IntArray:
    if len(order) >= target:
        return order[:target]
    if len(order) == 0:
        raise ConfigError("a rank has no sample to pad from; use fewer ranks or drop_last")
    return np.resize(order, target)  # wraps around, as DistributedSampler pads
