"""Head reads: the samples a worker delivers first whose chunks' copies cannot begin at once,
read at once as exact ranges, and served once each."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tierfeed.errors import StorageError
from tierfeed.format.index import Index
from tierfeed.loader.clairvoyance import byte_spans, head_pays, tell_head
from tierfeed.loader.coldstart import ColdStart
from tierfeed.loader.compose import open_store
from tierfeed.storage import MemoryDriver, PosixDriver, Tier, TierStack
from tierfeed.storage.headreads import HEAD_GETS, HEAD_THREADS
from tierfeed.storage.tiers import TierOptions

PIECE = 8 * 1024


def on_head_thread() -> bool:
    """Whether this read is a head read (they run on the tierfeed-head threads; a copy's
    pieces on the tierfeed-fetch ones, both through `Driver.read_block`)."""
    return threading.current_thread().name.startswith("tierfeed-head")


class SlowPieces(PosixDriver):
    """An origin whose copies' pieces take ``piece_s`` each, while a head read or a plain
    ranged read is fast; it can fail its next ``fail`` head reads."""

    piece_s = 0.0
    fail = 0

    def read_block(self, name: str, offset: int, length: int) -> bytes:
        if not on_head_thread():
            time.sleep(self.piece_s)
        elif self.fail:
            self.fail -= 1
            raise StorageError(f"{name}: injected failure")
        return super().read_block(name, offset, length)


def _stack(store_dir: Path, origin: PosixDriver, piece: int = PIECE) -> TierStack:
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    options = TierOptions(threads=1, urgent_copies=8, piece_bytes=piece, landing_wait_s=5)
    return TierStack(Index(store_dir).chunks(), origin, [ram], options=options)


def _late(store_dir: Path, stack: TierStack) -> np.ndarray:
    """The samples, in store order, of the chunks past those whose copies start together."""
    chunk_of = np.asarray(Index(store_dir).sample_chunk)
    assert chunk_of.max() >= stack.filler.copies_at_once  # the store has late chunks
    return np.flatnonzero(chunk_of >= stack.filler.copies_at_once)


def _every(store_dir: Path) -> np.ndarray:
    return np.arange(Index(store_dir).num_samples, dtype=np.int64)


def test_the_head_is_served_from_its_own_reads_not_from_the_slow_copies(
    store_dir: Path,
) -> None:
    origin = SlowPieces(store_dir, read_only=True)
    origin.piece_s = 1.0  # a copy's piece: a second; a sample alone: at once
    with _stack(store_dir, origin) as stack, open_store(store_dir, source=stack) as store:
        late = _late(store_dir, stack)
        # More chunks than copies that start together: the whole head is read at once.
        assert tell_head(store, _every(store_dir)) == len(_every(store_dir))
        started = time.monotonic()
        samples = [store.read_sample(int(i)) for i in late]
        took = time.monotonic() - started
        expected = {int(i): open_store(store_dir).read_sample(int(i)) for i in late}
        assert all(s.fields == expected[int(i)].fields for i, s in zip(late, samples, strict=True))
        assert took < 0.5  # not a piece's second
        assert stack.origin_counters.hits == len(_every(store_dir))  # a request a sample


def test_a_head_whose_chunks_copies_all_start_at_once_reads_nothing_ahead(
    store_dir: Path,
) -> None:
    origin = PosixDriver(store_dir, read_only=True)
    with _stack(store_dir, origin) as stack, open_store(store_dir, source=stack) as store:
        chunk_of = np.asarray(store.index.sample_chunk)
        early = np.flatnonzero(chunk_of < stack.filler.copies_at_once)  # as many chunks
        assert tell_head(store, early) == 0
        assert stack.head.pending == 0


def test_a_held_chunk_is_not_read_ahead(store_dir: Path) -> None:
    origin = SlowPieces(store_dir, read_only=True)
    with _stack(store_dir, origin) as stack, open_store(store_dir, source=stack) as store:
        stack.read_range(0, 0, 10)
        stack.drain(timeout=30)  # chunk 0 copied into RAM: its samples are not read ahead
        chunk_of = np.asarray(store.index.sample_chunk)
        assert tell_head(store, _every(store_dir)) == int((chunk_of != 0).sum())


def test_a_failed_head_read_is_read_again_the_ordinary_way(store_dir: Path) -> None:
    origin = SlowPieces(store_dir, read_only=True)
    origin.fail = 1  # the first head read fails; the sample's read goes on and succeeds
    with _stack(store_dir, origin) as stack, open_store(store_dir, source=stack) as store:
        assert tell_head(store, _every(store_dir)) == len(_every(store_dir))
        mine = open_store(store_dir)
        for i in _every(store_dir):  # whichever head read failed, its sample is read again
            assert store.read_sample(int(i)).fields == mine.read_sample(int(i)).fields
        assert origin.fail == 0


class Billed(PosixDriver):
    costly_requests = True  # as an object store's: one GET a piece


def _pieces(store_dir: Path, head: np.ndarray, piece: int) -> int:
    """The pieces of the chunks ``head`` falls in: the GETs their copies make."""
    index = Index(store_dir)
    chunks = np.unique(np.asarray(index.sample_chunk)[head])
    sizes = np.asarray(index.chunk_size, dtype=np.int64)[chunks]
    return int((-(-sizes // piece)).sum())


def test_an_origin_that_bills_requests_reads_no_head_of_a_few_pieces(store_dir: Path) -> None:
    head, piece = _every(store_dir), 64 * 1024  # a piece a chunk: fewer GETs than the head's
    assert _pieces(store_dir, head, piece) < 4 * len(head)
    billed = Billed(store_dir, read_only=True)
    with _stack(store_dir, billed, piece) as stack, open_store(store_dir, source=stack) as store:
        assert tell_head(store, head) == 0
        assert stack.head.pending == 0


def test_an_origin_that_bills_requests_reads_the_head_of_many_pieces(store_dir: Path) -> None:
    # The copies would make four GETs or more for each of the head's: its own are worth it
    # (a user-sized store, where the first batch would wait for every copy whole).
    head, piece = _every(store_dir)[::8], 512
    assert _pieces(store_dir, head, piece) >= 4 * len(head)
    billed = Billed(store_dir, read_only=True)
    with _stack(store_dir, billed, piece) as stack, open_store(store_dir, source=stack) as store:
        assert tell_head(store, head) == len(head)
        expected = open_store(store_dir)
        for i in head:  # served from the head reads, as on a file system
            assert store.read_sample(int(i)).fields == expected.read_sample(int(i)).fields
        assert stack.head.pending == 0


def test_head_spans_cover_each_sample_and_count_its_members(store_dir: Path) -> None:
    seen: list[tuple[list[int], list[int], list[int], list[int], bool]] = []

    with _stack(store_dir, PosixDriver(store_dir, read_only=True)) as stack:
        stack.read_first = lambda *args: seen.append(args) or 0  # type: ignore[method-assign]
        with open_store(store_dir, source=stack) as store:
            ids = np.array([5, 2, 9], dtype=np.int64)
            tell_head(store, ids)
            index = store.index
            chunks, starts, ends, members, every = seen[0]
            assert not every  # read where it pays (`TierStack.read_first`)
            assert chunks == np.asarray(index.sample_chunk)[ids].tolist()
            assert (starts, ends) == tuple(a.tolist() for a in byte_spans(index, ids))
            for i, sample in enumerate(ids):
                ms = list(index.members(int(sample)))
                assert members[i] == len(ms)
                for m in ms:  # every member's bytes inside its sample's span
                    lo = int(index.member_offset[m])
                    assert starts[i] <= lo and lo + int(index.member_length[m]) <= ends[i]


def test_close_joins_the_head_reads(store_dir: Path) -> None:
    origin = SlowPieces(store_dir, read_only=True)
    stack = _stack(store_dir, origin)
    with open_store(store_dir, source=stack) as store:
        tell_head(store, np.arange(store.index.num_samples, dtype=np.int64))
    stack.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("tierfeed-head")]


def test_a_head_spread_over_large_pieces_is_read_ahead(store_dir: Path) -> None:
    """Every copy may start at once, but the head's samples fall in pieces many times their
    own bytes (one sample per chunk, pieces of a whole chunk): the copies would fetch all of
    them before the batch is whole, so the head is read as exact ranges."""
    origin = PosixDriver(store_dir, read_only=True)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    options = TierOptions(threads=1, urgent_copies=1000, piece_bytes=1 << 20)
    chunks = Index(store_dir).chunks()
    with (
        TierStack(chunks, origin, [ram], options=options) as stack,
        open_store(store_dir, source=stack) as store,
    ):
        chunk_of = np.asarray(store.index.sample_chunk)
        assert chunk_of.max() + 1 <= stack.filler.copies_at_once
        firsts = np.unique(chunk_of, return_index=True)[1].astype(np.int64)  # one a chunk
        assert tell_head(store, firsts) == len(firsts)


def test_pieces_wait_for_the_head_reads_in_flight_within_a_bound(store_dir: Path) -> None:
    """A copy's pieces share the link with the head reads, and the first batch waits for all
    of them: a piece starts after the head reads end, or after their bound at most."""
    origin = SlowPieces(store_dir, read_only=True)
    with _stack(store_dir, origin) as stack:
        fetch = stack.fetch
        fetch.heads_begin(1)
        started = time.monotonic()
        threading.Timer(0.1, fetch.heads_end).start()
        fetch.requests.after_heads()  # a piece's request waits here
        assert 0.08 <= time.monotonic() - started < 0.25
        fetch.heads_begin(1)  # never ends: the bound (0.3 s) lets pieces go
        started = time.monotonic()
        fetch.requests.after_heads()
        assert 0.25 <= time.monotonic() - started < 1.0
        fetch.heads_end()


def test_an_object_stores_head_is_requested_at_once(store_dir: Path) -> None:
    # Each GET of the head waits out its latency: the head's GETs are in flight together
    # (`HEAD_GETS`), not a file system's `HEAD_THREADS` at a time.
    class Latent(Billed):
        lock = threading.Lock()
        inflight = most = 0

        def read_block(self, name: str, offset: int, length: int) -> bytes:
            if on_head_thread():
                with self.lock:
                    self.inflight += 1
                    self.most = max(self.most, self.inflight)
                time.sleep(0.3)
                with self.lock:
                    self.inflight -= 1
            return super().read_block(name, offset, length)

    head, piece = _every(store_dir)[::3], 256
    assert len(head) > HEAD_THREADS and _pieces(store_dir, head, piece) >= 4 * len(head)
    origin = Latent(store_dir, read_only=True)
    with _stack(store_dir, origin, piece) as stack, open_store(store_dir, source=stack) as store:
        assert tell_head(store, head) == len(head)
        for i in head:
            store.read_sample(int(i))
    assert HEAD_THREADS < origin.most <= HEAD_GETS  # more than a file system's at a time


@pytest.mark.parametrize("piece", [64 * 1024, 512])
def test_the_loader_reads_its_first_batch_from_a_billed_origin_where_a_head_pays(
    store_dir: Path, piece: int
) -> None:
    # The training process reads the first batch itself (`tierfeed.loader.opening`) from an
    # object store only where a worker would read it at once: a GET a sample, worth it where
    # the copies would make four or more for each; from a file system always.
    head = _every(store_dir)[::8]
    pays = _pieces(store_dir, head, piece) >= 4 * len(head)
    assert pays == (piece == 512)
    for origin in (Billed(store_dir, read_only=True), PosixDriver(store_dir, read_only=True)):
        with _stack(store_dir, origin, piece) as stack:
            store = open_store(store_dir, source=stack)
            cold = ColdStart(store, lambda: head)
            assert cold.opens(len(head)) == (pays or not origin.costly_requests)
            if origin.costly_requests:
                assert head_pays(store, head) == pays
            cold.stop()  # never started: closes the stack
