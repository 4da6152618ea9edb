"""The feed without torch: built from one FeedConfig, a Loader's view made by for_loader."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.format.conftest import write_tree
from tierfeed.config import world_for
from tierfeed.errors import ConfigError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader import DeadlineOptions
from tierfeed.loader.compose import StoreOpener, plan_for
from tierfeed.loader.feed import Feed, FeedConfig
from tierfeed.loader.resume import Resume
from tierfeed.plan.progress import Done
from tierfeed.storage.store import Sample

N = 40


def key(sample: Sample) -> str:
    return sample.key


@pytest.fixture
def feed(tmp_path: Path) -> Feed:
    write_tree(tmp_path / "src", {f"d/s{i:03d}.txt".encode(): b"x" * (50 + i) for i in range(N)})
    pack(tmp_path / "src", tmp_path / "store", PackOptions(chunk_size=4096, progress=False))
    opener = StoreOpener(tmp_path / "store")
    # The plan's exact order (the guard off): a resumed iteration is compared with a whole one.
    exact = DeadlineOptions(enabled=False)
    config = FeedConfig(
        batch_size=8, decode=key, collate=list, world=world_for(0, 1), deadline=exact
    )
    return Feed(opener, plan_for(opener.index(), "global"), config)


def keys(batches: object) -> list[str]:
    return [k for batch in batches for k in batch.data]  # type: ignore[attr-defined]


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        FeedConfig(batch_size=0, decode=key, collate=list, world=world_for(0, 1))


@pytest.mark.timeout(60)
def test_a_loaders_view_runs_on_resumes_once_and_leaves_the_feed_as_it_was(feed: Feed) -> None:
    try:
        first = keys(feed.iterate(0, 1, in_worker=False))
        assert sorted(first) == sorted(set(first)) and len(first) == N
        view = feed.for_loader(Resume(0, done=Done(prefix=16)))
        assert view.continuous and not feed.continuous
        assert view.config.read_across_epochs and not feed.config.read_across_epochs
        feed.set_epoch(0)
        assert view.epoch == 0  # one epoch, shared
        # The resumed epoch reads the positions not done, then runs on into the next epoch.
        rest = keys(itertools.islice(view.iterate(0, 1, in_worker=False), (N - 16) // 8))
        assert rest == first[16:]
        # Applied once: the view's next iteration reads its epoch whole.
        assert len(keys(itertools.islice(view.iterate(0, 1, in_worker=False), N // 8))) == N
        assert feed.num_batches() == N // 8
        assert feed.num_batches(0, Resume(0, done=Done(prefix=16))) == N // 8
    finally:
        feed.close()


@pytest.mark.timeout(60)
def test_each_epoch_tells_the_source_its_first_batch_and_a_resume_its_next(
    feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[list[int]] = []

    def read_first(self: object, chunks: list[int], *rest: object) -> int:
        told.append(list(chunks))
        return 0

    monkeypatch.setattr(type(feed.store().source), "read_first", read_first)
    try:
        chunk_of = feed.store().index.sample_chunk
        order = feed.worker_order(0, 1, 0)
        list(feed.iterate(0, 1, in_worker=False))
        assert told == [[int(chunk_of[i]) for i in order[:8]]]  # its first batch's samples
        view = feed.for_loader(Resume(0, done=Done(prefix=16)))
        next(iter(view.iterate(0, 1, in_worker=False)))
        assert told[1] == [int(chunk_of[i]) for i in order[16:24]]  # where it resumes
    finally:
        feed.close()


@pytest.mark.timeout(60)
def test_a_resume_tells_a_clairvoyant_source_only_the_reads_it_has_left(
    feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy fetches its pieces in the order of the reads it is told: after a resume, the
    samples delivered before it must not be among them, or the first batch waits for pieces
    nobody reads."""
    told: list[list[int]] = []
    source = type(feed.store().source)
    monkeypatch.setattr(source, "uses_future", True)
    monkeypatch.setattr(source, "set_future", lambda self, *a, **k: None)
    monkeypatch.setattr(source, "set_reads", lambda self, chunks, *a: told.append(list(chunks)))
    try:
        chunk_of = feed.store().index.sample_chunk
        rank = feed.rank_order(0)
        next(iter(feed.iterate(0, 1, in_worker=False)))
        assert told == [[int(chunk_of[i]) for i in rank]]  # a fresh epoch: all of it
        view = feed.for_loader(Resume(0, done=Done(prefix=16)))
        next(iter(view.iterate(0, 1, in_worker=False)))
        assert told[1] == [int(chunk_of[i]) for i in rank[16:]]  # what it has left
    finally:
        feed.close()


def test_the_rank_size_is_told_without_computing_the_order(
    feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader's state and length need only how many samples the rank reads: at ImageNet's
    size one rank's global order takes a quarter of a second to compute, and a state is taken
    as often as every batch (`DevicePrefetcher`)."""
    try:
        sizes = [(e, len(feed.rank_order(e))) for e in range(3)]
        resumed = Resume(0, done=Done(prefix=16))
        assert feed.rank_size(0, resumed) == len(feed.rank_order(0, resumed))
        monkeypatch.setattr(type(feed.plan), "order", lambda *a: pytest.fail("order computed"))
        assert [(e, feed.rank_size(e)) for e in range(3)] == sizes
        assert feed.num_batches() == N // 8
    finally:
        feed.close()
