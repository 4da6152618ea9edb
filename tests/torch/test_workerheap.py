"""A DataLoader worker keeps the heap memory it frees (`tierfeed.torch.workerheap`): set in each
worker, never in the training process, not where the user tunes malloc, and it does keep it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.torch.conftest import N
from tierfeed.config import worker_heap_wanted
from tierfeed.errors import ConfigError
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, workerheap

GLIBC = platform.libc_ver()[0] == "glibc"
# What would make tierfeed leave malloc alone, whoever runs the tests: cleared for them.
TUNING = ("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD", "TIERFEED_WORKER_HEAP")


def untuned() -> dict[str, str]:
    """This environment without what tunes malloc or tierfeed's setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith(TUNING)}


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, True),
        ({"TIERFEED_WORKER_HEAP": "1"}, True),
        ({"TIERFEED_WORKER_HEAP": ""}, True),
        ({"TIERFEED_WORKER_HEAP": "0"}, False),
        ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, False),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, False),
        ({"MALLOC_TOP_PAD_": "0"}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=4096"}, False),
        ({"GLIBC_TUNABLES": "glibc.rtld.nns=4"}, True),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, False),
        ({"LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so"}, False),
        ({"LD_PRELOAD": "/opt/lib/libfaketime.so"}, True),
    ],
)
def test_the_environment_decides_whether_workers_keep_their_heap(
    env: dict[str, str], wanted: bool
) -> None:
    assert worker_heap_wanted(env) is wanted


def test_a_bad_setting_is_named_where_the_dataset_is_made(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="TIERFEED_WORKER_HEAP='yes'"):
        worker_heap_wanted({"TIERFEED_WORKER_HEAP": "yes"})
    monkeypatch.setenv("TIERFEED_WORKER_HEAP", "yes")
    with pytest.raises(ConfigError, match="TIERFEED_WORKER_HEAP"):
        Dataset(store_dir, "global", batch_size=8)


def heap_kept_here(sample: Sample) -> tuple[int, bool]:
    """The sample's number and whether the process decoding it keeps its freed heap."""
    return int(sample.fields["txt"]), workerheap._kept_in == os.getpid()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", ["", "0"])
def test_set_in_every_worker_and_never_in_the_training_process(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    for name in set(os.environ) - set(untuned()):
        monkeypatch.delenv(name)
    monkeypatch.setenv("TIERFEED_WORKER_HEAP", setting)  # the workers inherit it
    ds = Dataset(store_dir, "global", batch_size=8, decode=heap_kept_here)
    with Loader(ds, num_workers=2) as loader:
        seen = [item for batch in loader for item in zip(*batch, strict=True)]
    assert sorted(int(n) for n, _ in seen) == list(range(N))  # every sample once
    assert {bool(kept) for _, kept in seen} == {GLIBC and setting == ""}
    assert workerheap._kept_in != os.getpid()  # the training process is left as it was


# Frees 48 MiB of 64 KiB blocks (each touched: bytes() are zeroed) and prints how much of it
# the process still holds afterwards. The list is made first, so that it does not sit on the
# heap's top above the blocks.
_FREE_AND_MEASURE = textwrap.dedent(
    """
    import os, sys
    from tierfeed.torch.workerheap import keep_worker_heap
    if sys.argv[1] == "keep":
        assert keep_worker_heap()
    page = os.sysconf("SC_PAGE_SIZE")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page
    blocks = [None] * 768
    for i in range(len(blocks)):
        blocks[i] = bytes(64 * 1024)
    held = rss()
    for i in range(len(blocks)):
        blocks[i] = None
    print((held - rss()) / 2**20)
    """
)


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's malloc's")
@pytest.mark.timeout(60)
def test_a_worker_that_keeps_its_heap_holds_on_to_what_it_freed(tmp_path: Path) -> None:
    def given_back(mode: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", _FREE_AND_MEASURE, mode],
            capture_output=True, text=True, timeout=50, env=untuned(), check=True,
        )  # fmt: skip
        return float(done.stdout)

    assert given_back("default") > 16  # glibc's rule: most of the 48 MiB went back
    assert given_back("keep") < 4  # kept for the next batch's reads
