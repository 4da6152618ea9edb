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

Partial shuffling in closed form: every rank has slots 0..n_r-1, initially holding its local
partition in order; slot indices never move, and only the first n_min (the smallest partition)
are ever exchanged. A keyed permutation of those slots is swept k = floor(q * n_min) at a time:
epoch t exchanges the slots at sweep positions [(t-1)k, tk) modulo n_min, so after e epochs a
slot at sweep position p has been exchanged c = ceil((e*k - p) / n_min) times (0 if negative).
The ranks sit on one keyed cycle pi (a Feistel permutation of the ranks); a slot's c-th
exchange moves its content d + s_c * g steps along it: d drawn per (count, block of the sweep),
s_c per count, g in [0, G) (G = min(32, M - 1)) per (count, class of the slot), all chosen so
that a step lies in [1, M - 1]. Each exchange is then a rotation of each (block, group)'s slots
along the cycle: one-to-one, no rank keeps its own, every rank sends and receives exactly k
samples, to and from at most 3G peers (a window of the sweep meets at most three blocks).
The content of slot (r, j) after c exchanges is the initial content of slot
(pi^-1(pi(r) - o), j), o the sum of its c steps: the groups and strides repeat with period 32
in c (a table per class), the draws are summed per block. One rank's plan at any epoch costs
O(N/M + 64 q e) time and O(N/M + 64 q e) memory, with no communication and no replay of
earlier epochs; slots of one rank part unless they share class and block.

What a plan is (`PlanSpec`) and the generations of the plans (`PLANS`): `plan/spec.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError
from tierfeed.plan.bijection import ROUNDS, feistel_invert, feistel_permute, mix
from tierfeed.plan.shape import DatasetShape
from tierfeed.plan.shuffle import (
    PURPOSE_ORDER,
    PURPOSE_RING,
    PURPOSE_SLOTS,
    local_bounds,
    rng_for,
    shuffle_samples,
)
from tierfeed.plan.spec import PLANS, PlanSpec, plans_match

__all__ = ["PLANS", "Exchange", "Plan", "PlanSpec", "plans_match"]

IntArray = npt.NDArray[np.int64]
_GROUPS = 32  # step groups per count in partial(q): a rank sends to at most 2x this many peers
_CLASSES = 1024  # slots of one class and one rank travel together in partial(q)
_PERIOD = 32  # counts after which a class's groups and the strides repeat
_BLOCKS = 64  # blocks of the sweep whose steps are drawn apart


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

    def _slot_words(self) -> npt.NDArray[np.uint64]:
        return self._words(0, PURPOSE_SLOTS, ROUNDS)  # fixed: the sweep order of the slots

    def _ring_words(self) -> npt.NDArray[np.uint64]:
        return self._words(0, PURPOSE_RING, ROUNDS + 3)  # the cycle's keys, then the steps'

    def _strides(self, world_size: int) -> IntArray:
        """The stride s_c between the groups' steps at count c, periodic in c:
        strides[(c - 1) % PERIOD], each in [1, (M - 1) // G]."""
        groups = min(_GROUPS, world_size - 1)
        words = mix(np.arange(_PERIOD, dtype=np.uint64), self._ring_words()[ROUNDS])
        return (words % np.uint64((world_size - 1) // groups)).astype(np.int64) + 1

    def _draws(self, counts: IntArray, blocks: IntArray, world_size: int) -> IntArray:
        """The draw d of each (count, block): the same for every slot of a block at that count,
        in [1, M - 1 - s_c (G - 1)], so a step d + s_c g (g < G) lies in [1, M - 1]."""
        groups = min(_GROUPS, world_size - 1)
        stride = self._strides(world_size)[(counts - 1) % _PERIOD]
        words = mix((counts * _BLOCKS + blocks).astype(np.uint64), self._ring_words()[ROUNDS + 2])
        room = (world_size - 1 - stride * (groups - 1)).astype(np.uint64)
        return (words % room).astype(np.int64) + 1

    def _group_table(self, world_size: int) -> IntArray:
        """groups[k, (c - 1) % PERIOD]: the group in [0, G) of a slot of class k at its c-th
        exchange (periodic in c, random otherwise)."""
        groups = min(_GROUPS, world_size - 1)
        words = mix(np.arange(_CLASSES * _PERIOD, dtype=np.uint64), self._ring_words()[ROUNDS + 1])
        return (words % np.uint64(groups)).astype(np.int64).reshape(_CLASSES, _PERIOD)

    def _steps(self, counts: IntArray, sweep: IntArray, world_size: int) -> IntArray:
        """The step along the cycle of each slot's ``counts``-th exchange (counts >= 1):
        d_c + s_c * group, the group drawn for the slot's class at that count."""
        at = (counts - 1) % _PERIOD
        group = self._group_table(world_size)[sweep % _CLASSES, at]
        draws = self._draws(counts, self._block(sweep, world_size), world_size)
        return draws + self._strides(world_size)[at] * group

    def _offsets(self, counts: IntArray, sweep: IntArray, world_size: int) -> IntArray:
        """The steps of every exchange of each slot so far, summed modulo ``world_size``: its
        content came from the rank that far back along the cycle."""
        top = int(counts.max(initial=0))
        base = np.zeros((_BLOCKS, top + 1), dtype=np.int64)  # the draws of counts 1..c, summed
        every = np.arange(1, top + 1, dtype=np.int64)
        blocks = np.arange(_BLOCKS, dtype=np.int64)[:, None]
        np.cumsum(self._draws(every[None, :], blocks, world_size), axis=1, out=base[:, 1:])
        base %= world_size
        # The group parts s_i * group repeat with period PERIOD in i: their running sums over
        # one period for every class, then c // PERIOD whole periods and the rest.
        table = np.zeros((_CLASSES, _PERIOD + 1), dtype=np.int64)
        terms = self._group_table(world_size) * self._strides(world_size)
        np.cumsum(terms, axis=1, out=table[:, 1:])
        k = sweep % _CLASSES
        periods, rest = np.divmod(counts, _PERIOD)
        group_sum: IntArray = periods % world_size * table[k, _PERIOD] + table[k, rest]
        return (base[self._block(sweep, world_size), counts] + group_sum) % world_size

    def _block(self, sweep: IntArray, world_size: int) -> IntArray:
        """The block of each sweep position: one epoch's window of k positions, modulo
        BLOCKS; a window meets at most three blocks (two, and block 0 where it wraps)."""
        return (sweep // max(1, self.exchange_size(world_size))) % _BLOCKS

    def _cycle(self, ranks: npt.ArrayLike, world_size: int, back: bool = False) -> IntArray:
        """Positions of ``ranks`` on the exchange cycle (or, ``back``, the ranks at
        positions)."""
        keys = self._ring_words()[:ROUNDS]
        return (feistel_invert if back else feistel_permute)(ranks, world_size, keys)

    def _swept(self, epoch: int, world_size: int) -> tuple[IntArray, IntArray, int]:
        """The sweep positions exchanged in ``epoch`` (>= 1), how many times each has been
        exchanged then (this time included), and the number of slots swept (n_min)."""
        k = self.exchange_size(world_size)
        n_min = int(np.diff(self._bounds(world_size)).min()) if k else 1
        covered = np.arange((epoch - 1) * k, epoch * k, dtype=np.int64)
        return covered % n_min, covered // n_min + 1, n_min

    def exchanged_slots(self, epoch: int, world_size: int) -> tuple[IntArray, IntArray]:
        """The slots every rank exchanges in ``epoch`` (>= 1) and how many times each has
        been exchanged then, this time included."""
        sweep, counts, n_min = self._swept(epoch, world_size)
        return feistel_invert(sweep, n_min, self._slot_words()), counts

    def _slot_offsets(self, epoch: int, world_size: int) -> IntArray:
        """How far back along the cycle the content of each of the first n_min slots came
        from by ``epoch`` (partial plans exchanging samples; the same for every rank)."""
        n_min = int(np.diff(self._bounds(world_size)).min())
        sweep = feistel_permute(np.arange(n_min), n_min, self._slot_words())
        counts = -((sweep - epoch * self.exchange_size(world_size)) // n_min)  # ceil, or 0
        return self._offsets(counts, sweep, world_size)

    def partition(self, epoch: int, rank: int, world_size: int) -> IntArray:
        """Samples rank ``rank`` holds in ``epoch`` (local, partial), in slot order."""
        bounds = self._bounds(world_size)
        n_r = int(bounds[rank + 1] - bounds[rank])
        src = np.full(n_r, rank, dtype=np.int64)
        if self.spec.policy == "partial" and self.exchange_size(world_size) > 0 and epoch > 0:
            offsets = self._slot_offsets(epoch, world_size)
            here = int(self._cycle([rank], world_size)[0])
            src[: len(offsets)] = self._cycle((here - offsets) % world_size, world_size, True)
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
        # Each sample's chunk by the runs the windows were cut from (the column's own value
        # where the samples are in chunk order).
        windows = slot[np.searchsorted(starts, samples, "right") - 1] // self.spec.window
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
        if not self.spec.shuffle:  # sequential: the store's order
            return np.asarray(positions, dtype=np.int64).copy()
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

    def order_size(self, epoch: int, world_size: int) -> int:
        """``len(order(epoch, rank, world_size))``, the same for every rank, without computing
        an order (cheap: no shuffle is computed)."""
        if self.spec.policy == "global":
            return self._per_rank(world_size)
        counts = self.counts(epoch, world_size)
        return min(counts) if self.spec.drop_last else max(counts)

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
        sweep, counts, n_min = self._swept(epoch, world_size)
        j = feistel_invert(sweep, n_min, self._slot_words())
        # Exchanged slots lie below the smallest partition: every rank's first n_min slots,
        # whose sources are one set of offsets along the cycle for all ranks.
        offsets = self._slot_offsets(epoch - 1, world_size)  # all 0 before the first
        here = self._cycle(np.arange(world_size), world_size)
        from_rank = self._cycle((here[:, None] - offsets[None, :]) % world_size, world_size, True)
        held = self._bounds(world_size)[from_rank] + np.arange(n_min, dtype=np.int64)
        # The step after which the sender no longer needs each sample in epoch - 1: its last
        # read (a padded order reads some samples twice).
        last_use = np.zeros(self.shape.num_samples, dtype=np.int64)
        for r in range(world_size):
            order = self.order(epoch - 1, r, world_size)
            np.maximum.at(last_use, order, np.arange(len(order)) // max(1, batch_size))
        dst = np.repeat(np.arange(world_size, dtype=np.int64), k)  # rank by rank, slot order
        step = np.tile(self._steps(counts, sweep, world_size), world_size)
        src = self._cycle((self._cycle(dst, world_size) - step) % world_size, world_size, True)
        sample = held[src, np.tile(j, world_size)]
        return Exchange(epoch, sample, src, dst, last_use[sample])


def _fit(order: IntArray, target: int) -> IntArray:
    if len(order) >= target:
        return order[:target]
    if len(order) == 0:
        raise ConfigError("a rank has no sample to pad from; use fewer ranks or drop_last")
    return np.resize(order, target)  # wraps around, as DistributedSampler pads
