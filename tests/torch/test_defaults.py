"""What a new user gets from `Dataset(path)` with the defaults (issue 33, frictions 2 and 6):
batches of per-sample dicts through torch's default collate, and the same batches, with a
length, under a plain `DataLoader(ds, batch_size=None)`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from tests.format.conftest import write_tree
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.compose import open_store
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, collate_fields, sample_fields

pytestmark = pytest.mark.timeout(120)

N = 10


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("defaults")
    files = {f"c{i % 2}/s{i:02d}.txt".encode(): b"%d" % i for i in range(N)}
    write_tree(root / "src", files)
    pack(root / "src", root / "store", PackOptions(chunk_size=8192, progress=False))
    return root / "store"


def flat(batches: list[dict[str, object]]) -> list[tuple[str, int, bytes]]:
    out = []
    for b in batches:
        keys, labels, texts = b["__key__"], b["__label__"], b["txt"]
        assert isinstance(labels, torch.Tensor) and labels.dtype == torch.int64
        assert isinstance(keys, list) and isinstance(texts, list)
        out += list(zip(keys, labels.tolist(), texts, strict=True))
    return sorted(out)


WANT = sorted((f"c{i % 2}/s{i:02d}", i % 2, b"%d" % i) for i in range(N))


def test_the_defaults_yield_dicts_of_fields(store: Path) -> None:
    with Loader(Dataset(store, batch_size=4)) as loader:
        assert flat(list(loader)) == WANT


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_yields_what_the_loader_yields(store: Path, workers: int) -> None:
    ds = Dataset(store, batch_size=4)
    assert len(ds) == 3  # batches of this rank's epoch
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    assert len(loader) == 3
    batches = list(loader)
    assert len(batches) == 3 and flat(batches) == WANT


def test_a_plain_dataloader_with_tuples_unpacks(store: Path) -> None:
    def decode(sample: Sample) -> tuple[torch.Tensor, int]:
        return torch.tensor(int(sample.fields["txt"])), sample.label

    ds = Dataset(store, batch_size=5, decode=decode)
    seen = []
    for x, y in DataLoader(ds, batch_size=None):
        assert x.shape == y.shape == (5,)
        seen += x.tolist()
    assert sorted(seen) == list(range(N))


def test_samples_with_other_fields_collate_with_none() -> None:
    # A store packed by key with an optional sidecar: not every sample has every field.
    a = sample_fields(Sample("a", 0, {"jpg": b"1", "json": b"{}"}))
    b = sample_fields(Sample("b", 1, {"jpg": b"2"}))
    batch = collate_fields([a, b])
    assert batch["__key__"] == ["a", "b"] and batch["__label__"].tolist() == [0, 1]
    assert batch["jpg"] == [b"1", b"2"] and batch["json"] == [b"{}", None]


# --- a map-style view, and cache_dir= ------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_map_style_view_for_code_written_around_indices(store: Path, workers: int) -> None:
    from tierfeed.torch import MapDataset

    ds = MapDataset(store)
    assert len(ds) == N
    first = ds[0]
    assert set(first) == {"__key__", "__label__", "txt"} and isinstance(first["txt"], bytes)
    with pytest.raises(IndexError):
        ds[N]
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers)
    assert flat(list(loader)) == WANT  # every sample once, through torch's own sampler


def test_a_map_style_view_of_a_selection_decoded_by_name(store: Path) -> None:
    from tierfeed.torch import MapDataset

    ds = MapDataset(store, decode="auto", samples=[3, 7])
    assert len(ds) == 2
    with open_store(store) as whole:
        want = [whole.read_sample(i).fields["txt"].decode() for i in (3, 7)]
    assert [ds[i]["txt"] for i in range(2)] == want  # "auto": a txt field is text


def test_cache_dir_is_a_disk_tier_in_short(store: Path, tmp_path: Path) -> None:
    from tierfeed.errors import ConfigError
    from tierfeed.loader.compose import TierConfig

    ds = Dataset(store, batch_size=4, cache_dir=tmp_path / "cache")
    with Loader(ds) as loader:
        assert flat(list(loader)) == WANT
    assert list((tmp_path / "cache").rglob("*.tar"))
    with pytest.raises(ConfigError, match="one of cache_dir and tiers"):
        Dataset(store, cache_dir=tmp_path / "c", tiers=TierConfig(ram_bytes=1 << 20))
