"""The Prometheus text of a loader's figures: a disk tier shared by the workers counted once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tierfeed.format.index import Index
from tierfeed.telemetry.prometheus import render

FILES = {f"c{i % 3}/s{i:03d}.bin".encode(): bytes([i % 251]) * (700 + 37 * i) for i in range(90)}


def du(cache: Path) -> int:
    """Bytes of cached chunks in a disk tier's directory, as `du` would count the files."""
    return sum(p.stat().st_size for p in cache.glob("*.tar"))


@pytest.mark.timeout(120)
def test_shared_disk_tier_is_counted_once_over_workers(
    packed: Callable[..., Path], tmp_path: Path
) -> None:
    from tierfeed.torch import Dataset, Loader, TierConfig

    store_dir = packed(FILES)
    cache = tmp_path / "cache"
    tiers = TierConfig(disk_dir=str(cache), disk_bytes=2**30, policy="fill-top")
    ds = Dataset(
        store_dir, "global", batch_size=8, decode=lambda s: len(s.fields["bin"]), tiers=tiers
    )
    with Loader(ds, num_workers=2) as loader:
        for _ in range(3):  # by the last epoch every chunk has long been cached
            for _ in loader:
                pass
            time.sleep(1.1)  # past the tier's rescan interval, so the last batches look again
        held = loader.last_epoch["tiers"][f"disk:{cache}"]["held_bytes"]
        text = render(loader.last_epoch)
    total = sum(c.size for c in Index(store_dir).chunks())
    assert du(cache) == total
    assert held == total
    assert f'tierfeed_tier_held_bytes{{tier="disk:{cache}"}} {float(total)!r}' in text
