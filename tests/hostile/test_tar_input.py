"""`tierfeed index` on crafted, damaged and odd tar shards and inputs: strict errors, no hangs.

Every byte of a shard must be accounted for (headers, data, padding, end-of-archive blocks and
zero record padding); a claimed size never drives an allocation; a shard that is missing, a
directory or a FIFO is refused up front with one line on the command line.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tierfeed import index_shards, open_store, verify_store
from tierfeed.errors import ChunkCorruptError, FormatError, TierfeedError

BLOCK = 512

# --- tar crafting helpers (also used by test_tar_fuzz) -------------------------------------


def tar_bytes(
    members: list[tuple[str, bytes]],
    fmt: int = tarfile.USTAR_FORMAT,
    pax_globals: dict[str, str] | None = None,
) -> bytes:
    """A tar written by Python's tarfile (a trusted writer) with regular file members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=pax_globals or {}) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def fix_checksum(raw: bytearray, at: int) -> None:
    """Recompute the checksum of the header block at byte ``at`` in place."""
    raw[at + 148 : at + 156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(raw[at : at + BLOCK])


def set_field(raw: bytes, at: int, start: int, width: int, value: bytes) -> bytes:
    """Overwrite a header field of the block at ``at`` (NUL-padded) and fix its checksum."""
    out = bytearray(raw)
    out[at + start : at + start + width] = value.ljust(width, b"\0")[:width]
    fix_checksum(out, at)
    return bytes(out)


def set_size(raw: bytes, at: int, value: bytes) -> bytes:
    return set_field(raw, at, 124, 12, value)


def base256(n: int) -> bytes:
    return b"\x80" + n.to_bytes(11, "big")


def five_members() -> bytes:
    """Five 100-byte members: headers at 0, 1024, 2048, 3072, 4096; end blocks at 5120."""
    return tar_bytes([(f"{i:06d}.jpg", bytes([65 + i]) * 100) for i in range(5)])


@pytest.fixture
def shard_dir(tmp_path: Path) -> Path:
    d = tmp_path / "store"
    d.mkdir()
    return d


def write_shard(d: Path, raw: bytes, name: str = "s.tar") -> Path:
    path = d / name
    path.write_bytes(raw)
    return path


@contextlib.contextmanager
def small_and_fast(limit_bytes: int = 64 * 2**20, seconds: float = 10.0) -> Iterator[None]:
    """Fail if the block allocates more than ``limit_bytes`` (Python heap) or runs too long."""
    tracemalloc.start()
    began = time.monotonic()
    try:
        yield
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < limit_bytes, f"allocated {peak} bytes"
        assert time.monotonic() - began < seconds


def index(d: Path, *shards: Path, skip: bool = False) -> None:
    index_shards(list(shards), d, skip_bad_names=skip, progress=False)


# --- damaged and crafted headers ---------------------------------------------------------


def test_a_clean_shard_indexes_and_verifies(shard_dir: Path) -> None:
    shard = write_shard(shard_dir, five_members())
    report = index_shards([shard], shard_dir, progress=False)
    assert (report.samples, report.members) == (5, 5)
    with open_store(shard_dir) as store:
        assert store.read_sample(4).fields == {"jpg": b"E" * 100}
    assert verify_store(shard_dir, progress=False) == []


def test_truncated_inside_the_second_header(shard_dir: Path) -> None:
    shard = write_shard(shard_dir, five_members()[: 1024 + 200])
    with pytest.raises(ChunkCorruptError, match=r"s\.tar.*truncated.*byte 1024"):
        index(shard_dir, shard)


@pytest.mark.parametrize("cut", [512 + 50, 1024 + 512 + 99, 4096 + 512 + 100])
def test_truncated_inside_data_or_padding(shard_dir: Path, cut: int) -> None:
    shard = write_shard(shard_dir, five_members()[:cut])
    with pytest.raises(ChunkCorruptError, match=r"s\.tar.*truncated"):
        index(shard_dir, shard)


@pytest.mark.parametrize("cut", [1024, 3072, 5120, 5120 + 512])
def test_cut_at_a_member_boundary_lacks_the_end_of_archive(shard_dir: Path, cut: int) -> None:
    # A copy cut at a block boundary would otherwise index a prefix of the shard silently.
    shard = write_shard(shard_dir, five_members()[:cut])
    with pytest.raises(ChunkCorruptError, match=r"s\.tar.*end-of-archive"):
        index(shard_dir, shard)


@pytest.mark.parametrize(
    ("size", "why"),
    [
        (4, r"padding at bytes 516\+508 .* byte 0: its size field understates"),
        (1024, r"block at byte 1536 is not a tar header"),  # block-aligned: no padding to check
    ],
)
def test_understated_size_with_garbage_after_it(shard_dir: Path, size: int, why: str) -> None:
    raw = tar_bytes([("a.jpg", b"A" * 2000), ("b.jpg", b"b")])
    shard = write_shard(shard_dir, set_size(raw, 0, b"%011o" % size))
    with pytest.raises(ChunkCorruptError, match=rf"s\.tar.*{why}"):
        index(shard_dir, shard)


def test_size_of_2_to_the_62_fails_fast_and_small(shard_dir: Path) -> None:
    shard = write_shard(shard_dir, set_size(five_members(), 1024, base256(2**62)))
    with small_and_fast(), pytest.raises(ChunkCorruptError, match=r"s\.tar.*byte 1024.*end"):
        index(shard_dir, shard)


@pytest.mark.parametrize(
    ("field", "why"),
    [
        (b"77777777777", "end"),  # octal, 8 GiB: beyond the file
        (b"12x4", "not a number"),
        (b"", "not a number"),
        (b"\xff" * 12, "not a number|negative"),  # base-256 negative
    ],
)
def test_bad_size_fields(shard_dir: Path, field: bytes, why: str) -> None:
    shard = write_shard(shard_dir, set_size(five_members(), 2048, field))
    with pytest.raises(ChunkCorruptError, match=rf"s\.tar.*byte 2048.*({why})"):
        index(shard_dir, shard)


def test_bad_checksum(shard_dir: Path) -> None:
    raw = bytearray(five_members())
    raw[1024 + 3] ^= 0x01  # a name byte of the second member
    shard = write_shard(shard_dir, bytes(raw))
    with pytest.raises(ChunkCorruptError, match=r"s\.tar.*byte 1024.*checksum"):
        index(shard_dir, shard)


def pax_shard() -> bytes:
    """A pax tar whose first member has a long name: an 'x' header at 0, its records at 512."""
    raw = tar_bytes([("d/" + "n" * 150 + ".jpg", b"1" * 10), ("b.jpg", b"2")], tarfile.PAX_FORMAT)
    assert raw[156:157] == b"x"
    return raw


def test_pax_header_claiming_a_huge_length(shard_dir: Path) -> None:
    shard = write_shard(shard_dir, set_size(pax_shard(), 0, base256(2**40)))
    with small_and_fast(), pytest.raises(ChunkCorruptError, match=r"s\.tar.*byte 0"):
        index(shard_dir, shard)


def test_pax_header_larger_than_the_cap(shard_dir: Path) -> None:
    big = 3 * 2**20
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, big
    raw = header.tobuf(tarfile.USTAR_FORMAT) + b"a" * big + tar_bytes([("b.jpg", b"2")])
    shard = write_shard(shard_dir, raw)
    with small_and_fast(), pytest.raises(ChunkCorruptError, match=r"s\.tar.*byte 0.*MiB"):
        index(shard_dir, shard)


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r.replace(b"path=", b"path:", 1),  # no '='
        lambda r: r[:512] + b"9" + r[513:],  # record length beyond the records
        lambda r: r[:512] + b"0" + r[513:],  # a length that does not fit its record
        lambda r: r[:512] + b"x" + r[513:],  # not a number
    ],
)
def test_malformed_pax_records(shard_dir: Path, edit: Callable[[bytes], bytes]) -> None:
    raw = pax_shard()
    bad = edit(raw)
    assert len(bad) == len(raw) and bad != raw
    shard = write_shard(shard_dir, bad)
    with pytest.raises(ChunkCorruptError, match=r"s\.tar.*pax record at byte 512"):
        index(shard_dir, shard)


@pytest.mark.parametrize("tail", [b"garbage", b"\0" * 700 + b"x", b"\0" * 20000 + b"\1"])
def test_trailing_garbage_after_the_end_of_archive(shard_dir: Path, tail: bytes) -> None:
    shard = write_shard(shard_dir, five_members() + tail)
    with pytest.raises(ChunkCorruptError, match=r"s\.tar.*after the end-of-archive"):
        index(shard_dir, shard)


def test_garbage_inside_the_zero_record_padding(shard_dir: Path) -> None:
    raw = bytearray(five_members())
    assert len(raw) == 10240
    raw[9000] = 7
    shard = write_shard(shard_dir, bytes(raw))
    with pytest.raises(ChunkCorruptError, match=r"s\.tar.*byte 9000.*after the end-of-archive"):
        index(shard_dir, shard)


# --- odd member kinds, other writers -------------------------------------------------------


def all_kinds() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        specs: list[tuple[str, bytes, bytes]] = [
            ("dir", tarfile.DIRTYPE, b""),
            ("dir/a.jpg", tarfile.REGTYPE, b"abc"),
            ("dir/" + "long" * 40 + ".jpg", tarfile.REGTYPE, b"L" * 600),
            ("sym", tarfile.SYMTYPE, b""),
            ("hard", tarfile.LNKTYPE, b""),
            ("fifo", tarfile.FIFOTYPE, b""),
            ("chr", tarfile.CHRTYPE, b""),
            ("blk", tarfile.BLKTYPE, b""),
            ("z.txt", tarfile.REGTYPE, b""),
        ]
        for name, kind, data in specs:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "dir/" + "target" * 30
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_scanner_reports_every_kind_as_tarfile_sees_it(tmp_path: Path) -> None:
    from tierfeed.format.tarscan import scan_tar

    shard = write_shard(tmp_path, all_kinds())
    got = list(scan_tar(shard))
    with tarfile.open(shard) as tar:
        want = [(t.name, t.offset, t.offset_data, t.size if t.isreg() else 0) for t in tar]
    assert [(m.name, m.header_offset, m.offset, m.size) for m in got] == want
    kinds = [m.kind for m in got]
    assert kinds == ["dir", "file", "file", "symlink", "hardlink", "fifo", "char", "block", "file"]
    assert [m.is_file for m in got].count(True) == 3


def test_links_and_devices_are_refused_or_skipped_and_verify_agrees(shard_dir: Path) -> None:
    shard = write_shard(shard_dir, all_kinds())
    with pytest.raises(FormatError, match=r"s\.tar.*'sym'.*link or device"):
        index(shard_dir, shard)
    index(shard_dir, shard, skip=True)
    with open_store(shard_dir) as store:
        assert len(store) == 3
    assert verify_store(shard_dir, progress=False) == []


def test_base256_size_pax_globals_and_gnu_long_names(shard_dir: Path) -> None:
    raw = tar_bytes([("a.jpg", b"12345"), ("b" * 120 + ".cls", b"7")], tarfile.GNU_FORMAT)
    raw = set_size(raw, 0, base256(5))
    a = write_shard(shard_dir, raw, "a.tar")
    g = write_shard(
        shard_dir,
        tar_bytes([("c.jpg", b"c" * 513)], tarfile.PAX_FORMAT, pax_globals={"comment": "hi"}),
        "g.tar",
    )
    report = index_shards([a, g], shard_dir, progress=False)
    assert report.members == 3
    with open_store(shard_dir) as store:
        assert store.read_sample(0).fields == {"jpg": b"12345"}
        assert store.read_sample(2).fields == {"jpg": b"c" * 513}
    assert verify_store(shard_dir, progress=False) == []


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar command")
def test_a_shard_written_by_the_tar_command(shard_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    for i in range(20):
        (src / "cat" / f"{i:03d}.jpg").write_bytes(os.urandom(i * 97))
    (src / "cat" / ("x" * 120 + ".jpg")).write_bytes(b"long")
    shard = shard_dir / "t.tar"
    subprocess.run(["tar", "-cf", str(shard), "-C", str(src), "."], check=True)
    report = index_shards([shard], shard_dir, progress=False)
    assert report.members == 21
    with open_store(shard_dir) as store:
        got = {s.key: s.fields["jpg"] for s in map(store.read_sample, range(len(store)))}
    assert got["cat/005"] == (src / "cat" / "005.jpg").read_bytes()
    assert verify_store(shard_dir, progress=False) == []


# --- skipped names and verify ---------------------------------------------------------------


def test_names_skipped_on_purpose_do_not_fail_verify(shard_dir: Path) -> None:
    raw = tar_bytes(
        [
            ("a.jpg", b"1"),
            ("/abs.jpg", b"2"),
            ("../up.jpg", b"3"),
            ("a.jpg", b"4"),
            ("x/../../y.jpg", b"5"),
            ("b.jpg", b"6"),
        ]
    )
    shard = write_shard(shard_dir, raw)
    report = index_shards([shard], shard_dir, skip_bad_names=True, progress=False)
    assert (report.samples, len(report.skipped)) == (2, 4)
    assert verify_store(shard_dir, progress=False) == []


def test_verify_still_flags_a_name_the_headers_disagree_with(
    shard_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierfeed.format import shards

    real = shards.normalize_member_name
    monkeypatch.setattr(
        shards,
        "normalize_member_name",
        lambda name, where: b"c.jpg" if name == "b.jpg" else real(name, where),
    )
    shard = write_shard(shard_dir, tar_bytes([("a.jpg", b"1"), ("/x.jpg", b"2"), ("b.jpg", b"3")]))
    index(shard_dir, shard, skip=True)  # the index says c.jpg where the tar says b.jpg
    monkeypatch.undo()
    problems = verify_store(shard_dir, progress=False)
    assert len(problems) == 1 and "'c.jpg' at bytes 2560+1" in problems[0], problems
    assert "tar headers disagree" in problems[0]


# --- inputs that are not shards -------------------------------------------------------------


def test_missing_shard(shard_dir: Path) -> None:
    with pytest.raises(TierfeedError, match=r"nope\.tar.*(no such|does not exist)"):
        index(shard_dir, shard_dir / "nope.tar")


def test_directory_shard(shard_dir: Path) -> None:
    (shard_dir / "d.tar").mkdir()
    with pytest.raises(TierfeedError, match=r"d\.tar.*directory"):
        index(shard_dir, shard_dir / "d.tar")


def test_fifo_shard_does_not_hang(shard_dir: Path) -> None:
    fifo = shard_dir / "f.tar"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            index(shard_dir, fifo)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True, name="fifo-index")
    worker.start()
    worker.join(20)
    if worker.is_alive():  # release the reader blocked in open(), then fail
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(5)
        pytest.fail("index_shards hung on a FIFO")
    assert isinstance(outcome[0], TierfeedError)
    assert "f.tar" in str(outcome[0]) and "not a regular file" in str(outcome[0])


def test_out_is_a_file_or_missing(shard_dir: Path) -> None:
    shard = write_shard(shard_dir, five_members())
    with pytest.raises(TierfeedError, match=r"s\.tar.*not a directory"):
        index_shards([shard], shard, progress=False)
    with pytest.raises(TierfeedError, match=r"s\.tar/store: cannot use --out"):
        index_shards([shard], shard / "store", progress=False)  # under a file
    # A missing --out is made (issue 46): the shards are read where they lie.
    report = index_shards([shard], shard_dir / "nowhere", progress=False)
    assert report.shard_root == shard_dir


def test_a_bad_shard_is_found_before_any_work(shard_dir: Path) -> None:
    good = write_shard(shard_dir, five_members())
    with pytest.raises(TierfeedError, match=r"missing\.tar"):
        index(shard_dir, good, good, good, shard_dir / "missing.tar")


# --- the command line: one line, exit 1, no traceback ---------------------------------------


def cli_cases(d: Path) -> dict[str, list[str]]:
    good = write_shard(d, five_members(), "good.tar")
    trunc = write_shard(d, five_members()[:1224], "trunc.tar")
    huge = write_shard(d, set_size(five_members(), 1024, base256(2**62)), "huge.tar")
    tail = write_shard(d, five_members() + b"junk", "tail.tar")
    (d / "dir.tar").mkdir()
    os.mkfifo(d / "fifo.tar")
    return {
        "missing": [str(d / "missing.tar"), "--out", str(d)],
        "directory": [str(d / "dir.tar"), "--out", str(d)],
        "fifo": [str(d / "fifo.tar"), "--out", str(d)],
        "out-file": [str(good), "--out", str(good)],
        "truncated": [str(trunc), "--out", str(d)],
        "huge": [str(huge), "--out", str(d)],
        "tail": [str(tail), "--out", str(d)],
    }


def test_cli_index_errors_are_one_line(shard_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tierfeed.cli import main

    for case, args in cli_cases(shard_dir).items():
        assert main(["index", "-q", *args]) == 1, case
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tierfeed index: error: "), (case, err)


def test_cli_index_errors_through_a_process(shard_dir: Path) -> None:
    """The real entry point: one line on stderr, exit 1, no traceback (run side by side)."""
    cases = cli_cases(shard_dir)
    procs = {
        case: subprocess.Popen(
            [sys.executable, "-m", "tierfeed", "index", "-q", *cases[case]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=shard_dir,
        )
        for case in ("fifo", "huge")
    }
    for case, proc in procs.items():
        try:
            _, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"tierfeed index hung on the {case} case")
        lines = stderr.strip().splitlines()
        assert proc.returncode == 1, (case, stderr)
        assert len(lines) == 1 and "Traceback" not in stderr, (case, stderr)
        assert lines[0].startswith("tierfeed index: error: "), (case, lines)
