"""A damaged or crafted index.tfi, case by case: each ends in IndexFormatError naming the file
(or in correct bytes), never in a traceback of another type or a loop."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.format.conftest import write_tree
from tests.hostile import indexedit as ie
from tierfeed.errors import IndexFormatError, TierfeedError
from tierfeed.format import indexcheck
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME, SECTIONS
from tierfeed.format.pack import PackOptions, pack
from tierfeed.format.verify import summarize, verify_store
from tierfeed.loader.compose import open_store
from tierfeed.storage.store import Store

pytestmark = pytest.mark.timeout(60)

FILES = {
    b"cat/a.jpg": b"A" * 1500,
    b"cat/a.txt": b"a label",
    b"cat/b.jpg": b"B" * 2100,
    b"cat/deep/c.jpg": b"C" * 700,
    b"cat/deep/c.json": b"{}",
    b"cat/z.jpg": b"Z" * 300,
    b"dog/d.jpg": b"D" * 1800,
    b"dog/e.png": b"E" * 900,
    b"dog/zz/f": b"no extension",
}
REQUIRED = [
    "samples",
    "members",
    "chunks",
    "classes",
    "exts",
    "checksum_algo",
    "sections_checksum",
    "path_order_dtype",
    "sections",
]
INTS = ["samples", "members", "chunks", "sections_checksum"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A small labelled store over a few chunks, packed once; (store dir, index bytes)."""
    base = tmp_path_factory.mktemp("pristine")
    write_tree(base / "src", FILES)
    pack(base / "src", base / "store", PackOptions(chunk_size=4096, workers=2, progress=False))
    return base / "store", (base / "store" / INDEX_NAME).read_bytes()


@pytest.fixture
def damaged(tmp_path: Path, pristine: tuple[Path, bytes]) -> Callable[[bytes], Path]:
    """Write index bytes into a fresh store directory sharing the pristine chunks."""

    def make(raw: bytes) -> Path:
        return ie.store_with_index(tmp_path / "store", pristine[0], raw)

    return make


def assert_rejected(store: Path, match: str | None = None) -> None:
    """Every entry point refuses the index with IndexFormatError naming the file."""
    where = str(store / INDEX_NAME)
    with pytest.raises(IndexFormatError, match=match) as info:
        Index(store).close()
    assert where in str(info.value)
    with pytest.raises(IndexFormatError) as info:
        summarize(store)
    assert where in str(info.value)
    with pytest.raises(IndexFormatError):
        open_store(store)
    problems = verify_store(store, progress=False)
    assert problems and where in problems[0]


def assert_reads_exactly(store: Path) -> None:
    with open_store(store) as s:
        assert_reads_exactly_from(s)


def assert_reads_exactly_from(s: Store) -> None:
    """Every sample read one by one gives the packed files' bytes, each once."""
    got = [data for i in range(len(s)) for data in s.read_sample(i).fields.values()]
    assert sorted(got) == sorted(FILES.values())


def test_pristine_store_is_whole(pristine: tuple[Path, bytes]) -> None:
    store, _ = pristine
    assert verify_store(store, progress=False) == []
    assert_reads_exactly(store)
    with open_store(store) as s:
        assert s.listdir("") == ["cat", "dog"]
        assert s.listdir("cat") == ["a.jpg", "a.txt", "b.jpg", "deep", "z.jpg"]
        assert s.stat("dog/zz/f").size == len(FILES[b"dog/zz/f"])


# --- the header ---------------------------------------------------------------------------


def _edit(raw: bytes, change: Callable[[dict[str, Any]], None], reseal: bool = True) -> bytes:
    header = ie.read_header(raw)
    change(header)
    return ie.with_header(raw, header, reseal=reseal)


@pytest.mark.parametrize("field", REQUIRED)
def test_header_field_removed(field: str, pristine: tuple[Path, bytes], damaged: Any) -> None:
    raw = _edit(pristine[1], lambda h: h.pop(field))
    assert_rejected(damaged(raw), match=field if field != "sections_checksum" else None)


@pytest.mark.parametrize("field", ["extra", "header_checksum"])
def test_optional_header_field_removed_is_fine(
    field: str, pristine: tuple[Path, bytes], damaged: Any
) -> None:
    store = damaged(_edit(pristine[1], lambda h: h.pop(field)))
    assert verify_store(store, progress=False) == []
    assert_reads_exactly(store)


WRONG_TYPES: list[object] = ["x", None, 1.5, True, [], {}, [1, 2]]


# Every field with every wrong type, but for an empty `extra`: that is a valid header.
WRONG_FIELDS = [
    pytest.param(field, value, id=f"{field}-{value!r}")
    for field in [*REQUIRED, "extra"]
    for value in WRONG_TYPES
    if not (field == "extra" and value == {})
]


@pytest.mark.parametrize(("field", "value"), WRONG_FIELDS)
def test_header_field_of_wrong_type(
    field: str, value: object, pristine: tuple[Path, bytes], damaged: Any
) -> None:
    assert_rejected(damaged(_edit(pristine[1], lambda h: h.__setitem__(field, value))))


@pytest.mark.parametrize("value", [-1, -(2**70), 2**40, 2**64, 2**70])
@pytest.mark.parametrize("field", INTS)
def test_header_int_negative_or_huge(
    field: str, value: int, pristine: tuple[Path, bytes], damaged: Any
) -> None:
    assert_rejected(damaged(_edit(pristine[1], lambda h: h.__setitem__(field, value))))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("path_order_dtype", "<u8"),
        ("path_order_dtype", "<i4"),
        ("path_order_dtype", "object"),
        ("checksum_algo", "md5"),
        ("exts", ["/etc"]),
        ("exts", ["jpg"]),
        ("exts", [".a\x00"]),
        ("exts", [".x"] * 3),
        ("exts", [f".{i}" for i in range(2**16 + 1)]),
        ("classes", ["only"]),
        ("classes", [1, 2]),
        ("zzz_unknown", 1),
    ],
    ids=repr,
)
def test_header_bad_value(
    field: str, value: object, pristine: tuple[Path, bytes], damaged: Any
) -> None:
    assert_rejected(damaged(_edit(pristine[1], lambda h: h.__setitem__(field, value))))


def test_header_edited_without_resealing(pristine: tuple[Path, bytes], damaged: Any) -> None:
    """A bit of damage in a header string (no checksum covers it otherwise) is caught."""
    raw = _edit(pristine[1], lambda h: h.__setitem__("exts", [".jpf", *h["exts"][1:]]), False)
    assert_rejected(damaged(raw), match="header checksum")


@pytest.mark.parametrize("blob", [b"[1, 2]", b"42", b'"x"', b"[" * 100_000, b"{"])
def test_header_not_an_object(blob: bytes, pristine: tuple[Path, bytes], damaged: Any) -> None:
    raw = pristine[1]
    head = ie.PREFIX.pack(b"TIERFEED", 1, len(blob)) + blob
    slot = max(ie.header_slot(raw), len(head))
    assert_rejected(damaged(head.ljust(slot, b"\0") + raw[slot:]))


def test_header_length_past_the_end(pristine: tuple[Path, bytes], damaged: Any) -> None:
    raw = bytearray(pristine[1])
    ie.PREFIX.pack_into(raw, 0, b"TIERFEED", 1, 2**32 - 1)
    assert_rejected(damaged(bytes(raw)))


# --- the section table -----------------------------------------------------------------


def _section_edits(raw: bytes, name: str) -> dict[str, object]:
    offset, nbytes = ie.section(raw, name)
    item = np.dtype(SECTIONS[name][0]).itemsize
    edits: dict[str, object] = {
        "removed": None,
        "one-number": [offset],
        "past-the-end": [len(raw), max(nbytes, 8)],
        "overlaps-header": [0, nbytes],
        "negative-size": [offset, -8],
        "negative-offset": [-64, nbytes],
        "huge": [offset, 2**64],
        "string": "x",
        "grown": [offset, nbytes + 8 * item],
        "shrunk": [offset, max(0, nbytes - 8 * item)],
    }
    if item > 1:
        edits["partial-item"] = [offset, nbytes - 1]
        edits["misaligned"] = [offset + 1, nbytes]
    other = "chunk_checksum" if name != "chunk_checksum" else "chunk_size"
    edits["overlaps-other"] = [ie.section(raw, other)[0], nbytes]
    return edits


@pytest.mark.parametrize("name", list(SECTIONS))
def test_section_table_damage(name: str, pristine: tuple[Path, bytes], damaged: Any) -> None:
    raw = pristine[1]
    for what, entry in _section_edits(raw, name).items():

        def change(h: dict[str, Any], entry: object = entry) -> None:
            if entry is None:
                del h["sections"][name]
            else:
                h["sections"][name] = entry

        try:
            assert_rejected(damaged(_edit(raw, change)))
        except AssertionError as exc:
            raise AssertionError(f"section {name} {what}: {exc}") from exc


def test_unknown_section(pristine: tuple[Path, bytes], damaged: Any) -> None:
    raw = _edit(pristine[1], lambda h: h["sections"].__setitem__("more", [0, 0]))
    assert_rejected(damaged(raw), match="section table")


def test_truncated_at_every_section_boundary(pristine: tuple[Path, bytes], damaged: Any) -> None:
    raw = pristine[1]
    cuts = [c + d for c in ie.boundaries(raw) for d in (-1, 0, 1) if 0 <= c + d < len(raw)]
    assert len(cuts) > 40
    for cut in cuts:
        with pytest.raises(IndexFormatError) as info:
            Index(damaged(raw[:cut])).close()
        assert str(damaged(raw[:cut]) / INDEX_NAME) in str(info.value), cut


@pytest.mark.parametrize("name", list(SECTIONS))
def test_one_bit_flipped_in_each_section(
    name: str, pristine: tuple[Path, bytes], damaged: Any
) -> None:
    raw = bytearray(pristine[1])
    offset, nbytes = ie.section(bytes(raw), name)
    raw[offset + nbytes // 2] ^= 0x10
    assert_rejected(damaged(bytes(raw)), match="checksum")


# --- crafted sections (checksum resealed): the invariants themselves ----------------------


def _set(i: int, value: int) -> Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
    def change(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        a[i] = value
        return a

    return change


def _swap(i: int, j: int) -> Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
    def change(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        a[[i, j]] = a[[j, i]]
        return a

    return change


def _other_chunk(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a[-1] = 1 if a[-1] == 0 else 0
    return a


CRAFTED: dict[str, tuple[str, Any, str]] = {
    "member start not from 0": ("sample_member_start", _set(0, 1), "member ranges"),
    "member start not to members": ("sample_member_start", _set(-1, 3), "member ranges"),
    "member starts decrease": ("sample_member_start", _swap(1, 2), "member ranges"),
    "empty sample": ("sample_member_start", _set(2, 1), "member ranges"),
    "key offsets decrease": ("sample_key_offset", _swap(1, 2), "key offsets"),
    "key offsets past blob": ("sample_key_offset", _set(-1, 2**40), "key offsets"),
    "name offsets past blob": ("chunk_name_offset", _set(1, 2**63), "chunk name offsets"),
    "label too large": ("sample_label", _set(0, 2), "labels"),
    "label below -1": ("sample_label", _set(0, -2), "labels"),
    "member chunk out of range": ("member_chunk", _set(0, 99), "chunk id"),
    "sample chunk out of range": ("sample_chunk", _set(0, 2**32 - 1), "chunk id"),
    "samples out of chunk order": ("sample_chunk", _swap(0, -1), "chunk order"),
    "member in another chunk": ("member_chunk", _other_chunk, "sample's chunk"),
    "ext id out of range": ("member_ext", _set(0, 2**16 - 1), "extension id"),
    "member past chunk end": ("member_offset", _set(0, 10**6), "past the end of chunk"),
    "member offset wraps": ("member_offset", _set(0, 2**64 - 1), "past the end of chunk"),
    "member length huge": ("member_length", _set(0, 2**63), "past the end of chunk"),
    "chunk size huge": ("chunk_size", _set(0, 2**64 - 1), "larger than"),
    "path order duplicate": ("path_order", _set(0, 1), "permutation"),
    "path order out of range": ("path_order", _set(0, 2**32 - 1), "out of range"),
    "NUL in a key": ("keys", _set(0, 0), "NUL"),
    "NUL in a chunk name": ("chunk_names", _set(0, 0), "NUL"),
}


@pytest.fixture(scope="module")
def wide(pristine: tuple[Path, bytes], tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The pristine index written with every offset 64-bit (format 1's layout)."""
    from tierfeed.format.index import write_index

    path = tmp_path_factory.mktemp("wide") / INDEX_NAME
    with Index(pristine[0]) as ix:
        write_index(path, ie.content_of(ix), narrow=False)
    return path.read_bytes()


@pytest.mark.parametrize("block", [None, 2], ids=["one block", "blocks of 2"])
@pytest.mark.parametrize("layout", ["narrow", "wide"])
@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_invariant_broken(
    case: str,
    layout: str,
    block: int | None,
    pristine: tuple[Path, bytes],
    wide: bytes,
    damaged: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each broken invariant is named, whether the checks see the arrays whole or in blocks
    (on threads, a block's edges reading one entry past them)."""
    if block is not None:
        monkeypatch.setattr(indexcheck, "_BLOCK", block)
    name, change, match = CRAFTED[case]
    raw = pristine[1] if layout == "narrow" else wide
    try:
        edited = ie.edit_array(raw, name, change)
    except OverflowError:
        pytest.skip("the value does not fit a 32-bit section: the wide layout carries it")
    assert_rejected(damaged(edited), match=match)


# An index checked on use (`Index(lazy=True)`, a large one that this host has not stamped):
# what an open checks at any size fails on open; a damaged row fails when a reader takes it,
# naming the file; the global invariants that reads do not need are not checked by reads.
ON_OPEN = {"member start not from 0", "member start not to members", "key offsets past blob"}
NOT_FOR_READS = {"path order duplicate", "path order out of range"}
# The swapped chunk ids put sample 0 in the last chunk: its members are not in it.
ON_USE_MATCH = {"samples out of chunk order": "sample's chunk"}


@pytest.fixture
def on_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every index is large enough to be checked on use; stamps go to a fresh cache."""
    from tierfeed.format import index as index_module

    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(index_module, "STAMP_ABOVE_BYTES", 0)


def _reads(store: Store, i: int) -> bytes | None:
    """Sample ``i``'s member bytes (sorted, joined), or None when its rows are refused."""
    try:
        return b"|".join(sorted(store.read_sample(i).fields.values()))
    except IndexFormatError as exc:
        assert str(store.index.path) in str(exc)
        return None


@pytest.mark.parametrize("layout", ["narrow", "wide"])
@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_invariant_broken_checked_on_use(
    case: str, layout: str, pristine: tuple[Path, bytes], wide: bytes, damaged: Any, on_use: None
) -> None:
    name, change, match = CRAFTED[case]
    try:
        edited = ie.edit_array(pristine[1] if layout == "narrow" else wide, name, change)
    except OverflowError:
        pytest.skip("the value does not fit a 32-bit section: the wide layout carries it")
    store = damaged(edited)
    where = str(store / INDEX_NAME)
    if case in ON_OPEN:
        with pytest.raises(IndexFormatError, match=match) as info:
            open_store(store, lazy=True)
        assert where in str(info.value)
        return
    with open_store(store, lazy=True) as s:
        assert not s.index.checked
        if case in NOT_FOR_READS:
            assert_reads_exactly_from(s)
            for path in FILES:  # a lookup by path ends: the member, none, or the crafted id
                with contextlib.suppress(IndexFormatError):
                    member = s.index.find_member(path)
                    assert member is None or s.read_member(member) == FILES[path]
            return
        with pytest.raises(IndexFormatError, match=ON_USE_MATCH.get(case, match)) as info:
            s.read_samples(range(len(s)))
        assert where in str(info.value)
        # Row by row: the damaged rows are refused, every other sample reads as packed.
        got = [_reads(s, i) for i in range(len(s))]
        assert 0 < got.count(None) < len(s)
        with Index(pristine[0]) as ix, open_store(pristine[0]) as whole:
            wanted = [
                b"|".join(sorted(whole.read_sample(i).fields.values())) for i in range(len(ix))
            ]
        assert all(g is None or g == w for g, w in zip(got, wanted, strict=True))
        with pytest.raises(IndexFormatError, match=match):  # a walk over the whole index
            s.index.check_all()


def test_an_index_checked_on_use_reads_whole_and_stamps_when_checked(
    pristine: tuple[Path, bytes], damaged: Any, on_use: None, tmp_path: Path
) -> None:
    store = damaged(pristine[1])
    with open_store(store, lazy=True) as s:
        assert not s.index.checked and not s.index.checked_here
        assert_reads_exactly_from(s)
        assert [len(x.fields) for x in s.read_samples(range(len(s)))] == [
            len(s.read_sample(i).fields) for i in range(len(s))
        ]
        assert not list((tmp_path / "cache").glob("checked/*"))
        s.index.check_all()
        assert s.index.checked and s.index.checked_here
    assert len(list((tmp_path / "cache").glob("checked/*"))) == 1
    with Index(store, lazy=True) as again:  # stamped: every invariant holds, rows need none
        assert again.checked and not again.checked_here


def test_an_index_checked_on_use_opens_without_the_full_checks(
    pristine: tuple[Path, bytes], damaged: Any, on_use: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierfeed.format import index as index_module

    def refuse(*args: object) -> None:
        raise AssertionError("the O(N) checks ran")

    store = damaged(pristine[1])
    monkeypatch.setattr(index_module, "check_invariants", refuse)
    with open_store(store, lazy=True) as s:
        assert_reads_exactly_from(s)
    with pytest.raises(AssertionError, match="O\\(N\\) checks ran"):
        Index(store)  # not lazy: checked in full on open, as before


def _label(sample: Any) -> int:
    return int(sample.label)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_refuses_the_damaged_row_it_takes(
    pristine: tuple[Path, bytes], damaged: Any, on_use: None, workers: int, tmp_path: Path
) -> None:
    """Through a real Loader (its Dataset opens the index checked on use, in each worker):
    the epoch that reaches the damaged row ends in the index's error, naming the file."""
    from tierfeed.torch import Dataset, Loader
    from tierfeed.torch.dataset import feed_of

    store = damaged(ie.edit_array(pristine[1], "sample_label", _set(3, 7)))
    dataset = Dataset(store, "global", batch_size=2, decode=_label)
    assert not feed_of(dataset).plan_index().checked  # opened (and planned) without the full checks
    loader = Loader(dataset, num_workers=workers)
    with pytest.raises(IndexFormatError, match="labels outside") as info:
        list(loader)
    assert str(store / INDEX_NAME) in str(info.value)
    whole = ie.store_with_index(tmp_path / "whole", pristine[0], pristine[1])  # own file
    loader = Loader(Dataset(whole, "global", batch_size=2, decode=_label), num_workers=workers)
    with Index(pristine[0]) as ix:
        assert sorted(int(x) for batch in loader for x in batch) == sorted(ix.sample_label)
    loader.close()


def test_the_pristine_index_is_narrow_and_the_wide_one_opens(
    pristine: tuple[Path, bytes], wide: bytes, damaged: Any
) -> None:
    assert set(ie.read_header(pristine[1])["dtypes"]) == {
        "sample_member_start", "sample_key_offset", "member_offset", "member_length"
    }  # fmt: skip
    assert ie.read_header(wide)["dtypes"] == {}
    with Index(damaged(wide)) as ix, Index(pristine[0]) as narrow:
        assert ix.member_offset.dtype == np.uint64 and narrow.member_offset.dtype == np.uint32
        assert np.array_equal(ix.member_offset, narrow.member_offset)
        assert [ix.key(s) for s in range(ix.num_samples)] == [
            narrow.key(s) for s in range(narrow.num_samples)
        ]


def test_a_format_1_index_opens_and_a_newer_one_is_named(
    wide: bytes, damaged: Any, pristine: tuple[Path, bytes]
) -> None:
    import struct

    header = ie.read_header(wide)
    del header["dtypes"]  # format 1 had no such field: every offset 64-bit
    old = bytearray(ie.with_header(wide, header))
    struct.pack_into("<I", old, 8, 1)
    with Index(damaged(bytes(old))) as ix, Index(pristine[0]) as new:
        assert ix.num_samples == new.num_samples and ix.key(3) == new.key(3)
    newer = bytearray(pristine[1])
    struct.pack_into("<I", newer, 8, 5)
    with pytest.raises(IndexFormatError, match="format version 5"):
        Index(damaged(bytes(newer)))


@pytest.mark.parametrize(
    ("dtypes", "match"),
    [
        ({"member_offset": "<u2"}, "not a narrowable section"),
        ({"member_checksum": "<u4"}, "not a narrowable section"),
        ({"member_offset": "<u8"}, "whole array|entries"),  # the section is <u4 bytes
    ],
)
def test_a_crafted_dtype_is_refused(
    dtypes: dict[str, str], match: str, pristine: tuple[Path, bytes], damaged: Any
) -> None:
    header = ie.read_header(pristine[1])
    header["dtypes"] = {**header["dtypes"], **dtypes}
    assert_rejected(damaged(ie.with_header(pristine[1], header)), match=match)


def test_narrow_offsets_with_a_chunk_of_4_gib_are_refused(
    pristine: tuple[Path, bytes], damaged: Any
) -> None:
    edited = ie.edit_array(pristine[1], "chunk_size", _set(0, 2**32))
    assert_rejected(damaged(edited), match="32-bit member offsets")


def test_chunk_name_escaping_the_store(pristine: tuple[Path, bytes], damaged: Any) -> None:
    def escape(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        a[:17] = np.frombuffer(b"../../../../x.tar", dtype=np.uint8)
        return a

    store = damaged(ie.edit_array(pristine[1], "chunk_names", escape))
    with open_store(store) as s:  # each chunk's path is checked when first used
        with pytest.raises(IndexFormatError, match="outside the store"):
            s.read_samples(range(len(s)))
        with pytest.raises(IndexFormatError, match="outside the store"):
            s.source.open_ahead([0])
        assert s.read_sample(len(s) - 1).fields  # the last chunk's samples still read
    assert any("outside the store" in p for p in verify_store(store, progress=False))


def _old_listdir_steps(paths: list[bytes], prefix: bytes, cap: int) -> int:
    """Steps the old listdir took over a path order (``cap`` when it loops)."""
    from bisect import bisect_left

    i, steps = bisect_left(paths, prefix), 0
    while i < len(paths) and paths[i].startswith(prefix) and steps < cap:
        steps += 1
        rest = paths[i][len(prefix) :]
        slash = rest.find(b"/")
        i = i + 1 if slash < 0 else bisect_left(paths, prefix + rest[:slash] + b"0")
    return steps


def _looping_order() -> tuple[bytes, int, int]:
    """A directory and a swap of two path-order entries that send the old listdir of that
    directory round forever."""
    paths = sorted(FILES)
    for prefix in (b"", b"cat/", b"dog/"):
        for i in range(len(paths)):
            for j in range(i + 1, len(paths)):
                order = list(paths)
                order[i], order[j] = order[j], order[i]
                if _old_listdir_steps(order, prefix, 1000) >= 1000:
                    return prefix, i, j
    raise AssertionError("no looping swap in this tree")


def test_unsorted_path_order_cannot_loop_listdir(
    pristine: tuple[Path, bytes], damaged: Any
) -> None:
    """The issue's 100%-CPU case: a permutation that is not sorted, checksum resealed."""
    prefix, i, j = _looping_order()
    store = damaged(ie.edit_array(pristine[1], "path_order", _swap(i, j)))
    with open_store(store) as s:
        with pytest.raises(IndexFormatError, match="not sorted"):
            s.listdir(prefix)
        for sample in range(len(s)):  # reads by id do not depend on the path order
            s.read_sample(sample)
    problems = verify_store(store, progress=False)
    assert any("path order broken" in p for p in problems)


def test_every_swap_of_the_path_order_ends(pristine: tuple[Path, bytes], damaged: Any) -> None:
    """Every transposition of the path order: listing the whole tree ends, with an error or
    with names that exist; verify always reports it."""
    raw = pristine[1]
    n = len(FILES)
    for i in range(n):
        for j in range(i + 1, n):
            store = damaged(ie.edit_array(raw, "path_order", _swap(i, j)))
            assert any("path order" in p for p in verify_store(store, progress=False))
            with open_store(store) as s:
                stack, seen = [b""], 0
                try:
                    while stack:
                        d = stack.pop()
                        for name in s.listdir(d):
                            seen += 1
                            assert seen <= 3 * n
                            p = d + b"/" + os.fsencode(name) if d else os.fsencode(name)
                            if s.stat(p).is_dir:
                                stack.append(p)
                            else:
                                assert p in FILES
                except TierfeedError:
                    pass


# --- the command line ------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierfeed", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("field", ["samples", "sections"])
def test_cli_inspect_damaged_index(field: str, pristine: tuple[Path, bytes], damaged: Any) -> None:
    store = damaged(_edit(pristine[1], lambda h: h.pop(field)))
    done = _cli("inspect", str(store))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tierfeed inspect: error: ")
    assert str(store / INDEX_NAME) in lines[0]


def test_cli_verify_damaged_and_crafted_index(pristine: tuple[Path, bytes], damaged: Any) -> None:
    raw = bytearray(pristine[1])
    offset, _ = ie.section(bytes(raw), "member_offset")
    raw[offset + 3] ^= 1
    for index in (bytes(raw), ie.edit_array(pristine[1], "path_order", _swap(0, 7))):
        store = damaged(index)
        done = _cli("verify", "-q", str(store))
        assert done.returncode == 1
        assert "Traceback" not in done.stderr + done.stdout
        bad = [line for line in done.stdout.splitlines() if line.startswith("BAD: ")]
        assert bad and str(store / INDEX_NAME) in bad[0]
