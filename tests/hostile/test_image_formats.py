"""Data must not choose which program decodes it (issue 44, case 2).

Pillow picks an image's format from its bytes, and for EPS it runs Ghostscript on them: a
PostScript file named ``.png`` would run ``gs`` on the sample's code wherever Ghostscript is
installed. Every decode path tierfeed has opens an image only as the format its extension
names (`tierfeed.format.codecs.open_image`), or as an in-process raster format where no
extension is known. A stand-in ``gs`` first on PATH touches a marker file if anything runs it.

Also here: a ``.pt`` field holding pickled objects fails with one short error, without torch's
advice to load it unsafely (which would run the payload).
"""

from __future__ import annotations

import io
import os
import shutil
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import EpsImagePlugin, Image

from tests.format.conftest import write_tree
from tierfeed import Writer
from tierfeed.demo import decode_jpeg
from tierfeed.errors import DecodeError
from tierfeed.format import codecs
from tierfeed.format.codecs import decode_field
from tierfeed.format.pack import PackOptions, pack
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, ImageDecoder, ImageFolder, Loader, MapDataset, pil_loader
from tierfeed.torch.decoders import pil_image
from tierfeed.torch.imagetransform import ImageTransform

pytestmark = pytest.mark.timeout(120)

POSTSCRIPT = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"


@pytest.fixture
def stand_in_gs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``gs`` first on PATH that touches the returned marker when run; Pillow's cached
    lookup is reset so that it would find this one. The marker must not exist afterwards."""
    bindir, marker = tmp_path / "bin", tmp_path / "gs-ran"
    bindir.mkdir()
    gs = bindir / "gs"
    gs.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 0\n")
    gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)  # Pillow caches its lookup
    assert shutil.which("gs") == str(gs)  # the fixture itself works: Pillow would run it
    yield marker
    assert not marker.exists(), "an image decode ran gs (Ghostscript) on a sample's bytes"


@pytest.fixture
def evil_store(tmp_path: Path) -> Path:
    """A store packed from an ImageFolder tree whose only image is PostScript named .png."""
    write_tree(tmp_path / "src", {b"cat/evil.png": POSTSCRIPT})
    pack(tmp_path / "src", tmp_path / "store", PackOptions(progress=False))
    return tmp_path / "store"


def first_batch(store: Path, decode: Any) -> Any:
    ds = Dataset(store, batch_size=1, decode=decode)
    with Loader(ds) as loader:
        return next(iter(loader))


PATHS: dict[str, Callable[[Path], Any]] = {
    "dataset-auto": lambda store: first_batch(store, "auto"),
    "dataset-torch": lambda store: first_batch(store, "torch"),
    "dataset-image-decoder": lambda store: first_batch(store, ImageDecoder()),
    "dataset-image-decoder-field": lambda store: first_batch(store, ImageDecoder(field="png")),
    "map-dataset": lambda store: MapDataset(store, decode="auto")[0],
    "image-folder": lambda store: ImageFolder(store)[0],
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_postscript_in_a_png_field_never_runs_ghostscript(
    stand_in_gs: Path, evil_store: Path, path: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        PATHS[path](evil_store)
    message = str(caught.value)
    assert "cat/evil" in message and "chunks/000000.tar" in message
    assert "PNG" in message or "image formats" in message


@pytest.mark.parametrize(
    "decode",
    [
        lambda: decode_field("png", POSTSCRIPT),
        lambda: decode_field("x.PNG", POSTSCRIPT),
        lambda: codecs.open_image(POSTSCRIPT, "png"),
        lambda: codecs.open_image(POSTSCRIPT),  # no extension known: the raster formats only
        lambda: pil_loader(POSTSCRIPT),
        lambda: pil_image(POSTSCRIPT, ImageTransform(size=8)),
        lambda: pil_image(POSTSCRIPT, ImageTransform(size=8), "seg.png"),
        lambda: ImageDecoder()(Sample(key="k", label=0, fields={"png": POSTSCRIPT})),
        lambda: decode_jpeg(POSTSCRIPT),
    ],
    ids=[
        "decode_field",
        "decode_field-upper",
        "open_image",
        "open_image-no-ext",
        "pil_loader",
        "pil_image",
        "pil_image-named",
        "ImageDecoder",
        "demo",
    ],
)
def test_each_decoder_refuses_postscript_in_process(
    stand_in_gs: Path, decode: Callable[[], Any]
) -> None:
    with pytest.raises(DecodeError, match=r"not a PNG image|none of the image formats|not a JPEG"):
        decode()


def png_bytes(mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (4, 3), 7).save(out, format="PNG")
    return out.getvalue()


def jpeg_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(out, format="JPEG")
    return out.getvalue()


def test_an_image_opens_as_its_extension_whatever_the_case() -> None:
    assert decode_field("photo.JPG", jpeg_bytes()).format == "JPEG"
    assert decode_field("Mask.Png", png_bytes("L")).mode == "L"
    with codecs.open_image(png_bytes()) as image:  # no extension: any raster format
        assert image.format == "PNG"


def test_an_image_of_another_format_than_its_extension_says_which_it_is() -> None:
    with pytest.raises(DecodeError, match=r"field 'jpg'.*not a JPEG.*they are a PNG image"):
        decode_field("jpg", png_bytes())


def test_the_sample_and_field_are_named_through_the_dataset(tmp_path: Path) -> None:
    with Writer(tmp_path / "st") as w:
        w.write({"__key__": "dog/mislabelled", "jpg": png_bytes()})
    with pytest.raises(DecodeError) as caught:
        first_batch(tmp_path / "st", "auto")
    message = str(caught.value)
    assert "dog/mislabelled" in message and "field 'jpg'" in message and "PNG" in message
    assert caught.value.key == "dog/mislabelled"


# --- a pt field that pickles objects -------------------------------------------------------


class Payload:
    """What a hostile .pt could hold: an object torch's safe loader will not build."""

    def __init__(self) -> None:
        self.code = "print('pwned')"


def test_a_pt_field_of_objects_is_one_short_error_without_unsafe_advice(tmp_path: Path) -> None:
    out = io.BytesIO()
    torch.save({"obj": Payload()}, out)
    with Writer(tmp_path / "st") as w:
        w.write({"__key__": "ckpt/one", "pt": out.getvalue()})
    with pytest.raises(DecodeError) as caught:
        first_batch(tmp_path / "st", "auto")
    message = str(caught.value)
    assert "ckpt/one" in message and "field 'pt'" in message
    assert "beyond tensors" in message and "safe loader" in message and "Payload" in message
    assert "\n" not in message
    chain = "".join(traceback.format_exception(caught.value))
    assert "weights_only" not in chain and "arbitrary code" not in chain
