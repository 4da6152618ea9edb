"""ImageFolder over a store: torchvision's contract, DataLoader workers included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tierfeed.errors import ConfigError, DecodeError, NotFoundError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.compose import open_store
from tierfeed.storage.store import Sample
from tierfeed.synth import SynthSpec, make_imagefolder
from tierfeed.torch import IMG_EXTENSIONS, ImageFolder


def to_tensor(img: object) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imf")
    make_imagefolder(root / "src", SynthSpec(classes=3, per_class=8, median_bytes=3000, jpeg=True))
    pack(root / "src", root / "store", PackOptions(chunk_size=32 * 1024, progress=False))
    return root / "store"


def test_torchvision_contract(store: Path) -> None:
    ds = ImageFolder(store)
    assert ds.classes == ["class_000", "class_001", "class_002"]
    assert ds.class_to_idx == {"class_000": 0, "class_001": 1, "class_002": 2}
    assert len(ds) == 24 and ds.targets == [0] * 8 + [1] * 8 + [2] * 8
    assert ds.samples[9] == ("class_001/img_000001.jpg", 1)
    assert ds.imgs is ds.samples and ds.extensions == IMG_EXTENSIONS
    image, label = ds[9]
    assert image.mode == "RGB" and label == 1
    src = store.parent / "src" / "class_001" / "img_000001.jpg"
    from PIL import Image

    with Image.open(src) as original:
        assert np.array_equal(np.asarray(image), np.asarray(original.convert("RGB")))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers(store: Path, workers: int) -> None:
    ds = ImageFolder(store, transform=lambda im: to_tensor(im.resize((16, 16))))
    loader = DataLoader(ds, batch_size=5, num_workers=workers, shuffle=True)
    labels = torch.cat([y for _, y in loader])
    assert sorted(labels.tolist()) == sorted(ds.targets)


def test_not_a_store_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tierfeed pack"):
        ImageFolder(tmp_path)


def test_torchvision_keywords(store: Path) -> None:
    ds = ImageFolder(store, is_valid_file=lambda p: p.endswith("1.jpg"), allow_empty=True)
    assert [p for p, _ in ds.samples][:2] == [
        "class_000/img_000001.jpg",
        "class_001/img_000001.jpg",
    ]
    assert ds.extensions is None and ds.targets == [0, 1, 2]


def test_a_store_without_class_folders(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(b"x")
    pack(tmp_path / "src", tmp_path / "store", PackOptions(progress=False))
    with pytest.raises(NotFoundError, match="class folder") as caught:
        ImageFolder(tmp_path / "store")
    assert isinstance(caught.value, FileNotFoundError)


def test_sample_repr_names_sizes_not_bytes(store: Path) -> None:
    with open_store(store) as opened:
        sample = opened.read_sample(0)
    text = repr(sample)
    size = len(sample.fields["jpg"])
    assert text == f"Sample(key={sample.key!r}, label=0, fields={{'jpg': <{size} bytes>}})"
    assert repr(Sample("k", -1, {"jpg": b"x" * 127_000})).endswith("{'jpg': <127000 bytes>})")


def test_pickled_for_workers_without_descriptors(store: Path) -> None:
    import pickle

    ds = ImageFolder(store)
    ds[0]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._store is None and copy.samples == ds.samples
    assert np.array_equal(np.asarray(copy[3][0]), np.asarray(ds[3][0]))


@pytest.mark.hostile
def test_a_corrupt_image_names_its_path_and_chunk(tmp_path: Path) -> None:
    """PIL says `cannot identify image file <_io.BytesIO ...>`; torchvision names the path."""
    from tests.format.conftest import write_tree

    write_tree(tmp_path / "src", {b"cat/bad.jpg": b"not a jpeg at all", b"dog/x.txt": b"-"})
    pack(tmp_path / "src", tmp_path / "store", PackOptions(progress=False))
    ds = ImageFolder(tmp_path / "store", allow_empty=True)
    with pytest.raises(DecodeError) as caught:
        ds[0]
    message = str(caught.value)
    assert "cat/bad.jpg" in message and "chunks/000000.tar" in message
    assert isinstance(caught.value, OSError)  # what code written around PIL catches
    assert caught.value.__cause__ is not None
    assert "on_error='skip'" in message and "LOAD_TRUNCATED_IMAGES" not in message


@pytest.mark.hostile
def test_a_truncated_jpeg_fails_as_in_torchvision_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JPEG an interrupted copy cut short: the error names it and PIL's own switch, and with
    the switch set it decodes as far as it goes, at its full size, as torchvision's would."""
    from PIL import ImageFile

    from tests.format.conftest import write_tree
    from tests.test_docs import _jpeg, _truncated_jpeg

    write_tree(tmp_path / "src", {b"cat/cut.jpg": _truncated_jpeg(), b"cat/ok.jpg": _jpeg(1)})
    pack(tmp_path / "src", tmp_path / "store", PackOptions(progress=False))
    ds = ImageFolder(tmp_path / "store")
    assert [path for path, _ in ds.samples] == ["cat/cut.jpg", "cat/ok.jpg"]
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    with pytest.raises(DecodeError, match="truncated") as caught:
        ds[0]
    assert "cat/cut.jpg" in str(caught.value)
    assert "PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True" in str(caught.value)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    image, label = ds[0]
    assert image.size == (8, 8) and label == 0
