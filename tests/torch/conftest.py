"""Fixtures for the PyTorch face: a small numbered store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.format.conftest import write_tree
from tierfeed.format.pack import PackOptions, pack

N = 120  # samples of `store_dir`: c{i % 3}/s{i:04d}.txt holding the number i


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ld")
    write_tree(root / "src", {f"c{i % 3}/s{i:04d}.txt".encode(): b"%d" % i for i in range(N)})
    pack(root / "src", root / "store", PackOptions(chunk_size=8192, progress=False))
    return root / "store"
