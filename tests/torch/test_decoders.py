"""The image decoders: in the workers (`ImageDecoder`), and raw bytes decoded a batch at a time
on the device (`JpegBytes`, `collate_jpegs`, `DeviceJpegDecoder`), with a damaged image named
by key and chunk on both paths. The device path's logic runs on the CPU with a Pillow decode in
place of torchvision's; with torchvision (when it imports) on the CPU; on CUDA when present."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.format.conftest import write_tree
from tierfeed.errors import ConfigError, DecodeError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader import DeadlineOptions
from tierfeed.loader.compose import open_store
from tierfeed.torch import Dataset as TFDataset
from tierfeed.torch import (
    DeviceJpegDecoder,
    DevicePrefetcher,
    ImageDecoder,
    ImageTransform,
    JpegBytes,
    Loader,
    collate_images,
    collate_jpegs,
)
from tierfeed.torch.decoders import torchvision_io
from tierfeed.torch.imagetransform import crop_box, transform_images

N = 24
CENTER = ImageTransform(size=32, resize=40)


def jpeg(seed: int, width: int = 96, height: int = 64) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (height // 8, width // 8, 3), dtype=np.uint8)
    pixels = np.kron(base, np.ones((8, 8, 1), dtype=np.uint8))  # smooth enough to compress
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _store(root: Path, damaged: bytes | None = None) -> Path:
    files = {f"c{i % 2}/img{i:03d}.jpg".encode(): jpeg(i, 96 + 8 * (i % 3)) for i in range(N)}
    if damaged is not None:
        files[b"c1/img007.jpg"] = damaged
    write_tree(root / "src", files)
    pack(root / "src", root / "store", PackOptions(chunk_size=16384, progress=False))
    return root / "store"


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _store(tmp_path_factory.mktemp("img"))


def pil_decode_jpeg(data: list[torch.Tensor], device: torch.device, **_: Any) -> list[torch.Tensor]:
    """torchvision.io.decode_jpeg's list form, done with Pillow (for CPU tests)."""
    from PIL import Image

    out = []
    for raw in data:
        with Image.open(io.BytesIO(raw.numpy().tobytes())) as img:
            array = np.asarray(img.convert("RGB")).copy()
        out.append(torch.from_numpy(array).permute(2, 0, 1).to(device))
    return out


def test_transform_refuses_what_it_cannot_do() -> None:
    for bad in (
        {"size": 0},
        {"size": 32, "resize": 16},
        {"crop": "middle"},
        {"mean": (0.5, 0.5, 0.5)},
        {"mean": (0.5,) * 3, "std": (0.0, 1.0, 1.0)},
        {"scale": (0.5, 0.1)},
    ):
        with pytest.raises(ConfigError):
            ImageTransform(**bad)


def test_crop_boxes() -> None:
    # center: the shorter side 64 -> 40, so a 32 square is 32 * 64 / 40 = 51 pixels of it
    assert crop_box(64, 96, CENTER) == (6, 22, 51, 51)
    rnd = ImageTransform(size=32, crop="random")
    torch.manual_seed(0)
    boxes = [crop_box(64, 96, rnd) for _ in range(200)]
    for top, left, h, w in boxes:
        assert top >= 0 and top + h <= 64 and left >= 0 and left + w <= 96 and h > 0 and w > 0
    assert len(set(boxes)) > 100  # drawn, not fixed
    torch.manual_seed(0)
    assert [crop_box(64, 96, rnd) for _ in range(200)] == boxes  # torch's generator decides


def test_cpu_decoder_matches_the_torch_transform() -> None:
    data = jpeg(3)
    image, _ = ImageDecoder(CENTER)(_sample(data))
    reference = transform_images(pil_decode_jpeg([_raw(data)], torch.device("cpu")), CENTER)[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8
    assert (image.float() - reference.float()).abs().mean() < 6  # two resamplers, one picture
    norm = ImageTransform(size=32, resize=40, mean=(0.5,) * 3, std=(0.25,) * 3)
    out, _ = ImageDecoder(norm)(_sample(data))
    assert out.dtype == torch.float32
    assert torch.allclose(out, (image.float() / 255 - 0.5) / 0.25, atol=1e-5)


def test_flip_flips() -> None:
    data = jpeg(5)
    plain, _ = ImageDecoder(CENTER)(_sample(data))
    torch.manual_seed(1)
    flips = [ImageDecoder(ImageTransform(size=32, resize=40, flip=True))(_sample(data))[0]]
    flips += [ImageDecoder(ImageTransform(size=32, resize=40, flip=True))(_sample(data))[0]]
    flips += [ImageDecoder(ImageTransform(size=32, resize=40, flip=True))(_sample(data))[0]]
    assert any(torch.equal(f, plain.flip(-1)) for f in flips)
    assert all(torch.equal(f, plain) or torch.equal(f, plain.flip(-1)) for f in flips)


def _sample(data: bytes, key: str = "k") -> Any:
    from tierfeed.storage.store import Sample

    return Sample(key=key, label=1, fields={"jpg": data})


def _raw(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@pytest.mark.parametrize("workers", [0, 2])
def test_cpu_decode_in_workers(images_dir: Path, workers: int) -> None:
    ds = TFDataset(images_dir, batch_size=8, decode=ImageDecoder(CENTER), collate=collate_images)
    with Loader(ds, num_workers=workers) as loader:
        got = [(x.shape, y.tolist()) for x, y in loader]
    assert all(shape == (8, 3, 32, 32) for shape, _ in got)
    assert sorted(label for _, ys in got for label in ys) == sorted([0, 1] * (N // 2))


def test_device_decode_matches_cpu_decode(images_dir: Path) -> None:
    """Bytes handed over raw and decoded a batch at a time equal decoding in the workers (in
    the plan's exact order both: the guard would deliver each run's in its own timing)."""
    exact = DeadlineOptions(enabled=False)
    raw = TFDataset(
        images_dir, plan="global", batch_size=8, decode=JpegBytes(), collate=collate_jpegs,
        deadline=exact,
    )  # fmt: skip
    decoder = DeviceJpegDecoder(CENTER, "cpu", decode_jpeg=pil_decode_jpeg)
    with Loader(raw, num_workers=2) as loader:
        device = [(x, y) for x, y in DevicePrefetcher(loader, "cpu", on_device=decoder)]
    cpu = TFDataset(
        images_dir,
        plan="global",
        batch_size=8,
        decode=ImageDecoder(CENTER),
        collate=collate_images,
        deadline=exact,
    )
    with Loader(cpu, num_workers=2) as loader:
        reference = list(loader)
    assert len(device) == len(reference) == N // 8
    for (x, y), (rx, ry) in zip(device, reference, strict=True):
        assert x.shape == rx.shape == (8, 3, 32, 32) and x.dtype == torch.uint8
        assert torch.equal(y, ry)
        assert (x.float() - rx.float()).abs().mean() < 6


def test_jpeg_batch_is_one_tensor_cut_at_offsets() -> None:
    samples = [(jpeg(i), i, f"k{i}") for i in range(3)]
    batch, labels = collate_jpegs(samples)
    assert batch.keys == ["k0", "k1", "k2"] and labels.tolist() == [0, 1, 2]
    assert [bytes(t.numpy()) for t in batch.images()] == [s[0] for s in samples]


@pytest.mark.parametrize("where", ["workers", "device"])
def test_a_damaged_jpeg_names_its_sample_and_chunk(tmp_path: Path, where: str) -> None:
    store_dir = _store(tmp_path, damaged=b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4)
    if where == "workers":
        ds = TFDataset(store_dir, batch_size=8, decode=ImageDecoder(CENTER), collate=collate_images)
        on_device = None
    else:
        ds = TFDataset(store_dir, batch_size=8, decode=JpegBytes(), collate=collate_jpegs)
        on_device = DeviceJpegDecoder(CENTER, "cpu", store=ds.store, decode_jpeg=pil_decode_jpeg)
    with Loader(ds) as loader, pytest.raises(DecodeError) as caught:
        for _ in DevicePrefetcher(loader, "cpu", on_device=on_device):
            pass
    assert "c1/img007" in str(caught.value) and ".tar" in str(caught.value)
    assert caught.value.key is not None and "c1/img007" in caught.value.key
    assert caught.value.chunk is not None and caught.value.chunk.endswith(".tar")


def test_raw_handover_refuses_what_is_not_a_jpeg(tmp_path: Path) -> None:
    store_dir = _store(tmp_path, damaged=b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    ds = TFDataset(store_dir, batch_size=8, decode=JpegBytes(), collate=collate_jpegs)
    with Loader(ds) as loader, pytest.raises(DecodeError, match=r"c1/img007.*not a JPEG"):
        list(loader)


def test_without_torchvision_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(ConfigError, match="pip install torchvision"):
        torchvision_io()
    with pytest.raises(ConfigError, match="pip install torchvision"):
        ImageDecoder(CENTER, backend="torchvision")
    batch, _ = collate_jpegs([(jpeg(0), 0, "k0")])
    with pytest.raises(ConfigError, match="pip install torchvision"):
        DeviceJpegDecoder(CENTER, "cpu").decode(batch)


def _torchvision_imports() -> bool:
    try:
        torchvision_io()
    except ConfigError:
        return False
    return True


@pytest.mark.skipif(not _torchvision_imports(), reason="torchvision does not import here")
def test_torchvision_decode_on_cpu_matches() -> None:
    data = [jpeg(i) for i in range(4)]
    batch, _ = collate_jpegs([(d, 0, f"k{i}") for i, d in enumerate(data)])
    out = DeviceJpegDecoder(CENTER, "cpu").decode(batch)
    reference = torch.stack([ImageDecoder(CENTER)(_sample(d))[0] for d in data])
    assert (out.float() - reference.float()).abs().mean() < 6
    tv, _ = ImageDecoder(CENTER, backend="torchvision")(_sample(data[0]))
    assert (tv.float() - reference[0].float()).abs().mean() < 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_decode_on_the_device(images_dir: Path) -> None:
    norm = ImageTransform(size=32, resize=40, mean=(0.5,) * 3, std=(0.25,) * 3)
    raw = TFDataset(
        images_dir, plan="global", batch_size=8, decode=JpegBytes(), collate=collate_jpegs
    )
    cpu = TFDataset(
        images_dir,
        plan="global",
        batch_size=8,
        decode=ImageDecoder(norm),
        collate=collate_images,
    )
    with Loader(raw, num_workers=2) as a, Loader(cpu) as b:
        decoder = DeviceJpegDecoder(norm, "cuda", store=open_store(images_dir))
        for (x, y), (rx, _) in zip(DevicePrefetcher(a, "cuda", on_device=decoder), b, strict=True):
            assert x.device.type == "cuda" and y.device.type == "cuda"
            assert (x.cpu() - rx).abs().mean() < 0.1
