"""Index rows checked by construction (issue 32, case 1): an index opened lazily (a large one
this host has not stamped) verifies each row it reads against the row's check, so one rotted
row (the sections checksum stale, nothing recomputed) never hands a sample another's bytes,
label, fields or key: the read is refused, naming the index. A crafted index whose checksums
are right but that holds a sample with two members of one extension is refused by the full
checks and by the row checks alike. And for any single-byte damage of any section, a lazy
reader delivers only correct samples or raises a tierfeed error naming the index."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile import indexedit as ie
from tierfeed import Writer
from tierfeed.errors import IndexFormatError, TierfeedError
from tierfeed.format.index import Index, write_index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.compose import open_store

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

N = 60  # samples: each a `bin` and a `cls` member


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    root = tmp_path_factory.mktemp("rows") / "store"
    with Writer(root, chunk_size=4096, classes=["a", "b", "c"]) as w:
        for i in range(N):
            w.write({"__key__": f"s{i:07d}", "bin": bytes([i]) * (50 + i), "cls": i % 3})
    return root, (root / INDEX_NAME).read_bytes()


@pytest.fixture(scope="module")
def wanted(pristine: tuple[Path, bytes]) -> list[tuple[str, int, dict[str, bytes]]]:
    with open_store(pristine[0]) as store:
        return [(s.key, s.label, dict(s.fields)) for s in store.read_samples(range(N))]


@pytest.fixture(autouse=True)
def on_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every index is large enough to be opened checked on use; stamps in a fresh cache."""
    from tierfeed.format import index as index_module

    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(index_module, "STAMP_ABOVE_BYTES", 0)


@pytest.fixture
def damaged(pristine: tuple[Path, bytes], tmp_path: Path) -> Callable[[bytes], Path]:
    def make(raw: bytes) -> Path:
        return ie.store_with_index(tmp_path / "damaged", pristine[0], raw)

    return make


def read_each(store_dir: Path) -> list[tuple[str, int, dict[str, bytes]] | None]:
    """Every sample as a lazy reader gets it, or None where the read is refused naming the
    index (any other error escapes and fails the test)."""
    where = str(store_dir / INDEX_NAME)
    got: list[tuple[str, int, dict[str, bytes]] | None] = []
    with open_store(store_dir, lazy=True) as store:
        assert not store.index.checked
        for i in range(N):
            try:
                s = store.read_sample(i)
            except IndexFormatError as exc:
                assert where in str(exc)
                got.append(None)
            else:
                got.append((s.key, s.label, dict(s.fields)))
    return got


def swap_ext(ext: np.ndarray, first: int) -> np.ndarray:
    ext[first], ext[first + 1] = ext[first + 1], ext[first]
    return ext


ROW = 17  # the sample whose row rots


def at_row(a: np.ndarray) -> np.ndarray:
    return np.arange(len(a)) == ROW


ROT: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    # sample ROW-1 would get sample ROW's `bin` under its own key, and ROW lose its `bin`
    "a member start shifted": ("sample_member_start", lambda a: a + at_row(a)),
    # one valid label for another: the wrong label would be delivered
    "a label changed": (
        "sample_label",
        lambda a: np.where(np.arange(len(a)) == ROW, (a + 1) % 3, a),
    ),
    # the fields would come out swapped (cls <-> bin)
    "two extensions swapped": ("member_ext", lambda a: swap_ext(a, 2 * ROW)),
    # a wrong key would be delivered
    "a key offset moved": ("sample_key_offset", lambda a: a + at_row(a)),
}


@pytest.mark.parametrize("case", list(ROT))
def test_a_rotted_row_is_refused_never_delivered(
    case: str, pristine: tuple[Path, bytes], wanted: list[Any], damaged: Callable[[bytes], Path]
) -> None:
    name, change = ROT[case]
    store = damaged(ie.edit_array(pristine[1], name, change, sealed=False))
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        Index(store)  # a full open refuses it (the sections checksum)
    got = read_each(store)
    assert got[ROW] is None or got[ROW - 1] is None  # the rotted row (a start is two rows' edge)
    assert all(g is None or g == w for g, w in zip(got, wanted, strict=True))


def test_two_members_of_one_extension_are_refused_even_with_every_checksum_right(
    pristine: tuple[Path, bytes], damaged: Callable[[bytes], Path], tmp_path: Path
) -> None:
    # An index written that way (a writer's bug, or crafted): its sections checksum and row
    # checks are right. A reader keeps one field per extension: one member would be dropped.
    with Index(pristine[0]) as ix:
        content = ie.content_of(ix)
    ext = content.member_ext.copy()
    ext[2 * ROW + 1] = ext[2 * ROW]
    written = tmp_path / "crafted.tfi"
    write_index(written, dataclasses.replace(content, member_ext=ext))
    store = damaged(written.read_bytes())
    with pytest.raises(IndexFormatError, match="extension order"):
        Index(store)
    got = read_each(store)
    assert got[ROW] is None and got.count(None) == 1


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_single_byte_damage_reads_right_or_is_refused(
    pristine: tuple[Path, bytes], wanted: list[Any], tmp_path: Path, data: st.DataObject
) -> None:
    raw = pristine[1]
    sections = ie.read_header(raw)["sections"]
    name = data.draw(st.sampled_from(sorted(n for n, (_, size) in sections.items() if size)))
    offset, size = ie.section(raw, name)
    at = offset + data.draw(st.integers(0, size - 1))
    value = data.draw(st.integers(0, 255).filter(lambda v: v != raw[at]))
    store = ie.store_with_index(
        tmp_path / f"d{at}-{value}", pristine[0], raw[:at] + bytes([value]) + raw[at + 1 :]
    )
    where = str(store / INDEX_NAME)
    try:
        got = read_each(store)
    except TierfeedError as exc:  # refused on open: naming the index
        assert where in str(exc), exc
        return
    assert all(g is None or g == w for g, w in zip(got, wanted, strict=True)), (name, at, value)
