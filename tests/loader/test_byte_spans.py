"""The byte range a read of a sample needs, told to the tiers so a copy fetches every piece
of it when the read comes (issue 16)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.format.conftest import write_tree
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.clairvoyance import byte_spans


def test_a_samples_span_covers_all_its_members_and_nothing_of_its_neighbours(
    tmp_path: Path,
) -> None:
    files = {}
    for i in range(40):  # samples of one to three members, of different sizes
        for ext in (".jpg", ".cls", ".json")[: 1 + i % 3]:
            files[f"d/s{i:03d}{ext}".encode()] = bytes([i]) * (100 + 37 * i)
    write_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "store", PackOptions(chunk_size=8192, group_by="key",
                                                           progress=False))  # fmt: skip
    index = Index(tmp_path / "store")
    assert int(np.diff(index.sample_member_start).max()) == 3
    samples = np.random.default_rng(0).permutation(len(index))
    starts, ends = byte_spans(index, samples)
    for s, lo, hi in zip(samples.tolist(), starts.tolist(), ends.tolist(), strict=True):
        members = list(index.members(s))
        offsets = [int(index.member_offset[m]) for m in members]
        stops = [o + int(index.member_length[m]) for o, m in zip(offsets, members, strict=True)]
        assert (lo, hi) == (min(offsets), max(stops))
