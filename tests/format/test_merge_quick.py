"""`merge` at scale (issue 49): a chunk still as its part wrote it is not read again, any other
is verified in full (and every one with ``verify=True``); the parts' path orders, key checks
and keys are joined, not recomputed, and the merged index is the one a single pack writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.format.conftest import write_tree
from tests.format.test_pack_parts import OPTIONS, _pack_in_parts, _samples
from tests.hostile.test_cli_errors import tierfeed
from tierfeed.errors import PackError
from tierfeed.format import merge as merge_module
from tierfeed.format import verify as verify_module
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.merge import merge_parts
from tierfeed.format.pack import pack
from tierfeed.format.parts import part_directory


def _tree() -> dict[bytes, bytes]:
    """Keys where one is a prefix of the next ("x" and "x-1"): their paths sort the other way
    round ("x-1.bin" < "x.bin"), so parts cut between them interleave."""
    files = {}
    for i in range(60):
        stem = b"cls%d/%02d" % (i % 2, i // 6)
        for tail in (b"", b"-1", b"-1-a"):
            files[stem + tail + b".bin"] = bytes([i]) * (100 + i)
    return files


@pytest.fixture
def src(tmp_path: Path) -> Path:
    write_tree(tmp_path / "src", _tree())
    return tmp_path / "src"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The chunk files `verify` reads (checksums) during the test."""
    seen: list[Path] = []
    real = verify_module.checksum_file

    def counted(path: Path, *args: Any, **kw: Any) -> Any:
        seen.append(Path(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(verify_module, "checksum_file", counted)
    return seen


def _chunks(dst: Path, count: int) -> list[Path]:
    return sorted(c for i in range(count) for c in part_directory(dst, i, count).rglob("*.tar"))


def test_chunks_as_written_are_not_read_again(tmp_path: Path, src: Path, reads: list[Path]) -> None:
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 3)
    assert merge_parts(dst, progress=False).chunks_read == 0
    assert reads == []
    touched = _chunks(dst, 3)[1]
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, new mtime
    assert merge_parts(dst, progress=False).chunks_read == 1
    assert reads == [touched]
    reads.clear()
    assert merge_parts(dst, progress=False, verify=True).chunks_read == len(_chunks(dst, 3))
    assert sorted(reads) == _chunks(dst, 3)


@pytest.mark.hostile
def test_a_chunk_altered_in_place_with_its_mtime_put_back(
    tmp_path: Path, src: Path, reads: list[Path]
) -> None:
    """What the quick check cannot see (the bytes changed, size and mtime as they were) is
    merged, and refused by ``--verify`` and by `tierfeed verify` of the merged store."""
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 2)
    chunk = _chunks(dst, 2)[0]
    stat = chunk.stat()
    data = bytearray(chunk.read_bytes())
    data[600] ^= 0xFF
    os.chmod(chunk, 0o600)
    chunk.write_bytes(bytes(data))
    os.utime(chunk, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    merge_parts(dst, progress=False)
    assert reads == []
    with pytest.raises(PackError, match=rf"{chunk.name}: checksum mismatch"):
        merge_parts(dst, progress=False, verify=True)
    done = tierfeed("verify", dst, "-q")
    assert done.returncode != 0 and "checksum mismatch" in done.stderr + done.stdout


def test_a_part_without_mtimes_is_verified_in_full(
    tmp_path: Path, src: Path, reads: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part packed before parts recorded their chunks' mtimes: every chunk of it is read."""
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 2)
    real = merge_module._open_part

    def older(root: Path, index: int, count: int) -> Index:
        ix = real(root, index, count)
        if index == 1:
            del ix.header["extra"]["part"]["chunk_mtime_ns"]
        return ix

    monkeypatch.setattr(merge_module, "_open_part", older)
    merge_parts(dst, progress=False)
    assert sorted(reads) == sorted(part_directory(dst, 1, 2).rglob("*.tar"))


@pytest.mark.parametrize(("count", "interleaved"), [(2, False), (5, True)])
def test_interleaved_parts_merge_to_the_single_pack(
    tmp_path: Path, src: Path, count: int, interleaved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts cut between "x" and "x-1" (5 parts of this tree): their path orders cannot
    simply follow each other, and the writer sorts them; either way the merged index is the
    one a single pack writes."""
    single, dst, handed = tmp_path / "single", tmp_path / "dst", []
    pack(src, single, OPTIONS)
    _pack_in_parts(src, dst, count)
    real = merge_module.write_index

    def seen(path: Path, content: Any, **kw: Any) -> None:
        handed.append(content.path_order is None)
        real(path, content, **kw)

    monkeypatch.setattr(merge_module, "write_index", seen)
    merge_parts(dst, progress=False)
    assert handed == [interleaved]
    with Index(single) as a, Index(dst, recheck=True) as b:
        b.check_path_order()
        paths = [b.sorted_path(i) for i in range(b.num_members)]
        assert paths == [a.sorted_path(i) for i in range(a.num_members)]
        assert [b.key_bytes(s) for s in range(b.num_samples)] == [
            a.key_bytes(s) for s in range(a.num_samples)
        ]
    assert _samples(dst) == _samples(single)


def test_parts_in_order_join_their_path_orders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts whose paths follow each other: the writer is handed the joined order, and it is
    the order a full sort gives."""
    src = tmp_path / "src"
    write_tree(src, {b"c/%03d.bin" % i: b"%d" % i for i in range(40)})
    dst, handed = tmp_path / "dst", []
    _pack_in_parts(src, dst, 4)
    real = merge_module.write_index

    def seen(path: Path, content: Any, **kw: Any) -> None:
        handed.append(content.path_order is not None)
        real(path, content, **kw)

    monkeypatch.setattr(merge_module, "write_index", seen)
    merge_parts(dst, progress=False)
    assert handed == [True]
    with Index(dst, recheck=True) as ix:
        ix.check_path_order()
        assert [ix.sorted_path(i) for i in range(40)] == [b"c/%03d.bin" % i for i in range(40)]


def test_cli_merge_verify(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 2)
    done = tierfeed("merge", dst, "-q", "--verify")
    assert done.returncode == 0, done.stderr
    chunks = len(_chunks(dst, 2))
    assert f"in {chunks} chunks, checked ({chunks} of them read again)" in done.stdout
    done = tierfeed("merge", dst, "-q")
    assert f"in {chunks} chunks, checked (0 of them read again)" in done.stdout
    assert (dst / INDEX_NAME).exists()
