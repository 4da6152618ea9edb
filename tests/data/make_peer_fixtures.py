"""Write the MDS and LitData fixtures of tests/format/test_convert_peers.py with the real tools.

Run with the benchmark venv, which has ``mosaicml-streaming`` and ``litdata`` (the project's
own venv has neither)::

    .venv-bench/bin/python tests/data/make_peer_fixtures.py

It rewrites ``tests/data/peers/``: one directory per dataset, as ``streaming.MDSWriter`` and
``litdata.optimize`` wrote it, and ``expected.json``: every sample's value of every column, in
the form the tests compare (a hash for bytes, dtype/shape/values for an array), for ``mds``,
``litdata`` and ``litdata-tuple`` (``mds-gz``, ``mds-zstd`` and ``mds-br`` hold the samples
of ``mds``, compressed; ``litdata-zstd`` the first three of ``litdata``). Each dataset
is read back with its own tool's reader before ``expected.json`` is written, so the file says
what the tool itself reads from the fixture.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

OUT = Path(__file__).parent / "peers"
N = 12

# name -> MDS encoding, one column of each kind tierfeed converts
MDS_COLUMNS = {
    "image": "jpeg",
    "mask": "png",
    "thumb": "pil",
    "label": "int",
    "small": "uint8",
    "score": "float32",
    "digits": "str_int",
    "text": "str",
    "vec": "ndarray",
    "fixed": "ndarray:int16:3",
    "meta": "json",
    "raw": "bytes",
    "pick": "pkl",
    "frames": "list[png]",
}


def _image(i: int, mode: str, size: tuple[int, int]) -> Image.Image:
    colour = {"RGB": (i * 20, 100, 200 - i * 10), "L": i * 20}[mode]
    return Image.new(mode, size, colour)


def _encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 80} if fmt == "JPEG" else {}))
    return out.getvalue()


def _jpeg_file(tmp: Path, i: int) -> Image.Image:
    """An opened JPEG file: both tools store such an image's file bytes as they are."""
    path = tmp / f"{i}.jpg"
    path.write_bytes(_encoded(_image(i, "RGB", (8, 8)), "JPEG"))
    return Image.open(path)


def _sha(data: bytes) -> dict[str, str]:
    return {"sha256": hashlib.sha256(data).hexdigest()}


def _array(a: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"dtype": str(a.dtype), "shape": list(a.shape), "values": a.ravel().tolist()}


def _pixels(image: Image.Image) -> dict[str, Any]:
    return {"mode": image.mode, "size": list(image.size), "hex": image.tobytes().hex()}


def _mds_sample(i: int, tmp: Path) -> dict[str, Any]:
    return {
        "image": _jpeg_file(tmp, i),
        "mask": _image(i, "L", (4, 4)),
        "thumb": _image(i, "RGB", (2, 2)),
        "label": i % 3,
        "small": 200 + i,
        "score": i / 4,
        "digits": 10**12 + i,
        "text": f"sample {i}: é",
        "vec": np.arange(i, i + 2 * (1 + i % 2), dtype=np.float32).reshape(2, -1),
        "fixed": np.array([i, -i, 7], dtype=np.int16),
        "meta": {"i": i, "tags": ["a", "b"][: i % 3]},
        "raw": bytes(range(i, i + 5)),
        "pick": {"i": i, "set": sorted({i, 2})},
        "frames": [_image(i + j, "L", (2, 2)) for j in range(1 + i % 2)],
    }


def _mds_expected(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "image": _sha(Path(s["image"].filename).read_bytes()),
        "mask": _pixels(s["mask"]),
        "thumb": _pixels(s["thumb"]),
        "label": s["label"],
        "small": s["small"],
        "score": float(np.float32(s["score"])),
        "digits": s["digits"],
        "text": s["text"],
        "vec": _array(s["vec"]),
        "fixed": _array(s["fixed"]),
        "meta": s["meta"],
        "raw": _sha(s["raw"]),
        "pick": _sha(pickle.dumps(s["pick"])),
        "frames": [_pixels(f) for f in s["frames"]],
    }


def _check_mds(root: Path, expected: list[dict[str, Any]], tmp: Path) -> None:
    """Read the dataset back with streaming's own reader, from a copy (the reader writes the
    decompressed shards beside the compressed ones)."""
    from streaming import StreamingDataset

    copy = tmp / f"check-{root.name}"
    shutil.copytree(root, copy)
    ds = StreamingDataset(local=str(copy), shuffle=False, batch_size=1, allow_unsafe_types=True)
    assert len(ds) == N
    for i, want in enumerate(expected):
        got = ds[i]
        assert got["label"] == want["label"] and got["text"] == want["text"], i
        assert _array(got["vec"]) == want["vec"] and got["meta"] == want["meta"], i
        assert _pixels(got["thumb"]) == want["thumb"], i
        assert [_pixels(f) for f in got["frames"]] == want["frames"], i


def write_mds(tmp: Path, name: str, compression: str | None) -> list[dict[str, Any]]:
    from streaming import MDSWriter

    root = OUT / name
    shutil.rmtree(root, ignore_errors=True)
    samples = [_mds_sample(i, tmp) for i in range(N)]
    # a shard a few samples long: the conversion crosses shard boundaries
    with MDSWriter(
        out=str(root), columns=MDS_COLUMNS, compression=compression, size_limit=4096,
        hashes=["sha1", "xxh64"],
    ) as writer:  # fmt: skip
        for sample in samples:
            writer.write(sample)
    expected = [_mds_expected(s) for s in samples]
    _check_mds(root, expected, tmp)
    return expected


def _lit_sample(i: int, tmp: Path) -> dict[str, Any]:
    return {
        "image": _jpeg_file(tmp, i),
        "label": i % 3,
        "text": f"sample {i}",
        "vec": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
        "ids": np.arange(i, i + 3, dtype=np.int16),
        "weights": torch.arange(4, dtype=torch.float64).reshape(2, 2) * i,
        "score": i / 8,
        "flag": i % 2 == 0,
        "raw": bytes([i]) * 3,
        "boxes": [[1, 2, 3, 4], [i, i, i + 1, i + 1]][: 1 + i % 2],
        "meta": {"source": f"s{i}", "n": i},
    }


def _lit_expected(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "image": _sha(Path(s["image"].filename).read_bytes()),
        "label": s["label"],
        "text": s["text"],
        "vec": _array(s["vec"]),
        "ids": _array(s["ids"]),
        "weights": _array(s["weights"].numpy()),
        "score": s["score"],
        "flag": s["flag"],
        "raw": _sha(s["raw"]),
        "boxes": s["boxes"],
        "meta.source": s["meta"]["source"],
        "meta.n": s["meta"]["n"],
    }


def _lit_fn(item: tuple[int, str, str]) -> Any:
    i, tmp, shape = item
    sample = _lit_sample(i, Path(tmp))
    if shape == "tuple":
        return (sample["image"], sample["label"])
    return sample


def _check_lit(root: Path, expected: list[dict[str, Any]], shape: str) -> None:
    from litdata import StreamingDataset

    ds = StreamingDataset(str(root))
    assert len(ds) == len(expected)
    for i, want in enumerate(expected):
        got = ds[i]
        if shape == "tuple":
            assert got[1] == want["label"], i
            continue
        assert got["label"] == want["label"] and got["text"] == want["text"], i
        assert _array(got["vec"]) == want["vec"] and got["boxes"] == want["boxes"], i
        assert got["meta"] == {"source": want["meta.source"], "n": want["meta.n"]}, i


def write_litdata(tmp: Path, name: str, shape: str, **options: Any) -> list[dict[str, Any]]:
    import litdata

    root = OUT / name
    shutil.rmtree(root, ignore_errors=True)
    count = N if not options else 3
    litdata.optimize(
        fn=_lit_fn,
        inputs=[(i, str(tmp), shape) for i in range(count)],
        output_dir=str(root),
        chunk_bytes=4096,
        num_workers=1,
        verbose=False,
        **options,
    )
    samples = [_lit_sample(i, tmp) for i in range(count)]
    expected = [_lit_expected(s) for s in samples]
    if shape == "tuple":
        expected = [{"0": e["image"], "1": e["label"], "label": e["label"]} for e in expected]
    if not options:
        _check_lit(root, expected, shape)
    return expected


def _json_lines(expected: dict[str, list[dict[str, Any]]]) -> str:
    """``{"dataset": [sample, ...]}`` as JSON, one sample a line (small, and diffs well)."""
    parts = []
    for name, samples in expected.items():
        rows = ",\n".join("  " + json.dumps(s, sort_keys=True) for s in samples)
        parts.append(f" {json.dumps(name)}: [\n{rows}\n ]")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        expected = {
            "mds": write_mds(tmp, "mds", None),
            "litdata": write_litdata(tmp, "litdata", "dict"),
            "litdata-tuple": write_litdata(tmp, "litdata-tuple", "tuple"),
        }
        # the same samples, compressed: their expected values are those of mds and litdata
        for compression in ("gz", "zstd", "br"):
            assert write_mds(tmp, f"mds-{compression}", compression) == expected["mds"]
        zstd = write_litdata(tmp, "litdata-zstd", "dict", compression="zstd")
        assert zstd == expected["litdata"][: len(zstd)]
    (OUT / "expected.json").write_text(_json_lines(expected))
    for path in sorted(OUT.iterdir()):
        if path.is_dir():
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            print(f"{path.name}: {size} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
