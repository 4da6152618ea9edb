"""pack's copy path (runs read into reused buffers, written a run at a time) against a plain
reference: every chunk is, byte for byte, its members' headers, data and padding in store
order and the end marker, and the index's offsets and checksums name those bytes."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.format.conftest import write_tree
from tierfeed import open_store, verify_store
from tierfeed.errors import UnreadableFileError
from tierfeed.format import pack as pack_module
from tierfeed.format import packreads
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.pack import PackOptions, chunk_file_name, pack
from tierfeed.format.packplan import plan_pack
from tierfeed.format.tarchunk import BLOCK, member_header


def _tree(seed: int) -> dict[bytes, bytes]:
    """Sizes around the block and the run buffer, empty files, long and non-UTF-8 names."""
    rng = random.Random(seed)
    run = packreads._RUN_BYTES
    sizes = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK, run - BLOCK, run, run + 1, 2 * run]
    sizes += [rng.randrange(1, 20_000) for _ in range(150)]
    rng.shuffle(sizes)
    files = {}
    for i, size in enumerate(sizes):
        name = b"c%d/f%04d.bin" % (i % 4, i)
        if i % 17 == 0:
            name = b"c%d/" % (i % 4) + b"long" * 30 + b"%04d.jpg" % i  # a pax header
        if i % 23 == 0:
            name = b"c%d/latin-\xe9%04d.jpg" % (i % 4, i)
        files[name] = rng.randbytes(size)
    return files


def _reference(src: Path, options: PackOptions, left_out: set[bytes]) -> list[bytes]:
    """The chunks as the plainest path writes them: whole files, one member after another."""
    tree = pack_module.source_tree(src, src.parent / "none", options, None)
    plan = plan_pack(tree, options.chunk_size)
    chunks = []
    for c in range(plan.num_chunks):
        parts = []
        for m in plan.chunk_members(c):
            f = plan.files[m]
            if f.rel in left_out:
                continue
            data = Path(os.fsdecode(f.abs)).read_bytes()
            parts += [
                member_header(f.rel, f.size, f.mtime, f.mode),
                data,
                bytes(-len(data) % BLOCK),
            ]
        chunks.append(b"".join(parts) + bytes(2 * BLOCK))
    return chunks


def _check(store: Path, chunks: list[bytes]) -> None:
    got = [(store / chunk_file_name(c)).read_bytes() for c in range(len(chunks))]
    assert [len(g) for g in got] == [len(c) for c in chunks]
    assert got == chunks
    assert not (store / chunk_file_name(len(chunks))).exists()
    assert verify_store(store, progress=False) == []
    with open_store(store) as opened:
        index = opened.index
        for m in range(len(index.member_offset)):
            chunk = got[int(index.member_chunk[m])]
            off, n = int(index.member_offset[m]), int(index.member_length[m])
            assert checksum_bytes(chunk[off : off + n]) == int(index.member_checksum[m])


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("chunk_kib", [64, 1024, 4096])
def test_chunks_are_the_reference_bytes(tmp_path: Path, workers: int, chunk_kib: int) -> None:
    src = tmp_path / "src"
    write_tree(src, _tree(chunk_kib + workers))
    options = PackOptions(chunk_size=chunk_kib * 1024, workers=workers, progress=False)
    pack(src, tmp_path / "store", options)
    _check(tmp_path / "store", _reference(src, options, set()))


def test_a_skipped_member_leaves_no_hole_in_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member that fails mid-run is left out: the next member's bytes go where it was, and
    the reused buffer's stale bytes never reach a chunk."""
    src = tmp_path / "src"
    files = _tree(5)
    write_tree(src, files)
    # first a store that fills the reused buffers with other bytes
    pack(src, tmp_path / "warm", PackOptions(chunk_size=2**20, workers=1, progress=False))
    bad = {name for i, name in enumerate(sorted(files)) if i % 9 == 4}
    real = pack_module.read_source_into

    def fails(f: Any, view: memoryview) -> None:
        if f.rel in bad:
            view[: len(view)] = b"\xff" * len(view)  # a partial read scribbled on the buffer
            raise UnreadableFileError(f"{os.fsdecode(f.abs)}: Input/output error")
        real(f, view)

    monkeypatch.setattr(pack_module, "read_source_into", fails)
    options = PackOptions(chunk_size=2**20, workers=2, skip_unreadable=True, progress=False)
    report = pack(src, tmp_path / "store", options)
    assert sorted(os.fsencode(p) for p, _ in report.skipped) == sorted(bad)
    _check(tmp_path / "store", _reference(src, options, bad))


def test_a_chunk_is_synced_while_the_next_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pack is durable, and its syncs overlap the copy: while chunk 0 is being synced, chunk
    1's bytes are already being written (a pack that waited for each sync would not be)."""
    src = tmp_path / "src"
    write_tree(src, {b"c/f%03d.bin" % i: os.urandom(20_000) for i in range(40)})
    chunks = tmp_path / "store" / "chunks"
    names: dict[int, tuple[str, int]] = {}  # descriptor -> the name it was opened by, its inode
    seen: list[bool] = []
    real_open, real_fsync = os.open, os.fsync

    def spy_open(path: Any, *args: Any, **kw: Any) -> int:
        fd = real_open(path, *args, **kw)
        names[fd] = (os.path.basename(os.fsdecode(path)), os.fstat(fd).st_ino)
        return fd

    def next_chunk_written() -> bool:
        def written(p: Path) -> bool:
            try:
                return p.stat().st_size > 0
            except FileNotFoundError:  # a chunk's temporary name, published since the listing
                return True

        return any(p.name != "000000.tar" and written(p) for p in chunks.iterdir())

    def spy_fsync(fd: int) -> None:
        # The descriptor may have been closed and reused by a file opened otherwise (the
        # index, through open()): chunk 0's only while it is still the same file.
        opened = names.get(fd)
        if opened and opened[0] == "000000.tar" and opened[1] == os.fstat(fd).st_ino and not seen:
            deadline = time.monotonic() + 10
            written = next_chunk_written()
            while not written and time.monotonic() < deadline:
                time.sleep(0.005)
                written = next_chunk_written()
            seen.append(written)
        real_fsync(fd)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    pack(src, tmp_path / "store", PackOptions(chunk_size=128 * 1024, progress=False))
    assert seen == [True]
    assert verify_store(tmp_path / "store", progress=False) == []
