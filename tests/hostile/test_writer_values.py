"""Values a field's encoder cannot store (issue 44, case 5): each is a `PackError` naming the
sample and field, never numpy's, json's, torch's or Pillow's own exception, and never a silent
change (an RGBA image in a bmp field would lose its alpha); the Writer then leaves no store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tierfeed import Writer, open_store
from tierfeed.errors import PackError
from tierfeed.format.codecs import decode_field
from tierfeed.format.layout import INDEX_NAME

pytestmark = pytest.mark.timeout(120)


def deep_list(depth: int = 100_000) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def image(mode: str) -> Callable[[], Image.Image]:
    return lambda: Image.new(mode, (5, 4))


# (field, a factory of the value, what the message says besides the key and field)
REFUSED: dict[str, tuple[str, Callable[[], Any], str]] = {
    "npy-object-array": ("npy", lambda: np.array([{"a": 1}, None], dtype=object), "objects"),
    "npy-bfloat16-tensor": ("npy", lambda: torch.zeros(2, dtype=torch.bfloat16), "Tensor"),
    "json-100k-deep": ("json", deep_list, "nested too deeply"),
    "cls-huge-int": ("cls", lambda: 10**5000, "int"),
    "pt-lambda": ("pt", lambda: {"f": lambda x: x}, "dict"),
    "png-mode-I": ("png", image("I"), "PNG cannot store a I image"),
    "png-mode-F": ("png", image("F"), "PNG cannot store a F image"),
    "png-mode-CMYK": ("png", image("CMYK"), "PNG cannot store a CMYK image"),
    "png-mode-I;16B": ("png", image("I;16B"), "PNG cannot store a I;16B image"),
    "bmp-mode-LA": ("bmp", image("LA"), "BMP cannot store a LA image"),
    "bmp-mode-I;16": ("bmp", image("I;16"), "BMP cannot store a I;16 image"),
    "bmp-mode-F": ("bmp", image("F"), "BMP cannot store a F image"),
    "bmp-mode-CMYK": ("bmp", image("CMYK"), "BMP cannot store a CMYK image"),
    "bmp-rgba-drops-alpha": ("bmp", image("RGBA"), "BMP cannot store a RGBA image"),
    "bmp-rgba-array": ("x.bmp", lambda: np.zeros((4, 5, 4), np.uint8), "RGBA"),
    "ppm-rgba-drops-alpha": ("ppm", image("RGBA"), "PPM cannot store a RGBA image"),
    "ppm-mode-I-clips": ("ppm", image("I"), "PPM cannot store a I image"),
    "jpg-rgba-drops-alpha": ("jpg", image("RGBA"), "JPEG cannot store a RGBA image"),
    "webp-mode-L": ("webp", image("L"), "WEBP cannot store a L image"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_its_encoder_cannot_store_is_a_pack_error(tmp_path: Path, case: str) -> None:
    field, make, says = REFUSED[case]
    dst = tmp_path / "st"
    with pytest.raises(PackError) as caught, Writer(dst, chunk_size=4096) as w:
        w.write({"__key__": "ok/first", "txt": "x" * 5000})  # a whole chunk already written
        w.write({"__key__": "bad/one", field: make()})
    message = str(caught.value)
    assert "'bad/one'" in message and f"field {field!r}" in message and says in message
    assert not (dst / INDEX_NAME).exists()
    assert not list(dst.rglob("*.tar")) and not list((dst / "chunks").iterdir())


def test_a_refused_image_mode_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PackError) as caught, Writer(tmp_path / "st") as w:
        w.write({"__key__": "k", "bmp": Image.new("RGBA", (3, 3), (1, 2, 3, 4))})
    message = str(caught.value)
    assert "convert" in message and "png" in message and "tiff" in message


@pytest.mark.parametrize(
    ("field", "mode"),
    [
        ("png", "RGBA"),
        ("png", "LA"),
        ("png", "I;16"),
        ("png", "P"),
        ("bmp", "RGB"),
        ("bmp", "L"),
        ("bmp", "1"),
        ("tiff", "RGBA"),
        ("tiff", "CMYK"),
        ("tiff", "F"),
        ("tiff", "I"),
        ("ppm", "F"),
        ("webp", "RGBA"),
        ("jpg", "CMYK"),
        ("jpg", "L"),
    ],
)
def test_a_mode_its_format_keeps_round_trips(tmp_path: Path, field: str, mode: str) -> None:
    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 255, (6, 7, 3), np.uint8))
    if mode == "P":
        value = base.quantize(50)
    elif mode in ("I", "F", "I;16"):
        dtype = {"I": np.int32, "F": np.float32, "I;16": np.uint16}[mode]
        value = Image.fromarray(rng.integers(0, 60000, (6, 7)).astype(dtype))
    else:
        value = base.convert(mode)
    if mode == "RGBA":
        value.putalpha(Image.fromarray(rng.integers(1, 250, (6, 7), np.uint8)))
    with Writer(tmp_path / "st") as w:
        w.write({"__key__": "k", field: value})
    with open_store(tmp_path / "st") as store:
        back = decode_field(field, store.read_sample(0).fields[field])
    assert back.mode == value.mode and back.size == value.size
    if field in ("png", "bmp", "tiff", "ppm"):  # lossless: the same pixels
        assert back.tobytes() == value.tobytes()
