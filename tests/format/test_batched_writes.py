"""Chunks written in batches on a thread, synced in the background, from sources read ahead in
parallel: the same bytes as one member at a time, and a failed write mid-batch leaves no store."""

from __future__ import annotations

import errno
import os
import random
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.format.conftest import read_tree, write_tree
from tierfeed import Writer, open_store, verify_store
from tierfeed.errors import PackError
from tierfeed.format import pack as pack_module
from tierfeed.format import tarchunk
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.chunksync import ChunkSyncer
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import JOURNAL, PackOptions, pack
from tierfeed.format.tarchunk import ChunkWriter, member_header
from tierfeed.publish import is_temporary


def _members(n: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(n)
    return [(f"m/{i:05d}.bin".encode(), rng.randbytes(rng.choice([0, 1, 511, 512, 700, 5000])))
            for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("count", [1, 340, 1500])  # under, near and over one batch's buffers
def test_batched_chunk_is_a_tar_with_the_offsets_and_checksum_given(
    tmp_path: Path, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tarchunk, "_BATCH_BYTES", 64 * 1024)  # many batches, some by bytes
    members = _members(count)
    writer = ChunkWriter(tmp_path / "c.tar")
    offsets = [writer.add(member_header(name, len(data)), data) for name, data in members]
    size, checksum = writer.commit()
    raw = (tmp_path / "c.tar").read_bytes()
    assert (len(raw), checksum_bytes(raw)) == (size, checksum)
    for (_, data), offset in zip(members, offsets, strict=True):
        assert raw[offset : offset + len(data)] == data
    with tarfile.open(tmp_path / "c.tar") as tar:
        assert [m.name.encode() for m in tar.getmembers()] == [n for n, _ in members]
    assert not [t for t in threading.enumerate() if t.name.startswith("tierfeed-chunk")]


def test_a_write_error_mid_batch_drops_the_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = os.writev

    def full_disk(fd: int, parts: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, parts)

    monkeypatch.setattr(tarchunk, "_BATCH_BYTES", 16 * 1024)
    monkeypatch.setattr(os, "writev", full_disk)
    writer = ChunkWriter(tmp_path / "c.tar")
    with pytest.raises(PackError, match=r"c\.tar: cannot write .*free some space"):
        for name, data in _members(400):
            writer.add(member_header(name, len(data)), data)
        writer.commit()
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("tierfeed-chunk")]


def test_writer_full_disk_mid_batch_leaves_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.writev
    calls = {"n": 0}

    def full_disk(fd: int, parts: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, parts)

    monkeypatch.setattr(os, "writev", full_disk)
    monkeypatch.setattr(tarchunk, "_BATCH_BYTES", 16 * 1024)
    dst = tmp_path / "store"
    with pytest.raises(PackError, match="cannot write"), Writer(dst, chunk_size=64 * 1024) as w:
        for i in range(500):
            w.write({"__key__": f"k/{i:04d}", "bin": os.urandom(900)})
    assert not (dst / INDEX_NAME).exists()
    assert list((dst / "chunks").iterdir()) == []


def test_pack_full_disk_mid_batch_leaves_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(tmp_path / "src", {f"c/f{i:03d}.bin".encode(): os.urandom(3000) for i in range(60)})
    real = os.writev
    calls = {"n": 0}

    def full_disk(fd: int, parts: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real(fd, parts)

    monkeypatch.setattr(os, "writev", full_disk)
    monkeypatch.setattr(tarchunk, "_BATCH_BYTES", 8 * 1024)
    dst = tmp_path / "store"
    with pytest.raises(PackError, match="quota"):
        pack(tmp_path / "src", dst, PackOptions(chunk_size=32 * 1024, progress=False))
    assert not (dst / INDEX_NAME).exists()
    assert not [p for p in (dst / "chunks").iterdir() if is_temporary(p.name)]


def test_parallel_reads_in_any_timing_give_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(7)
    files = {f"c{i % 3}/f{i:04d}.jpg".encode(): rng.randbytes(rng.randrange(1, 9000))
             for i in range(300)}  # fmt: skip
    write_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "one", PackOptions(chunk_size=64 * 1024, workers=1,
                                                         progress=False))  # fmt: skip
    real = pack_module.read_source_into

    def jittery(f: Any, view: memoryview) -> None:
        time.sleep(random.random() * 0.002)  # readers finish out of order
        real(f, view)

    monkeypatch.setattr(pack_module, "read_source_into", jittery)
    monkeypatch.setattr("tierfeed.format.packreads._RUN_FILES", 3)
    for workers in (2, 8):
        out = tmp_path / f"w{workers}"
        pack(tmp_path / "src", out, PackOptions(chunk_size=64 * 1024, workers=workers,
                                               progress=False))  # fmt: skip
        assert read_tree(out) == read_tree(tmp_path / "one")
        assert verify_store(out, progress=False) == []
        assert not (out / JOURNAL).exists()


def test_a_changed_buffer_after_write_does_not_change_the_store(tmp_path: Path) -> None:
    buf = bytearray(b"a" * 5000)
    view = memoryview(bytearray(b"b" * 3000))
    with Writer(tmp_path / "s") as w:
        w.write({"__key__": "x", "bin": buf, "dat": view})
        buf[:] = b"z" * 5000
        view[:] = b"y" * 3000
    with open_store(tmp_path / "s") as store:
        assert store.read_sample(0).fields == {"bin": b"a" * 5000, "dat": b"b" * 3000}
    assert verify_store(tmp_path / "s", progress=False) == []


def test_syncer_syncs_in_order_then_calls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real = os.fsync
    names: dict[int, str] = {}
    real_open = os.open

    def spy_open(path: Any, *args: Any, **kw: Any) -> int:
        fd = real_open(path, *args, **kw)
        names[fd] = Path(path).name
        return fd

    def spy_fsync(fd: int) -> None:
        events.append(f"sync {names.get(fd)}")
        real(fd)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    paths = [tmp_path / f"{i}.tar" for i in range(3)]
    for p in paths:
        p.write_bytes(b"x")
    with ChunkSyncer() as syncer:
        for p in paths:
            syncer.add(p, lambda p=p: events.append(f"then {p.name}"))
        syncer.wait()
    assert events == [e for p in paths for e in (f"sync {p.name}", f"then {p.name}")]
    with ChunkSyncer() as syncer:
        syncer.add(tmp_path / "missing.tar")
        with pytest.raises(FileNotFoundError):
            syncer.wait()
