"""Writers take what users have (issue 33, friction 4): a field's value is encoded by its
extension, WebDataset's way, and the same names decode on read (`Dataset(decode="auto")`,
``"torch"``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tierfeed import Writer, open_store, optimize
from tierfeed.errors import ConfigError, PackError
from tierfeed.format.codecs import decode_field, encode_field
from tierfeed.torch import Dataset, Loader

pytestmark = pytest.mark.timeout(120)


def gradient(h: int = 12, w: int = 16) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 15, y * 20, (x + y) * 5], axis=2).astype(np.uint8)


def rich_sample(i: int) -> dict[str, Any]:
    """Module level: optimize's spawned workers import it."""
    return {
        "__key__": f"s/{i:03d}",
        "cls": i % 2,
        "json": {"id": i, "tags": ["a", "b"], "ok": True},
        "png": gradient() + i,
        "jpg": Image.fromarray(gradient()),
        "npy": np.arange(6, dtype=np.float32).reshape(2, 3) * i,
        "pt": torch.full((2, 2), float(i)),
        "txt": 0.5 * i,
    }


def check_decoded(fields: dict[str, Any], i: int) -> None:
    assert fields["cls"] == i % 2 and fields["__label__"] == i % 2
    assert fields["json"] == {"id": i, "tags": ["a", "b"], "ok": True}
    assert np.array_equal(np.asarray(fields["png"]), gradient() + i)  # lossless
    jpg = np.asarray(fields["jpg"]).astype(int)
    assert jpg.shape == (12, 16, 3) and np.abs(jpg - gradient()).mean() < 4  # lossy, close
    assert np.array_equal(fields["npy"], np.arange(6, dtype=np.float32).reshape(2, 3) * i)
    assert torch.equal(fields["pt"], torch.full((2, 2), float(i)))
    assert fields["txt"] == repr(0.5 * i)


def test_a_writer_takes_python_values_and_auto_decodes_them(tmp_path: Path) -> None:
    with Writer(tmp_path / "st") as w:
        for i in range(4):
            w.write(rich_sample(i))
    with open_store(tmp_path / "st") as store:
        raw = store.read_sample(1).fields
        assert raw["json"] == b'{"id": 1, "tags": ["a", "b"], "ok": true}'
        assert raw["png"][:8] == b"\x89PNG\r\n\x1a\n" and raw["jpg"][:2] == b"\xff\xd8"
    ds = Dataset(tmp_path / "st", batch_size=1, decode="auto")
    with Loader(ds) as loader:
        for batch in loader:
            fields = {k: v[0] for k, v in batch.items()}
            check_decoded(fields, int(fields["__key__"][2:]))


def test_optimize_takes_them_too_and_torch_decode_stacks_images(tmp_path: Path) -> None:
    optimize(rich_sample, list(range(4)), tmp_path / "st", workers=2, image_quality=70)
    ds = Dataset(tmp_path / "st", batch_size=4, decode="torch")
    with Loader(ds) as loader:
        (batch,) = list(loader)
    assert batch["png"].shape == (4, 3, 12, 16) and batch["png"].dtype == torch.uint8
    assert batch["npy"].shape == (4, 2, 3) and batch["pt"].shape == (4, 2, 2)
    assert sorted(batch["__label__"].tolist()) == [0, 0, 1, 1]


def test_quality_changes_the_jpeg() -> None:
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8))
    low = encode_field("k", "jpg", image, quality=20)
    high = encode_field("k", "jpg", image, quality=95)
    assert len(low) < len(high)
    assert Image.open(io.BytesIO(bytes(low))).format == "JPEG"


def test_an_rgba_image_in_a_jpg_field_is_refused_not_flattened() -> None:
    """JPEG has no alpha: dropping it silently would change the data (issue 44, case 5)."""
    image = Image.new("RGBA", (4, 4), (10, 20, 30, 128))
    with pytest.raises(PackError, match=r"'jpg'.*RGBA.*convert\('RGB'\)"):
        encode_field("k", "jpg", image)
    decoded = decode_field("jpg", bytes(encode_field("k", "jpg", image.convert("RGB"))))
    assert decoded.mode == "RGB" and decoded.size == (4, 4)


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("png", np.zeros((4, 4), np.float32), r"'png'.*uint8.*float32"),
        ("png", np.zeros((4, 4, 2), np.uint8), r"'png'.*\(4, 4, 2\)"),
        ("jpg", {"a": 1}, r"'jpg' is a dict"),
        ("npy", [1, 2], r"'npy' is a list"),
        ("json", {1j}, r"'json' is a set"),
        ("json", {"x": float("nan")}, r"'json': not JSON"),
        ("bin", 3, r"'bin' is a int"),
    ],
)
def test_values_a_field_cannot_store_are_one_pack_error(name: str, value: Any, match: str) -> None:
    with pytest.raises(PackError, match=match):
        encode_field("k", name, value)


def test_a_bad_quality_or_decode_name_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="image_quality"):
        Writer(tmp_path / "a", image_quality=0)
    with Writer(tmp_path / "b") as w:
        w.write({"txt": "x"})
    with pytest.raises(ConfigError, match="decode='jpeg'"):
        Dataset(tmp_path / "b", decode="jpeg")
