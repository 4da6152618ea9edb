"""One atomic publish (temporary name, rename) and one sweeper of stale temporaries."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tierfeed import Writer
from tierfeed.distributed.inbox import Inbox
from tierfeed.errors import PackError
from tierfeed.format.index import IndexContent, write_index
from tierfeed.format.tarchunk import ChunkWriter, member_header
from tierfeed.publish import (
    is_temporary,
    publish,
    publishing,
    sweep_stale,
    temporary_path,
    writer_pid,
)
from tierfeed.storage import PosixDriver
from tierfeed.storage.shared_dir import mark

# A writer that starts publishing ``argv[1]``, says so, and waits to be killed.
WRITER = """
import sys, time
from tierfeed.publish import publishing
out = publishing(sys.argv[1])
out.write(b"half of it")
print(out.temporary, flush=True)
time.sleep(60)
"""


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_temporary_name_carries_the_pid_and_the_final_name(tmp_path: Path) -> None:
    tmp = temporary_path(tmp_path / "000001.tar")
    assert tmp == tmp_path / f".tmp.{os.getpid()}.000001.tar"
    assert is_temporary(tmp.name) and writer_pid(tmp.name) == os.getpid()
    assert writer_pid(temporary_path("x.tar", pid=42).name) == 42
    for name in ("000001.tar", "a.tmp.3.b", ".tmp.", ".tmp.12", ".tmp.12.", ".tmp.x.a"):
        assert not is_temporary(name), name


def test_publish_renames_whole_content_into_place(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    target.write_bytes(b"old")
    publish(target, b"new content", mode=0o600)
    assert target.read_bytes() == b"new content"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    publish(target, lambda out: out.write(b"parts ", memoryview(b"of it")), fsync=False)
    assert target.read_bytes() == b"parts of it"
    assert names(tmp_path) == ["obj"]


def test_publishing_renames_only_when_the_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "chunk.tar"
    with publishing(target) as out:
        out.write(b"abc")
        assert not target.exists()
        assert names(tmp_path) == [out.temporary.name]
        assert out.size() == 3
    assert target.read_bytes() == b"abc"
    assert names(tmp_path) == ["chunk.tar"]


def test_failure_leaves_no_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "obj"

    def fail(out: object) -> None:
        raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError):
        publish(target, fail)
    with pytest.raises(ValueError), publishing(target) as out:
        out.write(b"half")
        raise ValueError("checksum mismatch")
    assert names(tmp_path) == []
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError):  # the rename itself fails: a directory is in the way
        publish(tmp_path / "dir", b"x")
    assert names(tmp_path) == ["dir"]
    pending = publishing(target)
    pending.write(b"x")
    pending.abort()
    pending.abort()  # idempotent
    assert names(tmp_path) == ["dir"]


def test_writes_at_offsets_are_whole_even_when_the_system_writes_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`write_at` places its parts at the offset, in order, however little each pwritev
    writes; a pwritev that writes nothing is a full disk, and the block leaves nothing."""
    real = os.pwritev

    def one_byte(fd: int, views: list[memoryview], offset: int) -> int:
        return real(fd, [views[0][:1]], offset)

    monkeypatch.setattr(os, "pwritev", one_byte)
    with publishing(tmp_path / "idx") as out:
        assert out.write_at(4, b"ef", memoryview(b"gh")) == 4
        assert out.write_at(0, b"abcd") == 4
        assert out.write(b"") == 0
    assert (tmp_path / "idx").read_bytes() == b"abcdefgh"
    monkeypatch.setattr(os, "pwritev", lambda fd, views, offset: 0)
    with pytest.raises(OSError, match="No space"), publishing(tmp_path / "full") as out:
        out.write_at(0, b"x")
    assert names(tmp_path) == ["idx"]


@pytest.mark.hostile
def test_an_index_whose_checks_or_writes_fail_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index's sections are written on a thread while its row checks are computed: a
    failure of either (a full disk, an error in the checks) raises, after the other has
    ended, and leaves neither the index nor its temporary."""
    from tierfeed.format import indexwrite

    content = IndexContent(
        keys=[b"a", b"b"], labels=np.zeros(2, np.int32),
        member_start=np.arange(3, dtype=np.uint64), member_chunk=np.zeros(2, np.uint32),
        member_offset=np.asarray([512, 1536], np.uint64), member_length=np.ones(2, np.uint64),
        member_checksum=np.zeros(2, np.uint64), member_ext=np.zeros(2, np.uint16),
        exts=[b".x"], chunk_names=["chunks/000000.tar"],
        chunk_size=np.asarray([3072], np.uint64), chunk_checksum=np.zeros(1, np.uint64),
    )  # fmt: skip

    def broken(*args: object) -> None:
        raise ValueError("the checks failed")

    monkeypatch.setattr(indexwrite, "write_checks", broken)
    with pytest.raises(ValueError, match="the checks failed"):
        write_index(tmp_path / "index.tfi", content)
    assert names(tmp_path) == []
    monkeypatch.undo()
    monkeypatch.setattr(os, "pwritev", lambda fd, views, offset: 0)
    with pytest.raises(OSError, match="No space"):
        write_index(tmp_path / "index.tfi", content)
    assert names(tmp_path) == []


def test_killed_writers_temporary_is_swept_a_live_ones_kept(tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "kept.tar").write_bytes(b"a published file")
    mine = publishing(sub / "mine.tar")  # this process is alive: its temporary stays
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(sub / "chunk.tar")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        theirs = Path(child.stdout.readline().strip())
        assert theirs.exists() and writer_pid(theirs.name) == child.pid
        assert sweep_stale(tmp_path, recursive=True) == 0  # the child is still writing
        child.kill()
        child.wait(timeout=10)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert sweep_stale(tmp_path) == 0  # not recursive: sub/ is not looked at
    assert theirs.exists()
    at = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:  # relative to a cache's descriptor, the path given is not used
        assert sweep_stale(tmp_path / "missing", dir_fd=at) == 0
        assert sweep_stale(tmp_path / "missing", recursive=True, dir_fd=at) == 1
    finally:
        os.close(at)
    assert not theirs.exists()
    assert names(sub) == [mine.temporary.name]
    assert names(tmp_path) == ["kept.tar", "sub"]
    mine.abort()
    assert sweep_stale(tmp_path / "missing") == 0


def test_every_writer_uses_the_one_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks, the index, cache entries, marks and inbox segments all publish through here."""
    renamed: list[str] = []
    real = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str], **at: int | None) -> None:
        renamed.append(Path(src).name)
        real(src, dst, **at)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", spy)
    chunk = ChunkWriter(tmp_path / "000000.tar")
    chunk.add(member_header(b"a.bin", 3), b"abc")
    chunk.commit()
    empty = np.zeros(0, np.uint64)
    index = IndexContent(
        keys=[], labels=np.zeros(0, np.int32), member_start=np.zeros(1, np.uint64),
        member_chunk=np.zeros(0, np.uint32), member_offset=empty, member_length=empty,
        member_checksum=empty, member_ext=np.zeros(0, np.uint16), exts=[], chunk_names=[],
        chunk_size=empty, chunk_checksum=empty, classes=[],
    )  # fmt: skip
    write_index(tmp_path / "index.tfi", index)
    driver = PosixDriver(tmp_path / "cache")
    driver.write("entry.tar", b"cached")
    mark(tmp_path / "cache", "entry.tar")
    Inbox(tmp_path / "inbox").write("seg", np.arange(2), np.array([1, 1]), memoryview(b"xy"))
    assert len(renamed) == 6
    assert all(is_temporary(n) and writer_pid(n) == os.getpid() for n in renamed), renamed


def test_temporaries_are_recognised_by_their_readers(tmp_path: Path) -> None:
    driver = PosixDriver(tmp_path / "cache")
    driver.write("a.tar", b"a")
    temporary_path(tmp_path / "cache" / "b.tar", pid=2**22 + 1).write_bytes(b"half")
    (tmp_path / "cache" / "c.tmp.1.tar").write_bytes(b"a name like one, but not one")
    assert driver.list() == ["a.tar", "c.tmp.1.tar"]  # a temporary is never listed
    assert driver.remove_stale_temporaries() == 1  # no process has that pid
    store = tmp_path / "store"
    (store / "chunks").mkdir(parents=True)
    temporary_path(store / "chunks" / "000000.tar", pid=2**22 + 1).write_bytes(b"half")
    with pytest.raises(PackError, match=r"interrupted"):
        Writer(store)  # a dead writer's partial chunk is a leftover, as a whole chunk is
