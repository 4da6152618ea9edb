"""Packing in parts (`pack --part I/N`, issue 49) and `merge`: the merged store is the one a
single pack makes, and what cannot be merged is refused in one line."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.format.conftest import write_tree
from tests.hostile.test_cli_errors import assert_user_error, tierfeed
from tierfeed import open_store, verify_store
from tierfeed.config import part_from_env
from tierfeed.errors import ConfigError, PackError
from tierfeed.format import merge as merge_module
from tierfeed.format import parts as parts_module
from tierfeed.format import verify as verify_module
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.merge import merge_parts
from tierfeed.format.pack import JOURNAL, PackOptions, pack
from tierfeed.format.parts import (
    pack_part,
    parse_part,
    part_directory,
    part_samples,
    part_shares,
)
from tierfeed.format.tarchunk import ChunkWriter

OPTIONS = PackOptions(chunk_size=8192, workers=2, progress=False)


def _tree() -> dict[bytes, bytes]:
    """About 200 small files: three classes, some nested deeper, and one at the top level."""
    files: dict[bytes, bytes] = {b"README.txt": b"top level"}
    for i in range(200):
        cls = (b"cat", b"dog", b"bird")[i % 3]
        sub = b"" if i % 4 else b"sub%d/" % (i % 3) + (b"deeper/" if i % 8 == 0 else b"")
        files[b"%s/%sf%03d.bin" % (cls, sub, i)] = bytes([i % 251]) * (200 + 37 * i % 1500)
    return files


@pytest.fixture
def src(tmp_path: Path) -> Path:
    write_tree(tmp_path / "src", _tree())
    return tmp_path / "src"


def _samples(store: Path) -> list[tuple[bytes, int, list[tuple[bytes, bytes]]]]:
    """(key, label, [(extension, bytes)]) of every sample, read from the chunk files."""
    out = []
    with Index(store, recheck=True) as ix:
        for s in range(ix.num_samples):
            members = []
            for m in ix.members(s):
                path = ix.chunk_root / ix.chunk_name(int(ix.member_chunk[m]))
                with open(path, "rb") as fh:
                    fh.seek(int(ix.member_offset[m]))
                    data = fh.read(int(ix.member_length[m]))
                members.append((ix.exts[int(ix.member_ext[m])], data))
            out.append((ix.key_bytes(s), int(ix.sample_label[s]), members))
    return out


def _classes(store: Path) -> list[str]:
    with Index(store) as ix:
        return ix.classes


def _pack_in_parts(src: Path, dst: Path, count: int) -> None:
    for i in range(count):
        pack_part(src, dst, (i, count), OPTIONS)


@pytest.mark.parametrize("count", [1, 3])
def test_merged_parts_are_the_single_pack(tmp_path: Path, src: Path, count: int) -> None:
    single, parted = tmp_path / "single", tmp_path / "parted"
    pack(src, single, OPTIONS)
    _pack_in_parts(src, parted, count)
    for i in range(count):  # several chunks per part, each in its own directory
        with Index(part_directory(parted, i, count)) as ix:
            assert ix.num_chunks >= 3
    report = merge_parts(parted, progress=False)
    assert report.parts == count
    assert _classes(parted) == _classes(single) == ["bird", "cat", "dog"]
    assert _samples(parted) == _samples(single)
    assert verify_store(parted, progress=False) == []
    with open_store(parted) as store, open_store(single) as ref:
        assert len(store) == len(ref) == 201
        assert store.classes == ref.classes
        assert store.read_samples(range(201)) == ref.read_samples(range(201))
        assert store.listdir("cat") == ref.listdir("cat")
    assert not (parted / "chunks").exists()  # no chunk was copied


def test_part_samples_split_the_store_order() -> None:
    for total in (1, 7, 200):
        for count in (1, 3, 8):
            shares = [part_samples(total, i, count) for i in range(count)]
            assert [s for r in shares for s in r] == list(range(total))


def test_parse_part_and_the_environment() -> None:
    assert parse_part("3/8") == (3, 8)
    for bad in ("8/8", "-1/8", "3", "a/b", "3/0"):
        with pytest.raises(ConfigError):
            parse_part(bad)
    assert part_from_env({"RANK": "2", "WORLD_SIZE": "4", "SLURM_PROCID": "0"}) == (2, 4)
    array = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "8"}
    assert part_from_env({**array, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == (4, 8)
    assert part_from_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}) == (3, 4)
    with pytest.raises(ConfigError, match="none of"):
        part_from_env({})
    with pytest.raises(ConfigError, match="not one of"):
        part_from_env({"RANK": "4", "WORLD_SIZE": "4"})


@pytest.mark.hostile
def test_a_missing_part_is_named(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    pack_part(src, dst, (0, 3), OPTIONS)
    pack_part(src, dst, (2, 3), OPTIONS)
    with pytest.raises(
        PackError, match=r"part 1 of 3 is missing: run `tierfeed pack .* --part 1/3"
    ):
        merge_parts(dst, progress=False)
    assert not (dst / INDEX_NAME).exists()


@pytest.mark.hostile
def test_parts_of_another_count_are_refused(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 2)
    pack_part(src, dst, (0, 3), OPTIONS)
    with pytest.raises(PackError, match="parts of 2 and 3 parts"):
        merge_parts(dst, progress=False)
    assert not (dst / INDEX_NAME).exists()


@pytest.mark.hostile
def test_a_part_of_a_changed_source_is_refused(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    pack_part(src, dst, (0, 2), OPTIONS)
    (src / "cat" / "new.bin").write_bytes(b"added after part 0")
    pack_part(src, dst, (1, 2), OPTIONS)
    with pytest.raises(PackError, match="another source"):
        merge_parts(dst, progress=False)
    assert not (dst / INDEX_NAME).exists()


def test_a_finished_part_run_again_is_left_as_it_is(tmp_path: Path, src: Path) -> None:
    """A requeued array task: the same part of the same source, finished, is reported and
    left alone; once the source changed, it is a store that only --overwrite replaces."""
    dst = tmp_path / "dst"
    first = pack_part(src, dst, (1, 2), OPTIONS)
    chunks = sorted((part_directory(dst, 1, 2) / "chunks").iterdir())
    written = [c.stat().st_mtime_ns for c in chunks]
    again = pack_part(src, dst, (1, 2), OPTIONS)
    assert (again.samples, again.chunks) == (first.samples, first.chunks)
    assert again.resumed_chunks == first.chunks
    assert [c.stat().st_mtime_ns for c in chunks] == written
    (src / "cat" / "new.bin").write_bytes(b"added after the part")
    with pytest.raises(PackError, match="already holds a store"):
        pack_part(src, dst, (1, 2), OPTIONS)


@pytest.mark.hostile
def test_a_part_in_the_wrong_place_is_refused(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 2)
    # part 0 copied over part 1: two copies of one share, none of the other
    shutil.rmtree(part_directory(dst, 1, 2))
    shutil.copytree(part_directory(dst, 0, 2), part_directory(dst, 1, 2))
    with pytest.raises(PackError, match="does not hold part 1 of 2"):
        merge_parts(dst, progress=False)


@pytest.mark.hostile
def test_a_damaged_chunk_is_refused(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 2)
    chunk = part_directory(dst, 1, 2) / "chunks" / "000001.tar"
    data = bytearray(chunk.read_bytes())
    data[700] ^= 0xFF
    os.chmod(chunk, 0o600)
    chunk.write_bytes(bytes(data))
    with pytest.raises(PackError, match=r"000001\.tar"):
        merge_parts(dst, progress=False)
    assert not (dst / INDEX_NAME).exists()


def _part_bytes(store: Path, count: int) -> list[int]:
    """The bytes of the samples each part of ``store`` holds."""
    out = []
    for i in range(count):
        with Index(part_directory(store, i, count)) as ix:
            out.append(int(ix.member_length.sum()))
    return out


def test_parts_are_balanced_by_bytes(tmp_path: Path) -> None:
    """A few big files and many tiny ones: each part holds about a third of the bytes (within
    the largest sample), not a third of the samples, and the merged store is the single pack."""
    files = {b"big/%d.bin" % i: bytes([i]) * (30_000 + 7_000 * i) for i in range(3)}
    files |= {b"tiny/%03d.bin" % i: bytes([i % 251]) * (50 + i % 40) for i in range(300)}
    write_tree(tmp_path / "src", files)
    src, single, parted, count = tmp_path / "src", tmp_path / "single", tmp_path / "parted", 3
    pack(src, single, OPTIONS)
    _pack_in_parts(src, parted, count)
    total, largest = sum(map(len, files.values())), max(map(len, files.values()))
    held = _part_bytes(parted, count)
    assert sum(held) == total
    assert all(abs(count * b - total) <= count * largest for b in held), held
    with Index(part_directory(parted, 0, count)) as ix:
        assert ix.num_samples < 303 // count  # a count split puts the three big ones in part 0
    merge_parts(parted, progress=False)
    assert _samples(parted) == _samples(single)
    assert verify_store(parted, progress=False) == []


@settings(max_examples=300)
@given(
    st.lists(st.one_of(st.integers(0, 10), st.integers(0, 2**40)), max_size=60),
    st.integers(1, 12),
)
def test_part_shares_cover_and_balance(sizes: list[int], count: int) -> None:
    shares = part_shares(sizes, count)
    assert shares == part_shares(sizes, count)  # deterministic
    assert len(shares) == count
    assert shares[0].start == 0 and shares[-1].stop == len(sizes)
    assert all(a.stop == b.start for a, b in itertools.pairwise(shares))
    assert all(s.step == 1 and s.start <= s.stop for s in shares)  # contiguous, in order
    if len(sizes) >= count:
        assert all(shares)
    total, largest = sum(sizes), max(sizes, default=0)
    for share in shares:  # within the largest item of an even share
        assert abs(count * sum(sizes[share.start : share.stop]) - total) <= count * largest


@pytest.mark.hostile
def test_overlapping_parts_are_refused(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part 0 packed with another split (an older tierfeed's): its share overlaps part 1's."""
    dst = tmp_path / "dst"
    real = parts_module.part_shares

    def longer(sizes: list[int], count: int) -> list[range]:
        shares = real(sizes, count)
        return [range(shares[0].start, shares[0].stop + 5), *shares[1:]]

    monkeypatch.setattr(parts_module, "part_shares", longer)
    pack_part(src, dst, (0, 2), OPTIONS)
    monkeypatch.setattr(parts_module, "part_shares", real)
    pack_part(src, dst, (1, 2), OPTIONS)
    with pytest.raises(PackError, match=r"part-0001-of-0002: holds samples .* the parts overlap"):
        merge_parts(dst, progress=False)
    assert not (dst / INDEX_NAME).exists()


def test_merge_opens_each_part_once(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The part's index opened (in full) for the checks is the one its chunks are verified
    and merged from."""
    dst, opened = tmp_path / "dst", []
    _pack_in_parts(src, dst, 2)

    class Counted(Index):
        def __init__(self, path: Path, *args: Any, **kw: Any) -> None:
            opened.append(Path(path))
            super().__init__(path, *args, **kw)

    monkeypatch.setattr(merge_module, "Index", Counted)
    monkeypatch.setattr(verify_module, "Index", Counted)
    merge_parts(dst, progress=False)
    assert sorted(opened) == [part_directory(dst, i, 2) for i in range(2)]


def test_merging_again_writes_the_same_index(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    _pack_in_parts(src, dst, 3)
    merge_parts(dst, progress=False)
    first = (dst / INDEX_NAME).read_bytes()
    merge_parts(dst, progress=False)
    assert (dst / INDEX_NAME).read_bytes() == first


def test_a_single_pack_store_is_not_replaced(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    pack(src, dst, OPTIONS)
    _pack_in_parts(src, dst, 2)
    with pytest.raises(PackError, match="already holds a store"):
        merge_parts(dst, progress=False)
    merge_parts(dst, overwrite=True, progress=False)
    assert verify_store(dst, progress=False) == []


def _lines(path: Path) -> int:
    """Lines in ``path``; 0 while it does not exist."""
    try:
        return path.read_text().count("\n")
    except FileNotFoundError:
        return 0


def test_an_interrupted_part_resumes(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst, single = tmp_path / "dst", tmp_path / "single"
    pack(src, single, OPTIONS)
    pack_part(src, dst, (0, 2), OPTIONS)
    real, commits = ChunkWriter.commit, []
    journal = part_directory(dst, 1, 2) / JOURNAL

    def failing(self: ChunkWriter) -> tuple[int, int]:
        if len(commits) == 3:
            # as a kill would, mid-part, once two chunks are journalled (synced on a thread)
            # (the journal appears with the first chunk synced: under load, after this call)
            deadline = time.monotonic() + 10
            while _lines(journal) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            raise KeyboardInterrupt
        commits.append(self.path)
        return real(self)

    monkeypatch.setattr(ChunkWriter, "commit", failing)
    with pytest.raises(KeyboardInterrupt):
        pack_part(src, dst, (1, 2), OPTIONS)
    monkeypatch.setattr(ChunkWriter, "commit", real)
    with pytest.raises(PackError, match="part 1 of 2 is not finished"):
        merge_parts(dst, progress=False)
    report = pack_part(src, dst, (1, 2), OPTIONS)
    assert report.resumed_chunks >= 2
    merge_parts(dst, progress=False)
    assert _samples(dst) == _samples(single)


def test_cli_pack_parts_from_the_environment_then_merge(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    for i in range(2):
        done = tierfeed("pack", src, dst, "-q", "--chunk-size", "8KiB", "--part", f"{i}/2")
        assert done.returncode == 0, done.stderr
        assert "tierfeed merge" in done.stdout
    done = tierfeed("merge", dst, "-q")
    assert done.returncode == 0, done.stderr
    assert "merged 2 parts: 201 samples" in done.stdout
    assert tierfeed("verify", dst, "-q").returncode == 0


def test_cli_errors_are_one_line(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    assert_user_error(tierfeed("pack", src, dst, "--part", "3/3"), "pack", "3/3", status=2)
    assert_user_error(tierfeed("pack", src, dst, "--part", "x"), "pack", "--part", status=2)
    if not any(
        name in os.environ for name in ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID")
    ):
        env_less = tierfeed("pack", src, dst, "-q", "--part", "env")
        assert_user_error(env_less, "pack", "--part env")
    assert_user_error(tierfeed("merge", dst), "merge", dst)
    done = tierfeed("pack", src, dst, "-q", "--chunk-size", "8KiB", "--part", "0/2")
    assert done.returncode == 0, done.stderr
    assert_user_error(tierfeed("merge", dst, "-q"), "merge", "part 1 of 2 is missing", "--part 1/2")
