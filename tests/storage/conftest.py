"""Driver fixtures: every driver the conformance suite runs against, a real S3 server included
(`s3_endpoint`, in tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.format.conftest import write_tree
from tests.objectstore import s3_options
from tierfeed.format.pack import PackOptions, pack
from tierfeed.storage import Driver, LatencyModel, MemoryDriver, PosixDriver, SlowDriver


@pytest.fixture
def make_s3(s3_endpoint: str, request: pytest.FixtureRequest) -> Callable[..., Driver]:
    import boto3

    bucket = f"b-{abs(hash(request.node.nodeid)) % 10**10}"
    client = boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    client.create_bucket(Bucket=bucket)

    def make(read_only: bool = False) -> Driver:
        from tierfeed.storage.fsspec_driver import FsspecDriver

        return FsspecDriver(f"s3://{bucket}/root", read_only, **s3_options(s3_endpoint))

    return make


@pytest.fixture(params=["posix", "posix-direct", "memory", "slow", "fsspec-s3"])
def make_driver(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Driver]:
    """A factory of one driver kind over one shared backing store."""
    kind = request.param
    if kind == "posix":
        return lambda read_only=False: PosixDriver(tmp_path / "root", read_only)
    if kind == "posix-direct":  # O_DIRECT opens; unaligned reads fall back to the page cache
        return lambda read_only=False: PosixDriver(tmp_path / "root", read_only, direct=True)
    if kind == "memory":
        backing = MemoryDriver()

        def memory(read_only: bool = False) -> Driver:
            if read_only:
                view = MemoryDriver(read_only=True)
                view._objects = backing._objects  # same objects, read-only face
                return view
            return backing

        return memory
    if kind == "slow":
        inner = MemoryDriver()
        model = LatencyModel(median_ms=0.2, sigma=0.3, seed=3)
        return lambda read_only=False: SlowDriver(inner if not read_only else _ro(inner), model)
    return request.getfixturevalue("make_s3")  # type: ignore[no-any-return]


def _ro(inner: MemoryDriver) -> MemoryDriver:
    view = MemoryDriver(read_only=True)
    view._objects = inner._objects
    return view


FILES = {f"c{i % 3}/f{i:03d}.bin".encode(): os.urandom(2000 + 37 * i) for i in range(120)}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed store of `FILES` in ~32 KiB chunks (tier and landing tests)."""
    root = tmp_path_factory.mktemp("tiers")
    write_tree(root / "src", FILES)
    pack(root / "src", root / "store", PackOptions(chunk_size=32 * 1024, progress=False))
    return root / "store"
