"""A Loader's workers receive S3 through obstore where asked (`TIERFEED_S3_CLIENT=obstore`,
`tierfeed.storage.nativeranges`): the main
process starts no obstore runtime before it forks them (it fetches the store's index through
fsspec's event loop, `FsspecDriver.read_whole_file`), so each worker may use it. In a fresh
process (this one may have made obstore requests already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.objectstore import s3_options, upload
from tests.torch.conftest import N

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def one_epoch(url: str, endpoint: str, log: str) -> None:
    """In a fresh process: note which client made each GET, in which process; one epoch of a
    Loader with 2 workers and a RAM tier; print what the main process saw."""
    from tests.torch.test_loader import decode, values
    from tierfeed.storage import nativeranges
    from tierfeed.storage.fsspec_driver import FsspecDriver
    from tierfeed.storage.nativeranges import NativeRanges
    from tierfeed.storage.s3ranges import S3Ranges
    from tierfeed.torch import Dataset, Loader, TierConfig

    def noted(kind: str, get: Any) -> Any:
        def get_noted(*args: Any, **kwargs: Any) -> Any:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"{os.getpid()} {kind}\n".encode())
            os.close(fd)
            return get(*args, **kwargs)

        return get_noted

    NativeRanges.get = noted("obstore", NativeRanges.get)  # type: ignore[method-assign]
    S3Ranges.get = noted("botocore", S3Ranges.get)  # type: ignore[method-assign]
    FsspecDriver._get = noted("event-loop", FsspecDriver._get)  # type: ignore[method-assign]
    tiers = TierConfig(ram_bytes=10**8)  # no disk tier: the workers copy every chunk
    ds = Dataset(url, "global", batch_size=16, decode=decode, tiers=tiers,
                 storage_options=s3_options(endpoint))  # fmt: skip
    before_fork = nativeranges._runtime_pid
    with Loader(ds, num_workers=2) as loader:
        got = sorted(values(list(loader)))
    print(
        json.dumps(
            {"main": os.getpid(), "before_fork": before_fork, "right": got == list(range(N))}
        )
    )


def test_the_workers_receive_through_obstore(
    store_dir: Path, s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    url = upload(s3_endpoint, store_dir, bucket, "numbers")
    log = tmp_path / "gets.log"
    code = (
        "from tests.torch.test_remote_native import one_epoch; "
        f"one_epoch({url!r}, {s3_endpoint!r}, {str(log)!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=100,
        env={**os.environ, "TIERFEED_S3_CLIENT": "obstore"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["right"] and seen["before_fork"] is None  # nothing of obstore's before the fork
    gets = [line.split() for line in log.read_text().splitlines()]
    workers = {pid for pid, _ in gets if int(pid) != seen["main"]}
    assert len(workers) == 2, gets  # each worker copied chunks
    assert {kind for pid, kind in gets if pid in workers} == {"obstore"}, gets
