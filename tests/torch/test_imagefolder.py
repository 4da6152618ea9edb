"""ImageFolder over a store: torchvision's contract, DataLoader workers included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tierfeed.errors import ConfigError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.synth import SynthSpec, make_imagefolder
from tierfeed.torch import ImageFolder


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
