"""Fuzzed index.tfi (hypothesis, derandomized by the `ci` profile): bit flips, truncation
around every section boundary, header edits, crafted section edits with the checksum
resealed. Each case must end, in bounded time, in a tierfeed error or in the original bytes
and paths (crafted cases: in bytes that some original member holds)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.format.conftest import write_tree
from tests.hostile import indexedit as ie
from tierfeed.errors import TierfeedError
from tierfeed.format import index as index_module
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME, SECTIONS, TREE_SECTIONS
from tierfeed.format.pack import PackOptions, pack
from tierfeed.format.verify import summarize, verify_store
from tierfeed.loader.compose import open_store
from tierfeed.storage.store import Store

ALL_SECTIONS = SECTIONS | TREE_SECTIONS  # the pristine store is packed: it has the tree
pytestmark = pytest.mark.timeout(120)

FILES = {
    b"a/x.jpg": b"x" * 1200,
    b"a/x.txt": b"label x",
    b"a/y.jpg": b"y" * 2500,
    b"a/sub/z.jpg": b"z" * 800,
    b"a/zz.jpg": b"zz" * 100,
    b"b/p.png": b"p" * 1900,
    b"b/q/r": b"no extension",
    b"b/s.jpg": b"s" * 3000,
}
CASE_SECONDS = 10.0  # one case on a loaded 2-core machine takes milliseconds


class World:
    """The pristine store, what it holds, and a scratch store sharing its chunks."""

    def __init__(self, base: Path) -> None:
        write_tree(base / "src", FILES)
        self.store = base / "store"
        pack(base / "src", self.store, PackOptions(chunk_size=4096, workers=2, progress=False))
        self.raw = (self.store / INDEX_NAME).read_bytes()
        with open_store(self.store) as s:
            self.samples = [s.read_sample(i) for i in range(len(s))]
            self.tree = walk(s, 100)
        self.member_bytes = set(FILES.values())
        self.scratch = base / "scratch"
        self.scratch.mkdir()
        (self.scratch / "chunks").symlink_to(self.store / "chunks")

    def put(self, raw: bytes) -> Path:
        tmp = self.scratch / "index.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, self.scratch / INDEX_NAME)
        return self.scratch


def walk(s: Store, limit: int) -> dict[bytes, int]:
    """Every path under the root -> size (-1 for directories); fails past ``limit`` entries."""
    out: dict[bytes, int] = {}
    stack = [b""]
    while stack:
        d = stack.pop()
        for name in s.listdir(d):
            p = d + b"/" + os.fsencode(name) if d else os.fsencode(name)
            assert len(out) < limit, "the listing does not end"
            info = s.stat(p)
            out[p] = -1 if info.is_dir else info.size
            if info.is_dir:
                stack.append(p)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("fuzz"))


def exercise(world: World, raw: bytes, crafted: bool) -> None:
    """Open, summarise, verify, read every sample and walk the tree of a mutated index."""
    began = time.monotonic()
    store = world.put(raw)
    with contextlib.suppress(TierfeedError):
        Index(store).close()
    with contextlib.suppress(TierfeedError):
        summarize(store)
    problems = verify_store(store, progress=False)  # reports; never raises
    try:
        s = open_store(store)
    except TierfeedError:
        assert problems, "open_store refused an index verify passed"
        return
    with s:
        for i in range(len(s)):
            try:
                sample = s.read_sample(i)
            except TierfeedError:
                continue
            if crafted:
                assert set(sample.fields.values()) <= world.member_bytes
            else:
                assert sample == world.samples[i]
        try:
            tree = walk(s, 2 * s.index.num_members + 8)
        except TierfeedError:
            tree = None
        if tree is not None and not crafted:
            assert tree == world.tree
    read_checked_on_use(world, store)
    assert time.monotonic() - began < CASE_SECONDS


def read_checked_on_use(world: World, store: Path) -> None:
    """The same index opened as a large one this host has not stamped (rows checked on use,
    no sections checksum): every read ends in a tierfeed error or in bytes some member
    holds, whole batches and one sample at a time."""
    with mock.patch.object(index_module, "STAMP_ABOVE_BYTES", 0):
        try:
            s = open_store(store, lazy=True)
        except TierfeedError:
            return
        with s:
            with contextlib.suppress(TierfeedError):
                for sample in s.read_samples(range(len(s))):
                    assert set(sample.fields.values()) <= world.member_bytes
            for i in range(len(s)):
                with contextlib.suppress(TierfeedError):
                    assert set(s.read_sample(i).fields.values()) <= world.member_bytes


@settings(max_examples=200)
@given(data=st.data())
def test_bit_flips(world: World, data: st.DataObject) -> None:
    raw = bytearray(world.raw)
    in_header = data.draw(st.booleans())
    top = (ie.header_slot(world.raw) if in_header else len(raw)) * 8
    for bit in data.draw(st.lists(st.integers(0, top - 1), min_size=1, max_size=3)):
        raw[bit // 8] ^= 1 << (bit % 8)
    exercise(world, bytes(raw), crafted=False)


@settings(max_examples=100)
@given(data=st.data())
def test_truncation_near_section_boundaries(world: World, data: st.DataObject) -> None:
    cut = data.draw(st.sampled_from(ie.boundaries(world.raw))) + data.draw(st.integers(-3, 3))
    exercise(world, world.raw[: max(0, min(cut, len(world.raw) - 1))], crafted=False)


HOSTILE: list[object] = [None, -1, 0, 1, 2**31, 2**64, 2**70, "x", "", 1.5, True, [], {}, [1]]


@settings(max_examples=150)
@given(data=st.data())
def test_header_edits(world: World, data: st.DataObject) -> None:
    header = ie.read_header(world.raw)
    fields = sorted(header) + [f"sections.{n}" for n in ALL_SECTIONS] + ["new field"]
    field = data.draw(st.sampled_from(fields))
    remove = data.draw(st.booleans())
    if field.startswith("sections."):
        name = field.split(".", 1)[1]
        offset, nbytes = header["sections"][name]
        near = [[offset + d, nbytes] for d in (-64, -1, 1, 8, 64)] + [
            [offset, nbytes + d] for d in (-8, -1, 1, 8)
        ]
        value = data.draw(st.sampled_from(near + HOSTILE))
        if remove:
            del header["sections"][name]
        else:
            header["sections"][name] = value
    elif remove and field in header:
        del header[field]
    else:
        own = header.get(field)
        extra: list[object] = []
        if isinstance(own, int):
            extra = [own + 1, own - 1, own * 2]
        elif isinstance(own, list):
            extra = [own[:-1], [*own, ".zzz"], own * 2, ["/x"], ["\0"]]
        elif isinstance(own, str):
            extra = ["<u8", "<i4", "|u1", "md5"]
        header[field] = data.draw(st.sampled_from(extra + HOSTILE))
    reseal = data.draw(st.booleans())
    exercise(world, ie.with_header(world.raw, header, reseal=reseal), crafted=False)


@settings(max_examples=150)
@given(data=st.data())
def test_crafted_sections(world: World, data: st.DataObject) -> None:
    """Edits an attacker makes, the checksum resealed: only the invariants stand guard."""
    name = data.draw(st.sampled_from(list(ALL_SECTIONS)))
    header = ie.read_header(world.raw)
    spec = header["path_order_dtype"] if name == "path_order" else ALL_SECTIONS[name][0]
    count = ie.section(world.raw, name)[1] // np.dtype(spec).itemsize
    if count == 0:
        return
    where = data.draw(st.integers(0, count - 1))
    info = np.iinfo(np.dtype(spec))
    interesting = [0, 1, 2, count - 1, count, count + 1, 2**15, 2**31, 2**32 - 1, 2**63]
    value = data.draw(
        st.sampled_from([v for v in interesting if info.min <= v <= info.max] + [info.max, -1])
    )
    swap = data.draw(st.integers(0, count - 1))

    def change(a: Any) -> Any:
        if data.draw(st.booleans(), label="swap"):
            a[[where, swap]] = a[[swap, where]]
        else:
            a[where] = max(info.min, value) if value != -1 else info.max if info.min == 0 else -1
        return a

    exercise(world, ie.edit_array(world.raw, name, change), crafted=True)
