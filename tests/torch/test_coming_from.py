"""Habits from torchvision, WebDataset and Streaming (issue 46): extensions in any case, wrong
types named by their parameter, sizes as text, and every mix of the dataset kinds with
`Loader` and torch's DataLoader either working or failing at once with what to write."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from tests.format.conftest import write_tree
from tests.torch.conftest import N
from tierfeed.errors import ConfigError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.torch import Dataset, ImageFolder, Loader, MapDataset, TierConfig
from tierfeed.torch.misuse import BATCHED_AGAIN

pytestmark = pytest.mark.timeout(120)


def _jpeg(shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), (shade, 0, 0)).save(out, "JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def mixed_case(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("case")
    files = {b"cat/a.jpg": _jpeg(10), b"cat/B.JPG": _jpeg(20), b"dog/c.Jpg": _jpeg(30)}
    files |= {b"dog/d.jpeg": _jpeg(40)}
    write_tree(root / "tree", files)
    pack(root / "tree", root / "store", PackOptions(progress=False))
    return root / "store"


# --- 1. extensions in any case ---------------------------------------------------------------


def test_fields_are_named_in_lower_case_as_webdataset_names_them(mixed_case: Path) -> None:
    ds = Dataset(mixed_case, batch_size=4, plan="local")
    (batch,) = list(ds)
    assert sorted(batch["__key__"]) == ["cat/B", "cat/a", "dog/c", "dog/d"]
    by_key = dict(zip(batch["__key__"], range(4), strict=True))
    assert all(batch["jpg"][by_key[k]] is not None for k in ("cat/B", "cat/a", "dog/c"))
    assert batch["jpeg"][by_key["dog/d"]] is not None


def test_decoded_images_in_any_case_collate_to_one_tensor(mixed_case: Path) -> None:
    ds = Dataset(mixed_case, batch_size=4, plan="local", decode="torch")
    (batch,) = list(ds)
    images = [batch["jpg"][i] for i in range(4) if batch["jpg"][i] is not None]
    assert len(images) == 3 and all(im.shape == (3, 6, 8) for im in images)


def test_an_extension_packed_in_two_cases_keeps_both(tmp_path: Path) -> None:
    write_tree(tmp_path / "tree", {b"x/s.jpg": b"lower", b"x/s.JPG": b"upper"})
    pack(tmp_path / "tree", tmp_path / "store", PackOptions(progress=False))
    (batch,) = list(Dataset(tmp_path / "store", batch_size=1))
    assert batch["jpg"] == [b"lower"] and batch["JPG"] == [b"upper"]  # neither hides the other


# --- 3. wrong types name their parameter; sizes as text --------------------------------------


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda s: Dataset(s, batch_size="64"), r"batch_size='64': takes an int"),
        (lambda s: Dataset(s, batch_size=64.0), r"batch_size=64.0: .* not a float"),
        (lambda s: Dataset(s, batch_size=0), r"batch_size=0: takes an int >= 1"),
        (lambda s: Loader(Dataset(s), num_workers="2"), r"Loader\(num_workers='2'\)"),
        (lambda s: Loader(Dataset(s), prefetch_factor=0), r"Loader\(prefetch_factor=0\)"),
        (lambda s: TierConfig(ram_bytes="lots"), r"TierConfig\(ram_bytes='lots'\): cannot read"),
        (lambda s: TierConfig(ram_bytes=1.5), r"TierConfig\(ram_bytes=1.5\): takes bytes"),
        (lambda s: TierConfig(threads=True), r"TierConfig\(threads=True\): .* not a bool"),
    ],
)
def test_a_wrong_type_names_its_parameter(store_dir: Path, make: object, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        make(store_dir)  # type: ignore[operator]


def test_sizes_as_text_and_numpy_counts_are_taken(store_dir: Path, tmp_path: Path) -> None:
    assert TierConfig(ram_bytes="8GB").ram_bytes == 8 * 10**9
    assert TierConfig(ram_bytes="512MiB").ram_bytes == 512 << 20
    assert TierConfig(disk_dir=str(tmp_path), disk_bytes="10gb").disk_bytes == 10 * 10**9
    ds = Dataset(store_dir, batch_size=np.int64(40))
    assert len(Loader(ds, num_workers=np.int32(0))) == N // 40


# --- 4. mixing the kinds ---------------------------------------------------------------------


def test_a_map_style_dataset_in_a_loader_says_what_to_write(mixed_case: Path) -> None:
    for ds in (ImageFolder(mixed_case), MapDataset(mixed_case)):
        with pytest.raises(ConfigError, match=r"is map-style .* torch's DataLoader"):
            Loader(ds)  # type: ignore[arg-type]


def test_indexing_a_dataset_points_to_map_dataset(store_dir: Path) -> None:
    with pytest.raises(TypeError, match=r"MapDataset\(store\)"):
        Dataset(store_dir)[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_that_batches_again_is_refused(store_dir: Path, workers: int) -> None:
    ds = Dataset(store_dir, batch_size=8)
    for kwargs in ({}, {"batch_size": 64}):
        loader = DataLoader(ds, num_workers=workers, **kwargs)
        with pytest.raises(ConfigError, match=r"batch_size=None") as caught:
            next(iter(loader))
        # One line in the main process, not torch's report of the worker's traceback.
        assert str(caught.value) == BATCHED_AGAIN


def test_a_dataloader_without_batching_reads_the_epoch(store_dir: Path) -> None:
    ds = Dataset(store_dir, batch_size=8, decode=lambda s: int(s.fields["txt"]))
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    got = [int(v) for batch in loader for v in batch]
    assert sorted(got) == list(range(N))
    assert all(isinstance(b, torch.Tensor) and len(b) <= 8 for b in loader)


# --- 2. one bad image need not end the epoch ---------------------------------------------------


@pytest.fixture(scope="module")
def one_bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad")
    files = {f"c{i % 2}/{i:02d}.jpg".encode(): _jpeg(i) for i in range(20)}
    files[b"c1/07.jpg"] = _jpeg(7)[:40]  # truncated: PIL cannot identify it
    write_tree(root / "tree", files)
    pack(root / "tree", root / "store", PackOptions(progress=False))
    return root / "store"


def _key(sample: object) -> str:
    from tierfeed.format.codecs import open_image

    with open_image(sample.fields["jpg"]) as image:  # type: ignore[attr-defined]
        image.load()
    return str(sample.key)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("workers", "batch"), [(0, 4), (2, 4), (2, 1)])
def test_on_error_skip_leaves_the_bad_sample_out_and_lists_it(
    one_bad: Path, workers: int, batch: int
) -> None:
    ds = Dataset(one_bad, batch_size=batch, decode=_key, collate=list, on_error="skip")
    loader = Loader(ds, num_workers=workers)
    with pytest.warns(UserWarning, match=r"1 sample\(s\) left out.*'c1/07'"):
        keys = [k for b in loader for k in b]
    loader.close()
    assert sorted(keys) == sorted(f"c{i % 2}/{i:02d}" for i in range(20) if i != 7)
    assert loader.last_epoch is not None
    assert loader.last_epoch["skipped"] == {"count": 1, "keys": ["c1/07"]}
    assert loader.last_epoch["samples"] == 19


def test_on_error_raise_is_the_default(one_bad: Path) -> None:
    from tierfeed.errors import DecodeError

    with pytest.raises(DecodeError, match="c1/07"):
        list(Dataset(one_bad, batch_size=4, decode=_key, collate=list))
    with pytest.raises(ConfigError, match=r"on_error='ignore'"):
        Dataset(one_bad, on_error="ignore")


def test_sample_ids_pair_with_samples(one_bad: Path) -> None:
    from tierfeed.loader.compose import open_store

    folder = ImageFolder(one_bad)
    with open_store(one_bad) as store:
        keys = [store.index.key(int(i)) for i in folder.sample_ids]
    assert keys == [path.removesuffix(".jpg") for path, _ in folder.samples]


# --- 5. ImageFolder as torchvision's ------------------------------------------------------------


def test_a_torchvision_style_loader_gets_a_path(mixed_case: Path) -> None:
    def loader(path: str) -> Image.Image:  # torchvision's pil_loader
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")

    folder = ImageFolder(mixed_case, loader=loader)
    image, label = folder[0]
    assert image.size == (8, 6) and label == 0
    lazy = ImageFolder(mixed_case, loader=Image.open)  # reads after the loader returned
    assert lazy[1][0].convert("RGB").getpixel((0, 0))[0] > 0


def test_home_is_expanded_and_the_repr_is_torchvisions(
    mixed_case: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(mixed_case.parent))
    folder = ImageFolder("~/store", transform=torch.nn.Identity())
    assert len(folder) == 4 and folder.root == mixed_case
    assert repr(folder).splitlines() == [
        "Dataset ImageFolder",
        "    Number of datapoints: 4",
        f"    Root location: {mixed_case}",
        "    Transform: Identity()",
    ]
    assert len(list(Dataset("~/store", batch_size=4))) == 1


def test_find_classes_and_make_dataset_can_be_overridden(mixed_case: Path) -> None:
    class CatsOnly(ImageFolder):
        def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
            return ["cat"], {"cat": 0}

    class Reversed(ImageFolder):
        def make_dataset(self, *args: object, **kwargs: object) -> list[tuple[str, int]]:
            return list(reversed(super().make_dataset(*args, **kwargs)))  # type: ignore[arg-type]

    cats = CatsOnly(mixed_case)
    assert cats.classes == ["cat"] and [p for p, _ in cats.samples] == ["cat/B.JPG", "cat/a.jpg"]
    plain, backwards = ImageFolder(mixed_case), Reversed(mixed_case)
    assert backwards.samples == plain.samples[::-1]
    assert all(
        np.array_equal(np.asarray(backwards[i][0]), np.asarray(plain[3 - i][0])) for i in range(4)
    )


def test_chunk_sizes_as_text_wherever_a_store_is_written(tmp_path: Path) -> None:
    import tierfeed

    write_tree(tmp_path / "tree", {b"a/x.txt": b"x" * 3000, b"b/y.txt": b"y" * 3000})
    packed = tierfeed.pack(
        tmp_path / "tree", tmp_path / "p", PackOptions(chunk_size="4KiB", progress=False)
    )
    assert packed.chunks == 2  # each 3 KB file a chunk of its own at 4 KiB
    with tierfeed.Writer(tmp_path / "w", chunk_size="1MiB") as w:
        w.write({"__key__": "a", "txt": "x"})
    with pytest.raises(ConfigError, match=r"chunk_size='lots': cannot read the size"):
        tierfeed.Writer(tmp_path / "v", chunk_size="lots")
    with pytest.raises(ConfigError, match=r"PackOptions\(workers=0\): takes an int >= 1"):
        PackOptions(workers=0)
