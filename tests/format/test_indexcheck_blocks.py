"""The index's O(N) checks run in blocks on threads: the same verdicts as whole arrays, at the
edges of blocks and for a sample with more members than a block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.errors import IndexFormatError
from tierfeed.format import indexcheck
from tierfeed.format.indexcheck import check_invariants

WHERE = Path("/stores/x/index.tfi")
EXTS = 8  # the extension table's size: more than any sample here has members


def arrays(members_per_sample: list[int], chunk_of_sample: list[int]) -> dict[str, Any]:
    """A consistent set of index arrays: sample s has members_per_sample[s] members, 10 bytes
    each, laid out one after another in chunk chunk_of_sample[s] (non-decreasing) of 1000."""
    counts = np.asarray(members_per_sample, dtype=np.int64)
    sample_chunk = np.asarray(chunk_of_sample, dtype=np.uint32)
    member_chunk = np.repeat(sample_chunk, counts)
    chunks = int(sample_chunk.max()) + 1
    offset = np.zeros(len(member_chunk), dtype=np.uint64)
    for c in range(chunks):
        here = np.flatnonzero(member_chunk == c)
        offset[here] = np.arange(len(here), dtype=np.uint64) * 10
    keys = b"".join(f"k{s:05d}".encode() for s in range(len(counts)))
    return {
        "sample_member_start": np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64),
        "sample_key_offset": np.arange(len(counts) + 1, dtype=np.uint64) * 6,
        "keys": np.frombuffer(keys, dtype=np.uint8),
        "chunk_name_offset": np.arange(chunks + 1, dtype=np.uint64) * 2,
        "chunk_names": np.frombuffer(b"c0" * chunks, dtype=np.uint8),
        "sample_label": np.zeros(len(counts), dtype=np.int32),
        "sample_chunk": sample_chunk,
        "member_chunk": member_chunk.astype(np.uint32),
        # A sample's members have extensions 0, 1, 2, ...: in order, none twice.
        "member_ext": np.concatenate([np.arange(c) for c in counts]).astype(np.uint16),
        "member_offset": offset,
        "member_length": np.full(len(member_chunk), 10, dtype=np.uint64),
        "chunk_size": np.full(chunks, 1000, dtype=np.uint64),  # room for every member
        "path_order": np.arange(len(member_chunk), dtype=np.uint64)[::-1].copy(),
    }


def check(a: dict[str, Any]) -> None:
    chunks = len(a["chunk_size"])
    check_invariants(a, WHERE, chunks, classes=1, exts=EXTS)


@pytest.mark.parametrize("block", [1, 2, 3, 1 << 22])
def test_a_sample_with_more_members_than_a_block(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexcheck, "_BLOCK", block)
    a = arrays([1, 7, 2, 1], [0, 1, 1, 2])
    check(a)  # consistent: passes in any blocks
    a["member_chunk"][4] = 2  # the middle member of the 7-member sample, in another chunk
    with pytest.raises(IndexFormatError, match="not all in the sample's chunk"):
        check(a)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=30),
    block=st.integers(1, 8),
    flaw=st.sampled_from(["none", "start", "chunk order", "owner", "past end", "order"]),
    at=st.integers(0, 10**6),
)
def test_blocks_give_the_verdict_of_whole_arrays(sizes, block, flaw, at) -> None:
    """Whatever the block size, a flaw anywhere (block edges included) is found, and a
    consistent index passes."""
    chunk = np.arange(len(sizes)) // 3
    a = arrays(sizes, chunk.tolist())
    s, m = at % len(sizes), at % int(np.sum(sizes))
    if flaw == "start" and len(sizes) > 1:
        a["sample_member_start"][1 + s % (len(sizes) - 1)] = 0
    elif flaw == "chunk order" and chunk[-1] > 0:
        a["sample_chunk"][-1] = 0  # ids decrease at the last sample
    elif flaw == "owner":
        a["member_chunk"][m] = a["member_chunk"][m] + 1
    elif flaw == "past end":
        a["member_offset"][m] = a["chunk_size"][a["member_chunk"][m]]
    elif flaw == "order" and len(a["path_order"]) > 1:
        a["path_order"][m] = a["path_order"][(m + 1) % len(a["path_order"])]
    else:
        flaw = "none"
    whole = _verdict(a)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexcheck, "_BLOCK", block)
        assert _verdict(a) == whole
    assert (whole is None) == (flaw == "none")


def _verdict(a: dict[str, Any]) -> str | None:
    try:
        check(a)
    except IndexFormatError as exc:
        return str(exc)
    return None


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=0, max_size=20),
    base=st.integers(0, 50),
    block=st.integers(1, 16),
)
def test_spans_are_the_ranges_in_bounded_blocks(lengths, base, block) -> None:
    lo = np.cumsum([0, *lengths[:-1]]) * 3 + base if lengths else np.zeros(0, dtype=np.int64)
    hi = lo + np.asarray(lengths, dtype=np.int64)
    rows, values = [], []
    for r, v in indexcheck._spans(lo, hi, block):
        assert len(r) == len(v) and (len(v) <= block or len(set(r.tolist())) == 1)
        rows += r.tolist()
        values += v.tolist()
    assert values == [x for a, b in zip(lo, hi, strict=True) for x in range(a, b)]
    assert rows == [i for i, n in enumerate(lengths) for _ in range(n)]


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=2, max_size=30),
    block=st.integers(1, 8),
    flaw=st.sampled_from(["owner", "past end", "label", "key NUL", "ext"]),
    at=st.integers(0, 10**6),
)
def test_rows_find_a_flaw_in_the_row_that_holds_it(sizes, block, flaw, at) -> None:
    """What an index checked on use runs on the rows a reader takes: the damaged row is
    refused with the message of the full checks, in blocks of any size; the other rows pass."""
    a = arrays(sizes, (np.arange(len(sizes)) // 3).tolist())
    starts = a["sample_member_start"].astype(np.int64)
    s = at % len(sizes)
    m = int(starts[s]) + at % sizes[s]  # a member of sample s
    if flaw == "owner":
        a["member_chunk"][m] += 1
    elif flaw == "past end":
        a["member_offset"][m] = a["chunk_size"][a["member_chunk"][m]]
    elif flaw == "label":
        a["sample_label"][s] = 1
    elif flaw == "key NUL":
        a["keys"] = a["keys"].copy()
        a["keys"][int(a["sample_key_offset"][s]) + 1] = 0
    else:
        a["member_ext"][m] = EXTS
    whole = _verdict(a)
    assert whole is not None
    chunks = len(a["chunk_size"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexcheck, "_BLOCK", block)
        with pytest.raises(IndexFormatError) as info:
            indexcheck.check_sample_rows(a, WHERE, np.arange(len(sizes)), chunks, 1, EXTS)
        assert str(info.value) == whole
        others = np.array([i for i in range(len(sizes)) if i != s], dtype=np.int64)
        indexcheck.check_sample_rows(a, WHERE, others, chunks, 1, EXTS)
        indexcheck.check_sample_rows(a, WHERE, others[::-1].copy(), chunks, 1, EXTS)
