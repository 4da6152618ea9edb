"""The local copy of a URL store's index, attacked through its cache directory (issue 44): the
disk tier's directory (or the user's cache) below a directory another user can write, swapped
for a link to that user's directory right after tierfeed checked it and back before the next
check; links and another user's files planted at `.index`, at the copy's folder and name, at
the fetch lock; and the index stamps and their lock.

The swap is made deterministic: a hook runs right after each check of the directory
(`tierfeed.cachedir.open_cache_dir`) and has a real second user (`nobody`, in a child process)
exchange the directory with its link (``renameat2(RENAME_EXCHANGE)``), as an inotify watcher
would. The victim (this process, root) must then read the true index or refuse with a
ConfigError naming the path: never the forged one (labels flipped, checksums recomputed).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt
import pytest

from tests.hostile import indexedit as ie
from tests.hostile.conftest import NOBODY
from tierfeed import cachedir
from tierfeed.errors import ConfigError
from tierfeed.format import index as index_module
from tierfeed.format import indexstamp
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.synthindex import synthetic_index
from tierfeed.loader import compose
from tierfeed.loader.compose import StoreOpener, TierConfig, open_store

pytestmark = pytest.mark.timeout(60)

FILES = {f"c{i % 2}/f{i:03d}.bin".encode(): bytes([i % 251]) * (300 + 17 * i) for i in range(40)}
_roots = itertools.count()

# The second user: runs as `nobody`, does what it is told line by line, answers each.
ATTACKER = r"""
import ctypes, json, os, sys
os.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
def exchange(a, b):  # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)
for line in sys.stdin:
    op, *args = json.loads(line)
    try:
        if op == "plant":  # a file of its own, with its folders
            os.makedirs(os.path.dirname(args[0]), exist_ok=True)
            with open(args[0], "wb") as f:
                f.write(bytes.fromhex(args[1]))
        elif op == "link":
            os.makedirs(os.path.dirname(args[0]), exist_ok=True)
            os.symlink(args[1], args[0])
        elif op == "exchange":
            exchange(args[0], args[1])
        print("ok", flush=True)
    except OSError as exc:
        print(f"error {exc}", flush=True)
"""


class Attacker:
    """User `nobody` in a child process, acting on paths it may change."""

    def __init__(self) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-c", ATTACKER, str(NOBODY)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
        )  # fmt: skip

    def do(self, op: str, *args: str) -> None:
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(json.dumps([op, *args]) + "\n")
        self.child.stdin.flush()
        answer = self.child.stdout.readline().strip()
        assert answer == "ok", f"the attacker could not {op} {args}: {answer}"

    def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(10)


class Swapper:
    """Exchanges ``victim`` (a directory of the victim's in the scratch directory) with a link
    to the attacker's ``evil`` directory right after each check of it, or of a directory
    below it, and back right before the next check: what an attacker watching the directory
    does at the worst moments."""

    def __init__(self, attacker: Attacker, victim: Path, evil: Path) -> None:
        self.attacker, self.victim = attacker, victim
        self.link = victim.with_name(victim.name + ".link")
        attacker.do("link", str(self.link), str(evil))
        self.swapped = False
        self.swaps = 0

    def exchange(self) -> None:
        self.attacker.do("exchange", str(self.victim), str(self.link))
        self.swapped = not self.swapped
        self.swaps += self.swapped

    def restore(self) -> None:
        if self.swapped:
            self.exchange()

    def hook(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = cachedir.open_cache_dir

        def checked(path: str | os.PathLike[str], *args: Any, **kw: Any) -> int:
            self.restore()
            fd = real(path, *args, **kw)
            where = Path(path).absolute()
            if where == self.victim or self.victim in where.parents:
                self.exchange()
            return fd

        monkeypatch.setattr(cachedir, "open_cache_dir", checked)


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as user nobody")
    acting = Attacker()
    try:
        yield acting
    finally:
        acting.close()


@pytest.fixture
def local(packed: Callable[..., Path]) -> Path:
    return packed(FILES)


@pytest.fixture
def url(local: Path) -> Iterator[str]:
    """The store, at a URL (fsspec's in-memory file system: the same fetch as an S3 store)."""
    fs = fsspec.filesystem("memory")
    root = f"/race-{os.getpid()}-{next(_roots)}"
    for path in local.rglob("*"):
        if path.is_file():
            fs.pipe_file(f"{root}/{path.relative_to(local)}", path.read_bytes())
    try:
        yield f"memory:/{root}"
    finally:
        fs.rm(root, recursive=True)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def true_labels(local: Path) -> npt.NDArray[np.int32]:
    with Index(local) as index:
        return index.sample_label.copy()


def forged(local: Path) -> bytes:
    """The store's index with every label flipped and every checksum recomputed: an index
    that opens and passes every check."""
    raw = (local / INDEX_NAME).read_bytes()
    made = ie.edit_array(raw, "sample_label", lambda labels: 1 - labels)
    assert len(made) == len(raw)  # the size the cache checks against the store's
    return made


def labels_read(read: Callable[[], npt.NDArray[np.int32]]) -> npt.NDArray[np.int32] | ConfigError:
    try:
        return read()
    except ConfigError as exc:
        return exc


def labels_of(opener: StoreOpener) -> npt.NDArray[np.int32]:
    with opener.index() as index:
        return index.sample_label.copy()


def assert_true_or_refused(
    seen: npt.NDArray[np.int32] | ConfigError, truth: npt.NDArray[np.int32], path: Path
) -> None:
    if isinstance(seen, ConfigError):
        assert str(path) in str(seen), seen
    else:
        assert np.array_equal(seen, truth), "the victim read the forged index"


def cached_copy(under: Path) -> Path:
    (copy,) = under.rglob(f"*-{INDEX_NAME}")
    return copy


def opener_caching_in(
    victim: Path, url: str, cache: str, monkeypatch: pytest.MonkeyPatch
) -> StoreOpener:
    """An opener of ``url`` whose index cache lies in ``victim``: the user's cache
    (``cache == "default"``) or a disk tier's."""
    if cache == "default":
        monkeypatch.setenv("TIERFEED_CACHE", str(victim))
        return StoreOpener(url)
    return StoreOpener(url, TierConfig(disk_dir=str(victim), disk_bytes=2**24))


def forge_beside(attacker: Attacker, victim: Path, evil: Path, local: Path) -> None:
    """The forged index in the attacker's ``evil``, where the victim's copy is in ``victim``."""
    relative = cached_copy(victim).relative_to(victim)
    attacker.do("plant", str(evil / relative), forged(local).hex())


# --- the directory swapped after its check ------------------------------------------------


@pytest.mark.parametrize("cache", ["disk-tier", "default"])
def test_a_cache_directory_swapped_after_its_check_never_serves_a_forged_index(
    attacker: Attacker,
    nobody_dir: Path,
    local: Path,
    url: str,
    cache: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Failed before: the copy was stat'ed, opened and mapped by path after the directory's
    # check, through the link swapped in: the Dataset planned with the forged labels.
    victim = nobody_dir / "cache"
    opener = opener_caching_in(victim, url, cache, monkeypatch)
    truth = true_labels(local)
    opener.index().close()  # the victim's own copy, fetched before the attack
    evil = nobody_dir / "evil"
    forge_beside(attacker, victim, evil, local)
    swapper = Swapper(attacker, victim, evil)
    swapper.hook(monkeypatch)
    try:
        seen = labels_read(lambda: labels_of(opener))
    finally:
        swapper.restore()
    assert swapper.swaps >= 1  # the attack happened
    assert_true_or_refused(seen, truth, victim)


def test_open_store_over_a_disk_tier_swapped_and_back_reads_the_true_index(
    attacker: Attacker, nobody_dir: Path, local: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Failed before: open_store read the forged index, and the disk tier, opened after the
    # directory was swapped back, found nothing wrong.
    victim = nobody_dir / "disk"
    tiers = TierConfig(disk_dir=str(victim), disk_bytes=2**24)
    truth = true_labels(local)
    open_store(url, tiers).close()
    evil = nobody_dir / "evil"
    forge_beside(attacker, victim, evil, local)
    swapper = Swapper(attacker, victim, evil)
    swapper.hook(monkeypatch)
    real_stack = compose.tier_stack

    def stack_after_the_swap_back(*args: Any, **kw: Any) -> Any:
        swapper.restore()  # the index is read: the attacker covers its tracks
        return real_stack(*args, **kw)

    monkeypatch.setattr(compose, "tier_stack", stack_after_the_swap_back)

    def read() -> npt.NDArray[np.int32]:
        with open_store(url, tiers) as store:
            return store.index.sample_label.copy()

    try:
        seen = labels_read(read)
    finally:
        swapper.restore()
    assert swapper.swaps >= 1
    assert_true_or_refused(seen, truth, victim)


# --- another user's links and files planted in the cache ----------------------------------


def chown_all(path: Path) -> None:
    for each in (path, *(path.rglob("*") if path.is_dir() else ())):
        os.lchown(each, NOBODY, NOBODY)


@pytest.mark.parametrize("what", ["link", "foreign"])
@pytest.mark.parametrize("at", ["index-dir", "folder", "copy"])
@pytest.mark.parametrize("cache", ["disk-tier", "default"])
def test_a_link_or_another_users_entry_in_the_index_cache_is_refused(
    nobody_dir: Path,
    local: Path,
    url: str,
    cache: str,
    at: str,
    what: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Failed before: each was followed or used: the forged index was read.
    if os.geteuid() != 0:
        pytest.skip("needs root to make files of user nobody")
    victim = nobody_dir / "victim"
    opener = opener_caching_in(victim, url, cache, monkeypatch)
    opener.index().close()
    copy = cached_copy(victim)  # <cache>/.index (or index)/<url's folder>/<copy>
    where = {"index-dir": copy.parent.parent, "folder": copy.parent, "copy": copy}[at]
    if what == "link":
        target = nobody_dir / "evil" / where.name
        (target / copy.relative_to(where)).parent.mkdir(parents=True, exist_ok=True)
        (target / copy.relative_to(where)).write_bytes(forged(local))
        plant_link(where, target)
    else:
        plant_foreign(where, copy, forged(local))
    with pytest.raises(ConfigError) as err:
        opener.index().close()
    message = str(err.value)
    assert str(where) in message and "remove it" in message and "\n" not in message


def plant_link(where: Path, target: Path) -> None:
    remove(where)
    chown_all(target)
    where.symlink_to(target)
    os.lchown(where, NOBODY, NOBODY)


def plant_foreign(where: Path, copy: Path, data: bytes) -> None:
    """``where`` (the copy, or a folder above it) and everything in it nobody's, the copy
    forged."""
    copy.write_bytes(data)
    chown_all(where)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@pytest.mark.parametrize("what", ["link", "foreign"])
def test_a_link_or_another_users_file_at_the_fetch_lock_is_refused(
    nobody_dir: Path, url: str, what: str
) -> None:
    # Failed before: the lock was created through the link (a file made where the other
    # user chose) or another user's lock file was used (which it can hold for ever).
    if os.geteuid() != 0:
        pytest.skip("needs root to make files of user nobody")
    victim = nobody_dir / "disk"
    opener = StoreOpener(url, TierConfig(disk_dir=str(victim), disk_bytes=2**24))
    opener.index().close()
    copy = cached_copy(victim)
    copy.unlink()  # fetched again: under the lock
    lock = copy.parent / ".lock"
    lock.unlink()
    made_by_victim = nobody_dir / "made-by-the-victim"
    if what == "link":
        lock.symlink_to(made_by_victim)
        os.lchown(lock, NOBODY, NOBODY)
    else:
        lock.write_bytes(b"")
        os.chown(lock, NOBODY, NOBODY)
    with pytest.raises(ConfigError) as err:
        opener.index().close()
    assert str(lock) in str(err.value) and "remove it" in str(err.value)
    assert not made_by_victim.exists() and not made_by_victim.is_symlink()


# --- the stamps ---------------------------------------------------------------------------


@pytest.fixture
def stamping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every index is stamped (threshold 0)."""
    monkeypatch.setattr(indexstamp, "STAMP_ABOVE_BYTES", 0)
    monkeypatch.setattr(index_module, "STAMP_ABOVE_BYTES", 0)


def test_a_cache_swapped_after_its_check_gets_no_stamp_written_through_it(
    attacker: Attacker,
    nobody_dir: Path,
    tmp_path: Path,
    stamping: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Failed before: the stamp was written by path after the check, through the swapped-in
    # link, to a temporary name the other user had made a link to the victim's file: that
    # file was overwritten.
    victim = nobody_dir / "cache"
    monkeypatch.setenv("TIERFEED_CACHE", str(victim))
    path = tmp_path / INDEX_NAME
    synthetic_index(path, 500)
    precious = tmp_path / "precious"
    precious.write_bytes(b"the victim's own file")
    name = indexstamp._stamp_name(path.absolute(), path.stat())
    evil = nobody_dir / "evil"
    temporary = evil / "checked" / f".tmp.{os.getpid()}.{name}.json"
    attacker.do("link", str(temporary), str(precious))
    Index(path).close()  # the victim's cache and its stamp
    for stamp in (victim / "checked").iterdir():
        stamp.unlink()  # to be stamped again, under attack
    swapper = Swapper(attacker, victim, evil)
    swapper.hook(monkeypatch)
    try:
        Index(path).close()
    except ConfigError as exc:  # refusing is fine too; writing through the link is not
        assert str(victim) in str(exc)
    finally:
        swapper.restore()
    assert swapper.swaps >= 1
    assert precious.read_bytes() == b"the victim's own file"


def test_another_users_checker_lock_is_not_waited_for(
    tmp_path: Path, own_cache: Path, stamping: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Failed before: a lock file of another user's in the victim's `checking` folder was
    # locked and waited for, as long as that user held it (up to CHECKER_WAIT_S).
    if os.geteuid() != 0:
        pytest.skip("needs root to make files of user nobody")
    path = tmp_path / INDEX_NAME
    synthetic_index(path, 500)
    name = indexstamp._stamp_name(path.absolute(), path.stat())
    lock = own_cache / "checking" / f"{name}.lock"
    lock.parent.mkdir(parents=True)
    lock.write_bytes(b"")
    os.chown(lock, NOBODY, NOBODY)
    monkeypatch.setattr(indexstamp, "CHECKER_WAIT_S", 20.0)
    with lock.open("rb") as held:  # held by its owner, for ever
        fcntl.flock(held, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with Index(path) as index:
            assert index.checked_here
        assert time.monotonic() - t0 < 10
