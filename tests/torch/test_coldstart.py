"""The main process copies an epoch's first chunks while the DataLoader workers start
(`tierfeed.loader.coldstart`): every sample still once, every chunk copied once by one
process of the host, no copy thread of the main process alive across a fork, and a failing
origin still said by the workers."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.torch.conftest import random_store
from tierfeed.errors import TierfeedError
from tierfeed.loader.coldstart import ColdStart
from tierfeed.storage.copier import Copier
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, TierConfig
from tierfeed.torch import loader as loader_module
from tierfeed.torch.dataset import feed_of

pytestmark = pytest.mark.timeout(120)

N = 1200


def length(sample: Sample) -> int:
    return len(sample.fields["bin"])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # ~8 chunks of 1 MiB
    return random_store(tmp_path_factory.mktemp("cold"), N, 4, (2000, 12000), 2**20, seed=3)


def chunk_bytes(store: Path) -> int:
    return sum(f.stat().st_size for f in (store / "chunks").iterdir())


def test_the_main_process_copies_the_first_chunks_once_and_every_sample_comes_once(
    store: Path, tmp_path: Path
) -> None:
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(store, "global", batch_size=32, decode=length, tiers=tiers)
    with Loader(ds, num_workers=2) as loader:
        delivered = sum(len(batch) for batch in loader)
        cold = loader._cold
        assert cold is not None and cold.stop()
        assert cold.stats is not None
        mine = cold.stats["origin"]["bytes"]
        total = loader.last_epoch["tiers"]["origin"]  # with the main process's copies
    assert delivered == N
    assert mine > 0  # the main process copied some of the first chunks
    fetch = loader.last_epoch["tiers"]["fetch"]
    assert fetch["piece_bytes"] == chunk_bytes(store)  # the host copied every chunk whole, once
    assert total["copies"] == len(list((store / "chunks").iterdir()))
    # Beside the copies: each worker's head (its first batch, read at once as exact ranges),
    # and the next epoch's, begun as this one ends.
    heads = 2 * 2 * 32 * (12000 + 1024)
    assert chunk_bytes(store) <= total["bytes"] <= chunk_bytes(store) + heads


def test_no_copy_thread_of_the_main_process_runs_when_workers_are_forked(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_fork: list[list[str]] = []
    start = loader_module.start_workers
    before = set(threading.enumerate())  # e.g. the process's hedge pool, of earlier tests

    def watched(dataloader: Any) -> Any:
        new = set(threading.enumerate()) - before  # torch's queue feeders may still be ending
        at_fork.append([t.name for t in new if t.name.startswith("tierfeed")])
        return start(dataloader)

    monkeypatch.setattr(loader_module, "start_workers", watched)
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(store, "global", batch_size=32, decode=length, tiers=tiers)
    with Loader(ds, num_workers=2) as loader:
        taken = list(itertools.islice(iter(loader), 3))  # the main process copies meanwhile
        state = loader.state_dict()
        loader.load_state_dict(state)  # its workers start anew: a second fork
        rest = list(loader)
    assert len(at_fork) == 2
    assert at_fork == [[], []]  # no thread of this Loader's making: no copy, no cold start
    assert sum(len(b) for b in taken + rest) == N


def test_a_copier_starts_its_threads_with_its_first_copy() -> None:
    def running() -> int:  # this test's copier's threads (others may come and go meanwhile)
        return sum(t.name.startswith("lazy-copier") for t in threading.enumerate())

    copied: list[int] = []
    copier = Copier(copied.append, threads=3, queue_size=8, name="lazy-copier")
    assert running() == 0  # a stack made before a fork runs none
    copier.close()  # never started: nothing to join
    copier = Copier(copied.append, threads=3, queue_size=8, name="lazy-copier")
    assert copier.schedule(5)
    copier.drain(10)
    assert copied == [5] and running() == 3
    copier.close()
    assert running() == 0


@pytest.mark.parametrize(
    "tiers",
    [
        None,
        TierConfig(ram_bytes=10**8),  # copies would land in this process's memory
        TierConfig(disk_dir="DISK", policy="lru"),  # copies do not follow the plan
    ],
)
def test_no_copies_in_the_main_process_where_the_workers_cannot_use_them(
    store: Path, tmp_path: Path, tiers: TierConfig | None
) -> None:
    if tiers is not None and tiers.disk_dir == "DISK":
        tiers = TierConfig(disk_dir=str(tmp_path / "cache"), policy="lru")
    ds = Dataset(store, "global", batch_size=32, decode=length, tiers=tiers)
    assert feed_of(ds).for_loader(None).cold_start() is None
    with Loader(ds, num_workers=2) as loader:
        assert sum(len(batch) for batch in loader) == N
        assert loader._cold is None


def test_a_chunk_gone_from_the_origin_is_still_said_by_the_workers(
    store: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "store"
    broken.mkdir()
    for f in store.rglob("*"):
        if f.is_file():
            target = broken / f.relative_to(store)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(broken, "global", batch_size=32, decode=length, tiers=tiers)
    gone = sorted((broken / "chunks").iterdir())[0]
    gone.unlink()  # after the plan was made: the main process's copy of it fails too
    with Loader(ds, num_workers=2) as loader, pytest.raises(TierfeedError, match=gone.name):
        sum(len(batch) for batch in loader)
    cold = loader._cold
    assert cold is not None and cold.started
    assert cold.stats is not None  # ended, its stack closed, whichever chunks it copied


def test_stop_before_start_closes_the_stack(store: Path, tmp_path: Path) -> None:
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(store, "global", batch_size=32, decode=length, tiers=tiers)
    cold = feed_of(ds).for_loader(None).cold_start()
    assert isinstance(cold, ColdStart)
    assert cold.stop() and cold.stats is not None
    assert not cold.started
