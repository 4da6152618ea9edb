"""A cache that is on when asked for (issue 33, frictions 1 and 5): `TierConfig(disk_dir=...)`
alone is a disk tier of a documented default size, said in one line; sizes that cannot work
are one ConfigError; a disk tier that cannot be used fails in the main process, in one line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile.conftest import tmpfs as tmpfs  # a read-only disk
from tests.torch.conftest import store_dir as store_dir  # the numbered store
from tests.torch.test_loader import decode
from tierfeed.errors import ConfigError, StorageError
from tierfeed.format.index import Index
from tierfeed.loader.compose import TierConfig, default_disk_bytes
from tierfeed.torch import Dataset, Loader

pytestmark = pytest.mark.timeout(120)


def test_disk_dir_alone_is_a_disk_tier_of_the_default_size(
    store_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    ds = Dataset(store_dir, batch_size=8, decode=decode, tiers=TierConfig(disk_dir=str(cache)))
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and str(cache) in said[0] and "disk_bytes=" in said[0]
    with Index(store_dir) as index:
        store_bytes = int(index.chunk_size.sum())
    assert default_disk_bytes(cache, store_bytes) == store_bytes  # a small store fits whole
    # The quota the processes get is the store to the byte: room for every chunk, which lets
    # their placements go without the host's lock (`Holdings.host_lock`).
    assert ds._feed._process.opener.tiers.disk_bytes == store_bytes
    with Loader(ds) as loader:
        assert sum(len(b[0]) for b in loader) == 120
    copied = [p for p in cache.rglob("*.tar")]
    assert copied, "the disk tier copied no chunk"


def test_the_default_is_bounded_by_the_free_space(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    size = default_disk_bytes(tmp_path, 10 * total)  # a store larger than the disk
    margin = max(2**30, total // 20)
    assert 0 < size <= free - margin or free <= margin


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (dict(disk_dir="/x", disk_bytes=0), "disk_bytes=0"),
        (dict(disk_dir="/x", disk_bytes=-5), "disk_bytes=-5"),
        (dict(disk_bytes=2**30), "disk_bytes without a disk_dir"),
        (dict(ram_bytes=-1), "ram_bytes=-1"),
    ],
)
def test_sizes_that_cannot_work_are_one_config_error(config: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TierConfig(**config)  # type: ignore[arg-type]


def test_a_quota_larger_than_the_file_system_is_refused(store_dir: Path, tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    huge = 2 * st.f_blocks * st.f_frsize
    tiers = TierConfig(disk_dir=str(tmp_path / "c"), disk_bytes=huge)
    with pytest.raises(ConfigError, match="larger than the file system"):
        Dataset(store_dir, batch_size=8, decode=decode, tiers=tiers)


@pytest.mark.hostile
def test_a_read_only_disk_dir_fails_in_the_main_process(
    store_dir: Path, tmpfs: Callable[..., Path]
) -> None:
    ro = tmpfs("ro", "ro,size=1m")
    tiers = TierConfig(disk_dir=str(ro / "cache"), disk_bytes=2**20)
    with pytest.raises(StorageError) as refused:
        Dataset(store_dir, batch_size=8, decode=decode, tiers=tiers)  # before any worker
    assert str(ro / "cache") in str(refused.value) and "\n" not in str(refused.value)
