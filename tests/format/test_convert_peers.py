"""`tierfeed convert` and `tierfeed.convert`: MDS and LitData datasets written by the real tools
(tests/data/make_peer_fixtures.py, run with .venv-bench) become stores whose every sample holds
the values the tools were given; damaged or unsupported sources end in one clear line."""

from __future__ import annotations

import hashlib
import importlib
import json
import pickle
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tierfeed
from tierfeed import open_store
from tierfeed.errors import ConfigError, PackError
from tierfeed.format.codecs import decode_field
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.litjson import litdata_json
from tierfeed.format.peercolumns import PeerColumn, sample_of
from tierfeed.loader.convert import convert

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).parents[2]
PEERS = ROOT / "tests" / "data" / "peers"
EXPECTED: dict[str, list[dict[str, Any]]] = json.loads((PEERS / "expected.json").read_text())

# source column -> the field it becomes (the label column is the field cls)
MDS_FIELDS = {
    "image": "image.jpg",
    "mask": "mask.png",
    "thumb": "thumb.png",
    "label": "cls",
    "small": "small.json",
    "score": "score.json",
    "digits": "digits.json",
    "text": "text.txt",
    "vec": "vec.npy",
    "fixed": "fixed.npy",
    "meta": "meta.json",
    "raw": "raw.bin",
    "pick": "pick.pkl",
    "frames": "frames.{}.png",
}
LIT_FIELDS = {
    "image": "image.jpg",
    "label": "cls",
    "text": "text.txt",
    "vec": "vec.npy",
    "ids": "ids.npy",
    "weights": "weights.npy",
    "score": "score.json",
    "flag": "flag.json",
    "raw": "raw.bin",
    "boxes": "boxes.json",
    "meta.source": "meta.source.txt",
    "meta.n": "meta.n.json",
}
TUPLE_FIELDS = {"0": "0.jpg", "1": "cls"}


def zstd_readable() -> bool:
    for name in ("compression.zstd", "zstandard"):
        try:
            importlib.import_module(name)
            return True
        except ImportError:
            pass
    return False


def check_value(want: Any, field: str, raw: bytes) -> None:
    """The stored bytes of ``field`` hold the value ``expected.json`` gives."""
    if isinstance(want, dict) and "sha256" in want:
        assert hashlib.sha256(raw).hexdigest() == want["sha256"], field
        return
    value = decode_field(field, raw)
    if isinstance(want, dict) and "hex" in want:
        got = {"mode": value.mode, "size": list(value.size), "hex": value.tobytes().hex()}
        assert got == want, field
    elif isinstance(want, dict) and "dtype" in want:
        got = {"dtype": str(value.dtype), "shape": list(value.shape), "values": value.tolist()}
        got["values"] = np.asarray(value).ravel().tolist()
        assert got == want, field
    else:
        assert value == want and type(value) is type(want), (field, value, want)


def check_store(store_dir: Path, name: str, fields_of: dict[str, str]) -> None:
    """Every sample of the store holds, in the source's order, exactly the expected fields."""
    expected = EXPECTED[name]
    with open_store(store_dir) as store:
        assert len(store) == len(expected)
        assert store.classes == ["0", "1", "2"]
        for i, want in enumerate(expected):
            sample = store.read_sample(i)
            assert sample.key == f"{i:06d}" and sample.label == want["label"]
            stored = {k: bytes(v) for k, v in sample.fields.items()}
            names = set()
            for column, field in fields_of.items():
                if "{}" in field:  # a list of images: one field each
                    for j, item in enumerate(want[column]):
                        names.add(field.format(j))
                        check_value(item, field.format(j), stored[field.format(j)])
                else:
                    names.add(field)
                    check_value(want[column], field, stored[field])
            assert set(stored) == names


def copy_peer(name: str, tmp_path: Path) -> Path:
    root = tmp_path / name
    shutil.copytree(PEERS / name, root)
    return root


def edit_index(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    index = json.loads((root / "index.json").read_text())
    edit(index)
    (root / "index.json").write_text(json.dumps(index))


def no_hashes(index: dict[str, Any]) -> None:
    for shard in index["shards"]:
        shard["raw_data"]["hashes"] = {}


# --- what converts --------------------------------------------------------------------------


MDS_NAMES = ["mds", "mds-gz", *(["mds-zstd"] if zstd_readable() else [])]


@pytest.mark.parametrize("name", MDS_NAMES)
def test_an_mds_dataset_converts_sample_by_sample(name: str, tmp_path: Path) -> None:
    report = convert(PEERS / name, tmp_path / "st", label_column="label")
    assert report.samples == 12
    check_store(tmp_path / "st", "mds", MDS_FIELDS)


def test_a_litdata_dataset_converts_sample_by_sample(tmp_path: Path) -> None:
    convert(PEERS / "litdata", tmp_path / "st", label_column="label")
    check_store(tmp_path / "st", "litdata", LIT_FIELDS)


def test_a_litdata_tuple_sample_has_its_items_by_position(tmp_path: Path) -> None:
    convert(PEERS / "litdata-tuple", tmp_path / "st", label_column="1")
    check_store(tmp_path / "st", "litdata-tuple", TUPLE_FIELDS)


def test_without_a_label_column_the_label_is_data(tmp_path: Path) -> None:
    convert(PEERS / "mds", tmp_path / "st")
    with open_store(tmp_path / "st") as store:
        sample = store.read_sample(4)
        assert sample.label == -1 and store.classes == []
        assert decode_field("label.json", bytes(sample.fields["label.json"])) == 1


def test_a_pickle_is_stored_never_unpickled(tmp_path: Path, monkeypatch: Any) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("convert unpickled a column")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    convert(PEERS / "mds", tmp_path / "st")
    with open_store(tmp_path / "st") as store:
        raw = bytes(store.read_sample(2).fields["pick.pkl"])
    assert decode_field("pick.pkl", raw) == raw  # tierfeed's decoders leave it as bytes


def test_read_back_through_the_torch_dataset(tmp_path: Path) -> None:
    from tierfeed.loader import DeadlineOptions
    from tierfeed.torch import Dataset, Loader

    tierfeed.convert(PEERS / "mds-gz", tmp_path / "st", label_column="label")
    # The plan's order exactly (the guard, on by default, may deliver a late read after
    # others on a loaded machine: the order asserted below is the store's).
    exact = DeadlineOptions(enabled=False)
    ds = Dataset(tmp_path / "st", plan="sequential", batch_size=12, decode="auto", deadline=exact)
    with Loader(ds) as loader:
        (batch,) = list(loader)
    want = EXPECTED["mds"]
    assert list(batch["__key__"]) == [f"{i:06d}" for i in range(12)]
    assert batch["__label__"].tolist() == [w["label"] for w in want]
    assert list(batch["text.txt"]) == [w["text"] for w in want]
    assert list(batch["meta.json"]) == [w["meta"] for w in want]
    assert batch["fixed.npy"].shape == (12, 3)
    assert [im.size for im in batch["image.jpg"]] == [(8, 8)] * 12


def test_an_image_whose_mode_png_drops_is_stored_as_tiff(tmp_path: Path) -> None:
    from PIL import Image

    image = Image.new("F", (2, 2), 0.5)
    sample = sample_of("000000", [PeerColumn("thumb", "pil", "png")], ["thumb.png"], [image], "")
    assert list(sample) == ["__key__", "thumb.tiff"]
    with tierfeed.Writer(tmp_path / "st") as writer:
        writer.write(sample)
    with open_store(tmp_path / "st") as store:
        raw = bytes(store.read_sample(0).fields["thumb.tiff"])
    assert decode_field("thumb.tiff", raw).getpixel((1, 1)) == 0.5


def test_tierfeed_convert_is_the_public_function() -> None:
    assert tierfeed.convert is convert and "convert" in tierfeed.__all__


# --- what is refused, in Python ---------------------------------------------------------------


@pytest.mark.skipif(zstd_readable(), reason="zstd is readable here")
def test_zstd_without_a_decompressor_is_refused_before_a_write(tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"shard.00000.mds.zstd: .*'zstd'.*pip install zstandard"):
        convert(PEERS / "mds-zstd", tmp_path / "st")
    assert not (tmp_path / "st").exists()


def test_litdata_framed_compression_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"framed layout .*litdata.StreamingDataset"):
        convert(PEERS / "litdata-zstd", tmp_path / "st")


@pytest.mark.parametrize(
    ("column", "says"),
    [
        ("text", "holds str values"),
        ("nope", "no column 'nope' for the label; the columns are"),
        ("digits", "the label 1000000000000 is outside"),
    ],
)
def test_a_label_column_must_hold_small_integers(tmp_path: Path, column: str, says: str) -> None:
    with pytest.raises(PackError, match=says):
        convert(PEERS / "mds", tmp_path / "st", label_column=column)


def test_classes_need_a_label_column(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="label_column"):
        convert(PEERS / "mds", tmp_path / "st", classes=["a", "b", "c"])


@pytest.mark.hostile
def test_a_damaged_sample_names_its_shard_and_sample(tmp_path: Path) -> None:
    root = copy_peer("mds", tmp_path)
    edit_index(root, no_hashes)  # past the hash check: the sample's own sizes are checked
    shard = bytearray((root / "shard.00001.mds").read_bytes())
    (start,) = struct.unpack_from("<I", shard, 4 + 4 * 1)  # sample 1
    struct.pack_into("<I", shard, start, 0xFFFFFF00)  # its first column's size
    (root / "shard.00001.mds").write_bytes(bytes(shard))
    with pytest.raises(PackError, match=r"shard.00001.mds, sample 1: column 'digits' runs past"):
        convert(root, tmp_path / "st")


@pytest.mark.hostile
def test_a_changed_byte_fails_the_shard_hash(tmp_path: Path) -> None:
    root = copy_peer("mds", tmp_path)
    shard = bytearray((root / "shard.00002.mds").read_bytes())
    shard[-3] ^= 0xFF
    (root / "shard.00002.mds").write_bytes(bytes(shard))
    with pytest.raises(PackError, match=r"shard.00002.mds: its sha1 hash"):
        convert(root, tmp_path / "st")


@pytest.mark.hostile
def test_a_huge_sample_count_is_refused_without_allocating_it(tmp_path: Path) -> None:
    root = copy_peer("mds", tmp_path)

    def claim(index: dict[str, Any]) -> None:
        no_hashes(index)
        index["shards"][0]["samples"] = 0xFFFFFFFF

    edit_index(root, claim)
    shard = bytearray((root / "shard.00000.mds").read_bytes())
    struct.pack_into("<I", shard, 0, 0xFFFFFFFF)
    (root / "shard.00000.mds").write_bytes(bytes(shard))
    with pytest.raises(PackError, match=r"shard.00000.mds: \d+ bytes, too short"):
        convert(root, tmp_path / "st")


@pytest.mark.hostile
def test_a_shard_name_may_not_leave_the_dataset(tmp_path: Path) -> None:
    root = copy_peer("mds", tmp_path)
    edit_index(root, lambda ix: ix["shards"][0]["raw_data"].update(basename="../x/shard.mds"))
    with pytest.raises(PackError, match="leaves the dataset directory"):
        convert(root, tmp_path / "st")


@pytest.mark.hostile
def test_a_damaged_litdata_item_names_its_chunk_and_sample(tmp_path: Path) -> None:
    root = copy_peer("litdata", tmp_path)
    chunk = bytearray((root / "chunk-0-1.bin").read_bytes())
    (start,) = struct.unpack_from("<I", chunk, 4 + 4 * 2)  # item 2
    struct.pack_into("<I", chunk, start, 0xFFFFFF00)  # its first leaf's size
    (root / "chunk-0-1.bin").write_bytes(bytes(chunk))
    with pytest.raises(PackError, match=r"chunk-0-1.bin, sample 2: its leaves take"):
        convert(root, tmp_path / "st")


@pytest.mark.hostile
def test_a_litdata_array_header_cannot_claim_a_huge_shape(tmp_path: Path) -> None:
    root = copy_peer("litdata", tmp_path)
    chunk = bytearray((root / "chunk-0-0.bin").read_bytes())
    (start,) = struct.unpack_from("<I", chunk, 4)  # item 0
    sizes = struct.unpack_from("<12I", chunk, start)
    vec = start + 4 * 12 + sum(sizes[:3])  # the numpy leaf: [dtype][ndim][shape...]
    struct.pack_into("<I", chunk, vec + 4, 0x7FFFFFFF)
    (root / "chunk-0-0.bin").write_bytes(bytes(chunk))
    with pytest.raises(PackError, match=r"sample 0, leaf 'vec': .*too short"):
        convert(root, tmp_path / "st")


@pytest.mark.hostile
@pytest.mark.parametrize(
    "leaf",
    [
        b"\x01\xff\xff\xff\x7f",  # a list of 2**31 strings in 0 bytes
        b"\x06\x05\x00\x00\x00\x00\x00\x00\x00",  # five records without a field
        b"\x05" + b"\x01\x00\x00\x00" + b"\x01\x00\x00\x00k" + b"\x05\x01\x00\x00\x00" * 30,
        b"\x08\x01\x02",  # an int64 cut short
        b"\x0b\x0b",  # a second value after the first
        b"\x30",  # JSON text? no: starts with '0', stored as it is
    ],
)
def test_litdata_compact_json_is_bounded(leaf: bytes) -> None:
    if leaf[0] > 0x20:
        assert litdata_json(memoryview(leaf), "leaf") == leaf
        return
    with pytest.raises(PackError, match="not LitData's json layout"):
        litdata_json(memoryview(leaf), "leaf")


def test_litdata_compact_json_reads_what_litdata_writes() -> None:
    leaf = (
        b"\x05\x02\x00\x00\x00"  # a dict of two
        + b"\x01\x00\x00\x00a"
        + b"\x02\x02\x00\x00\x00"
        + struct.pack("<qq", 1, -2)
        + b"\x01\x00\x00\x00b"
        + b"\x06\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00x\x11\x02\x00\x00\x00hi"
    )
    assert litdata_json(memoryview(leaf), "leaf") == {"a": [1, -2], "b": [{"x": "hi"}]}


# --- the command line ----------------------------------------------------------------------


def tierfeed_cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierfeed", "convert", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def one_line(done: subprocess.CompletedProcess[str], *names: object) -> str:
    """Exactly one stderr line `tierfeed convert: error: ...` naming ``names``; exit 1."""
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("tierfeed convert: error: "), done.stderr
    for name in names:
        assert str(name) in lines[0], done.stderr
    return lines[0]


def test_the_command_converts_and_refuses_a_store_at_dst(tmp_path: Path) -> None:
    dst = tmp_path / "st"
    first = tierfeed_cli(PEERS / "litdata", dst, "--label-column", "label", "-q")
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert "converted 12 samples of the LitData dataset" in first.stdout
    before = (dst / INDEX_NAME).read_bytes()
    line = one_line(tierfeed_cli(PEERS / "mds", dst, "-q"), dst, "already holds a store")
    assert "--overwrite" in line and (dst / INDEX_NAME).read_bytes() == before
    again = tierfeed_cli(PEERS / "mds", dst, "-q", "--label-column", "label", "--overwrite")
    assert again.returncode == 0, again.stderr
    check_store(dst, "mds", MDS_FIELDS)


def test_the_command_refuses_a_directory_of_neither_format(tmp_path: Path) -> None:
    line = one_line(tierfeed_cli(tmp_path, tmp_path / "st"), tmp_path, "no index.json here")
    assert "MDSWriter or litdata.optimize" in line
    (tmp_path / "index.json").write_text('{"version": 1, "files": []}')
    line = one_line(tierfeed_cli(tmp_path, tmp_path / "st"), "neither an MDS index")
    assert "LitData" in line


@pytest.mark.hostile
def test_the_command_names_a_truncated_shard(tmp_path: Path) -> None:
    root = copy_peer("mds-gz", tmp_path)
    shard = root / "shard.00002.mds.gz"
    shard.write_bytes(shard.read_bytes()[:-40])
    line = one_line(tierfeed_cli(root, tmp_path / "st", "-q"), shard, "truncated")
    assert "copy it again" in line


def test_the_command_refuses_a_compression_it_cannot_read(tmp_path: Path) -> None:
    line = one_line(tierfeed_cli(PEERS / "mds-br", tmp_path / "st"), "shard.00000.mds.br", "'br'")
    assert "uncompressed" in line
    assert not (tmp_path / "st").exists()  # refused before anything was written


def test_the_command_never_writes_into_its_source(tmp_path: Path) -> None:
    root = copy_peer("mds", tmp_path)
    one_line(tierfeed_cli(root, root / "store", "-q"), "inside the source")
    assert not (root / "store").exists()
