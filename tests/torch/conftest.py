"""Fixtures for the PyTorch face: a small numbered store, and stores of random samples."""

from __future__ import annotations

import os
import random
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


def random_store(
    root: Path, n: int, classes: int, sizes: tuple[int, int], chunk_size: int, seed: int
) -> Path:
    """``n`` samples of random bytes (``c{i % classes}/s{i:05d}.bin``, of ``sizes[0]`` to
    ``sizes[1]`` bytes), packed under ``root / "store"`` into chunks of ``chunk_size``."""
    rng = random.Random(seed)
    for i in range(n):
        folder = root / "raw" / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{i:05d}.bin").write_bytes(os.urandom(rng.randrange(*sizes)))
    pack(root / "raw", root / "store", PackOptions(chunk_size=chunk_size, progress=False))
    return root / "store"
