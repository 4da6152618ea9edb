"""What a source is told of a worker's reads: their chunks, this epoch's and the next ones',
the bytes of its chunk each of the rank's reads needs, and the samples it delivers first."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tierfeed.format.index import Index
from tierfeed.storage.store import Store

__all__ = [
    "EPOCHS_AHEAD",
    "byte_spans",
    "head_pays",
    "open_ahead",
    "tell_future",
    "tell_head",
]

IntArray = npt.NDArray[np.int64]

EPOCHS_AHEAD = 2  # epochs of future reads given to clairvoyant tiers


def tell_future(store: Store, rank: IntArray, ahead: list[IntArray]) -> None:
    """Clairvoyant tiers learn this worker's reads (``ahead``: its order of this epoch, then
    of the `EPOCHS_AHEAD` next ones): a copy made now also serves later epochs; and the rank's
    (``rank``) for this epoch, the order a copy fetches its pieces in. The rows of ``rank``
    and ``ahead[0]`` are checked already."""
    source, index = store.source, store.index
    chunk_of = np.asarray(index.sample_chunk)
    index.check_samples(np.concatenate([np.zeros(0, dtype=np.int64), *ahead[1:]]))
    reads = np.concatenate([chunk_of[o] for o in ahead])
    # A read's share of its chunk (headers included): a copy costs ~samples-per-chunk
    # reads of it.
    footprint = float(index.chunk_size.sum()) / max(1, len(index))
    # The whole rank's order (every worker's batches, as the Loader hands them out): a
    # copy this worker makes serves the other workers' reads of the chunk too. Told
    # before the future, whose prefetch starts the first copies.
    source.set_reads(chunk_of[rank], *byte_spans(index, rank))
    source.set_future(reads, read_bytes=footprint)


def tell_head(store: Store, samples: IntArray, every: bool = False) -> int:
    """The source learns the samples this worker delivers first (``samples``, rows checked),
    to read them at once (`ChunkSource.read_first`, ``every`` as it says); returns how many
    reads began."""
    index = store.index
    if not len(samples):
        return 0
    starts, ends = byte_spans(index, samples)
    start = index.sample_member_start
    members = np.asarray(start[samples + 1], dtype=np.int64) - np.asarray(start[samples])
    chunks = np.asarray(index.sample_chunk)[samples]
    return store.source.read_first(
        chunks.tolist(), starts.tolist(), ends.tolist(), members.tolist(), every
    )


def head_pays(store: Store, samples: IntArray) -> bool:
    """Whether `tell_head` would have ``samples`` (rows checked) read at once from an origin
    that bills requests (`ChunkSource.head_pays`)."""
    starts, ends = byte_spans(store.index, samples)
    chunks = np.asarray(store.index.sample_chunk)[samples]
    return store.source.head_pays(chunks.tolist(), starts.tolist(), ends.tolist())


def byte_spans(index: Index, samples: IntArray) -> tuple[IntArray, IntArray]:
    """Where each sample's bytes lie in its chunk: from its first member's start to its last
    member's end (the members of a sample lie together; a hint either way), so that a copy
    fetches every piece a read of the sample needs, not only the piece it starts in."""
    start = index.sample_member_start
    first = np.asarray(start[samples], dtype=np.int64)
    last = np.asarray(start[samples + 1], dtype=np.int64) - 1

    def span(members: IntArray) -> tuple[IntArray, ...]:
        begin = np.asarray(index.member_offset[members], dtype=np.int64)
        return begin, begin + np.asarray(index.member_length[members], dtype=np.int64)

    (begin0, end0), (begin1, end1) = span(first), span(last)
    return np.minimum(begin0, begin1), np.maximum(end0, end1)


def open_ahead(store: Store, order: IntArray, most: int | None = None) -> None:
    """Open the chunks of ``order``'s reads (the first ``most`` of them, if given), in order
    of first use, ahead of the reads: a stalled lookup or open (or an object store's client
    made) is paid off the read path."""
    chunks = np.asarray(store.index.sample_chunk)[order]
    _, first = np.unique(chunks, return_index=True)
    store.source.open_ahead(chunks[np.sort(first)][:most].tolist())
