"""Fuzzing `tierfeed index` with mutated tar shards (hypothesis, derandomized by the CI profile).

Each mutation (truncation, size field edits, garbage, typeflag changes, pax records with wrong
lengths) must end, under a timeout, in a TierfeedError, or in an index whose members tile the
shard exactly and read back as the bytes at their offsets, with `verify_store` saying ok.
About 480 cases per run; keep the whole file well under ~45 s on 2 cores.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.hostile.test_tar_input import base256, fix_checksum, tar_bytes
from tierfeed import index_shards, open_store, verify_store
from tierfeed.errors import TierfeedError
from tierfeed.format.names import normalize_member_name
from tierfeed.format.tarscan import scan_tar

BLOCK = 512
SECONDS = 10  # per case: far more than any case needs; a hang fails instead of blocking CI


def _kinds() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in [
            ("cls", tarfile.DIRTYPE, b""),
            ("cls/1.jpg", tarfile.REGTYPE, b"j" * 700),
            ("cls/1.txt", tarfile.REGTYPE, b"t"),
            ("cls/ln", tarfile.SYMTYPE, b""),
            ("cls/2.jpg", tarfile.REGTYPE, b""),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            info.linkname = "1.jpg" if kind == tarfile.SYMTYPE else ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


BASES: dict[str, bytes] = {
    "ustar": tar_bytes(
        [(f"{i:03d}.{e}", bytes([i + 49]) * (i * 300)) for i in range(4) for e in "ab"]
    ),
    "pax": tar_bytes(
        [("p/" + "é" * 60 + ".jpg", b"x" * 1000), ("q.cls", b"7"), ("r/" + "n" * 120, b"")],
        tarfile.PAX_FORMAT,
    ),
    "gnu": tar_bytes([("g" * 130 + ".jpg", b"G" * 513), ("h.jpg", b"h")], tarfile.GNU_FORMAT),
    "globals": tar_bytes(
        [("a.jpg", b"a" * 10), ("b.jpg", b"b" * 600)], tarfile.PAX_FORMAT, {"comment": "g"}
    ),
    "kinds": _kinds(),
}


def _headers(raw: bytes) -> list[int]:
    """Offsets of every header block of a well-formed tar (extended headers included)."""
    out: list[int] = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for info in tar:
            out += [info.offset, info.offset_data - BLOCK]
    return sorted(set(out))


def _end_of_archive(raw: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        tar.getmembers()
        return tar.offset


HEADERS = {name: _headers(raw) for name, raw in BASES.items()}
EOA = {name: _end_of_archive(raw) for name, raw in BASES.items()}
bases = st.sampled_from(sorted(BASES))


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"a fuzz case ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _check_accepted(shard: Path, raw: bytes, skipped: int, store: Path) -> None:
    """Members tile the shard, tarfile agrees, samples read back, verify says ok."""
    members = list(scan_tar(shard))
    pos = 0
    for m in members:
        assert m.header_offset == pos, (m, pos)
        assert m.offset > m.header_offset and m.end <= len(raw)
        pos = m.end
    assert len(raw) - pos >= 2 * BLOCK and raw[pos:].count(0) == len(raw) - pos
    with tarfile.open(shard, encoding="utf-8", errors="surrogateescape") as tar:
        theirs = [(t.offset_data, t.isreg(), t.name) for t in tar]
        overridden = {"path", "size"} & set(tar.pax_headers)
    ours = [(m.offset, m.is_file, m.name) for m in members]
    if overridden:  # tarfile applies global path/size records only under an 'x' header
        theirs, ours = [t[:2] for t in theirs], [o[:2] for o in ours]
    if not any(m.kind == "sparse" for m in members):
        assert ours == theirs
    data = [m for m in members if not m.is_dir]
    with open_store(store) as opened:
        ix = opened.index
        assert ix.num_members + skipped == len(data)
        places = {(m.offset, m.size): m for m in data if m.is_file}
        for i in range(ix.num_members):
            offset, length = int(ix.member_offset[i]), int(ix.member_length[i])
            member = places[(offset, length)]
            assert normalize_member_name(member.name, "x") == ix.member_path_bytes(i)
            assert opened.read_member(i) == raw[offset : offset + length]
        for s in range(len(opened)):
            opened.read_sample(s)
    assert verify_store(store, progress=False) == []


def run_case(work: Path, raw: bytes, fuzz: bool = True) -> str:
    """Index ``raw`` as a shard; returns ``refused`` or ``indexed`` after checking the result."""
    shard = work / "s.tar"
    shard.write_bytes(raw)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(work / "index.tfi")
    with deadline(SECONDS):
        try:
            report = index_shards([shard], work, skip_bad_names=True, progress=False)
        except TierfeedError as exc:
            assert "s.tar" in str(exc), exc  # names the shard
            if fuzz:
                event(f"refused: {type(exc).__name__}")
            return "refused"
        _check_accepted(shard, raw, len(report.skipped), work)
    if fuzz:
        event("indexed")
    return "indexed"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tarfuzz")


def test_the_bases_index_cleanly(work: Path) -> None:
    for raw in BASES.values():
        assert run_case(work, raw, fuzz=False) == "indexed"


def _near(base: str) -> st.SearchStrategy[int]:
    cuts = sorted({h + d for h in HEADERS[base] for d in (0, 1, 100, 156, 511)})
    return st.one_of(st.sampled_from(cuts), st.integers(0, len(BASES[base])))


@settings(max_examples=120)
@given(data=st.data())
def test_truncation(work: Path, data: st.DataObject) -> None:
    base = data.draw(bases)
    raw = BASES[base]
    cut = data.draw(_near(base).filter(lambda c: c < len(raw)))
    # A cut before the end of the two zero blocks loses data or the marker; after it, only
    # tar's zero record padding goes.
    outcome = run_case(work, raw[:cut])
    assert outcome == ("indexed" if cut >= EOA[base] + 2 * BLOCK else "refused"), cut


sizes = st.one_of(
    st.integers(0, 2**33 - 1).map(lambda n: b"%011o" % n),
    st.integers(0, 4096).map(lambda n: b"%011o" % n),
    st.integers(0, 2**88 - 1).map(base256),
    st.binary(min_size=0, max_size=12),
    st.sampled_from([b"", b"-1", b" 12 ", b"0x10", b"\xff" * 12, b"1" * 12, b"00000001000\0"]),
)


@settings(max_examples=100)
@given(data=st.data())
def test_size_field_edits(work: Path, data: st.DataObject) -> None:
    base = data.draw(bases)
    raw = bytearray(BASES[base])
    at = data.draw(st.sampled_from(HEADERS[base]))
    raw[at + 124 : at + 136] = data.draw(sizes).ljust(12, b"\0")[:12]
    if data.draw(st.integers(0, 9)):  # mostly a forged, valid checksum
        fix_checksum(raw, at)
    run_case(work, bytes(raw))


@settings(max_examples=100)
@given(data=st.data())
def test_garbage(work: Path, data: st.DataObject) -> None:
    base = data.draw(bases)
    raw = BASES[base]
    junk = data.draw(st.binary(min_size=1, max_size=600))
    at = data.draw(_near(base).filter(lambda c: c <= len(raw)))
    how = data.draw(st.sampled_from(["insert", "overwrite", "append", "append-zeros"]))
    if how == "insert":
        mutated = raw[:at] + junk + raw[at:]
    elif how == "overwrite":
        mutated = raw[:at] + junk + raw[at + len(junk) :]
    elif how == "append":
        mutated = raw + junk
    else:
        mutated = raw + bytes(len(junk)) + junk[-1:].replace(b"\0", b"\1")
    if mutated != raw:
        outcome = run_case(work, mutated)
        if how.startswith("append"):
            assert outcome == "refused"


@settings(max_examples=80)
@given(data=st.data())
def test_typeflag_changes(work: Path, data: st.DataObject) -> None:
    base = data.draw(bases)
    raw = bytearray(BASES[base])
    at = data.draw(st.sampled_from(HEADERS[base]))
    raw[at + 156] = data.draw(st.sampled_from(b"0123456789xgLKSVDMN\0A\xff"))
    fix_checksum(raw, at)
    run_case(work, bytes(raw))


records = st.lists(
    st.tuples(
        st.sampled_from(["path", "size", "comment", "mtime", "linkpath", "GNU.sparse.size", ""]),
        st.text(alphabet="abc/.é0123456789=\n", max_size=30),
        st.sampled_from([0, 0, 0, -3, -1, 1, 2, 10, 1000]),
    ),
    min_size=1,
    max_size=4,
)


def _pax_tar(recs: list[tuple[str, str, int]], flag: bytes, data: bytes) -> bytes:
    body = b""
    for key, value, delta in recs:
        record = f" {key}={value}\n".encode()
        n = len(record) + 1
        while len(str(n)) + len(record) != n:  # the length counts its own digits
            n = len(str(n)) + len(record)
        body += str(n + delta).encode() + record
    head = tarfile.TarInfo("././@PaxHeader")
    head.type, head.size = flag, len(body)
    member = tarfile.TarInfo("m.jpg")
    member.size = len(data)
    return (
        head.tobuf(tarfile.USTAR_FORMAT)
        + body
        + bytes(-len(body) % BLOCK)
        + member.tobuf(tarfile.USTAR_FORMAT)
        + data
        + bytes(-len(data) % BLOCK)
        + bytes(2 * BLOCK)
    )


@settings(max_examples=80)
@given(recs=records, flag=st.sampled_from([b"x", b"x", b"g"]), size=st.integers(0, 1500))
def test_pax_records_with_wrong_lengths(
    work: Path, recs: list[tuple[str, str, int]], flag: bytes, size: int
) -> None:
    outcome = run_case(work, _pax_tar(recs, flag, b"d" * size))
    if any(delta for _, _, delta in recs):
        assert outcome == "refused"
