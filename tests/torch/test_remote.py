"""The PyTorch face over a store at an S3 URL (moto's server on loopback): Dataset and Loader
with a disk tier over epochs, and ImageFolder."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from tests.objectstore import s3_options, upload
from tests.s3proxy import Fault, S3Proxy
from tests.torch.conftest import N
from tests.torch.test_loader import decode, values
from tierfeed.format.index import Index
from tierfeed.loader import DeadlineOptions
from tierfeed.torch import Dataset, ImageFolder, Loader, TierConfig
from tierfeed.torch.dataset import feed_of

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch_and_the_second_from_the_disk_tier(
    store_dir: Path, s3_endpoint: str, bucket: str, tmp_path: Path, workers: int,
    capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url = upload(s3_endpoint, store_dir, bucket, "numbers")
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(url, "global", batch_size=16, decode=decode, tiers=tiers,
                 storage_options=s3_options(s3_endpoint))  # fmt: skip
    origin_bytes = []
    with Loader(ds, num_workers=workers) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(values(list(loader))) == list(range(N))
            assert loader.last_epoch is not None
            origin_bytes.append(loader.last_epoch["tiers"]["origin"]["bytes"])
            ds.store().source.drain(30)  # type: ignore[attr-defined]
            time.sleep(0.2)  # the workers' last copies land too
    assert origin_bytes[0] > 0 and origin_bytes[1] == 0
    # The parent's S3 clients were closed before the workers forked: none of them is closed
    # again on a worker's event loop (which printed tracebacks).
    assert "Traceback" not in capfd.readouterr().err


def test_imagefolder_at_a_url(tmp_path: Path, s3_endpoint: str, bucket: str) -> None:
    from PIL import Image

    from tests.format.conftest import QUIET, write_tree
    from tierfeed.format.pack import pack

    def png(value: int) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", (4, 3), (value, 0, 0)).save(out, format="PNG")
        return out.getvalue()

    write_tree(tmp_path / "src", {f"{c}/{i}.png".encode(): png(i) for c in "ab" for i in range(5)})
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    url = upload(s3_endpoint, tmp_path / "store", bucket, "images")
    folder = ImageFolder(url, storage_options=s3_options(s3_endpoint))
    assert folder.root == url and folder.classes == ["a", "b"] and len(folder) == 10
    image, target = folder[7]
    assert target == 1 and image.size == (4, 3) and image.getpixel((0, 0)) == (2, 0, 0)


def test_gets_per_epoch_through_a_counting_proxy(
    store_dir: Path, s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    # Cold: chunk-wise ranged GETs (pieces), one per chunk of this small store; warm: none.
    url = upload(s3_endpoint, store_dir, bucket, "counted")
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    gets = []
    with S3Proxy(s3_endpoint) as proxy:
        ds = Dataset(url, "global", batch_size=16, decode=decode, tiers=tiers,
                     storage_options=s3_options(proxy.url))  # fmt: skip
        with Loader(ds, num_workers=2) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                assert sorted(values(list(loader))) == list(range(N))
                ds.store().source.drain(30)  # type: ignore[attr-defined]
                time.sleep(0.2)
                gets.append(proxy.count("GET", "/chunks/"))
                proxy.reset_log()
    with Index(store_dir) as ix:
        chunks = ix.num_chunks
    # Each chunk (one piece here) is fetched once; no read makes a GET of its own beside the
    # copies (an object store's requests are costly: reads wait for the copy in flight).
    assert gets == [chunks, 0]


def test_a_stalled_get_is_hedged_by_a_second_ranged_get(
    store_dir: Path, s3_endpoint: str, bucket: str
) -> None:
    url = upload(s3_endpoint, store_dir, bucket, "hedged")
    with S3Proxy(s3_endpoint) as proxy:
        proxy.inject(Fault(method="GET", key_contains="/chunks/", delay_s=10.0, times=1))
        ds = Dataset(url, "global", batch_size=8, decode=decode,
                     deadline=DeadlineOptions(fixed_ms=20, hedge_after_ms=50),
                     storage_options=s3_options(proxy.url))  # fmt: skip
        with Loader(ds) as loader:
            started = time.monotonic()
            assert sorted(values(list(loader))) == list(range(N))
            assert time.monotonic() - started < 8  # the epoch did not wait for the stalled GET
            assert loader.last_epoch is not None
            guard = loader.last_epoch["guard"]
        # (close waits for the stalled GET itself: bounded by the request's read timeout)
        assert guard["hedges"] >= 1 and guard["hedge_wins"] >= 1


def test_the_main_process_copies_through_the_driver_that_fetched_the_index(
    store_dir: Path, s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    url = upload(s3_endpoint, store_dir, bucket, "cold-start")
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(url, "global", batch_size=16, decode=decode, tiers=tiers,
                 storage_options=s3_options(s3_endpoint))  # fmt: skip
    kept = feed_of(ds)._process._origin  # its client made as the index was fetched
    assert kept is not None
    with Loader(ds, num_workers=2) as loader:
        assert sorted(values(list(loader))) == list(range(N))
        assert feed_of(ds)._process.take_origin() is None  # handed to the main process's copies
        cold = loader._cold
        assert cold is not None and cold.stop() and cold.stats is not None
        assert cold.stats["origin"]["bytes"] > 0
    assert kept._closed  # type: ignore[attr-defined]  # closed with the copies' stack
