"""A cache directory another local user prepared: a symlink to the victim's directory, a
directory of their own, a path swapped after the check, the per-user default taken first,
links planted in a cache shared on purpose; and the rules for one's own directories (never
chmodded, not writable by others, a shared one sticky, one that cannot be written refused).

The attacker is a second real uid (`useradd`, as root; skipped otherwise). The victim is this
process (root) or, where root's powers would hide the failure, user `nobody` in a child.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.hostile.conftest import NOBODY
from tierfeed.config import default_cache_dir
from tierfeed.errors import ConfigError
from tierfeed.format.index import Index
from tierfeed.storage import PosixDriver, TierStack, disk_tier
from tierfeed.storage.store import Store
from tierfeed.storage.tiers import cache_key

FILES = {f"c{i % 2}/s{i:03d}.bin".encode(): bytes([i % 251]) * (500 + 31 * i) for i in range(40)}
ATTACKER = "tierfeed-other-cd"


@pytest.fixture(scope="module")
def attacker() -> int:
    """The uid of a second local user (created once, idempotently)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user (useradd) and act as it")
    done = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode not in (0, 9):  # 9: the user exists already
        pytest.skip(f"cannot create a second user: {done.stderr.strip()}")
    uid = subprocess.run(["id", "-u", ATTACKER], capture_output=True, text=True, timeout=30)
    return int(uid.stdout)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A fresh directory like /tmp (mode 1777) that every user can reach."""
    path = Path(tempfile.mkdtemp(prefix="tierfeed-cachedir-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False, timeout=60)


@pytest.fixture
def store_dir(packed: Callable[..., Path]) -> Path:
    return packed(FILES)


def read_through(store_dir: Path, cache: Path) -> None:
    """Read every sample through a tier stack with a disk tier in ``cache``."""
    index = Index(store_dir)
    origin = PosixDriver(store_dir, read_only=True)
    with Store(index, TierStack(index.chunks(), origin, [disk_tier(cache, 2**30)])) as store:
        for s in range(len(store)):
            store.read_sample(s)
        store.source.drain()  # type: ignore[attr-defined]


def victims_dir(parent: Path) -> Path:
    """A directory of the victim's (root's), open to reading, with nothing in it."""
    mine = parent / "victims-own"
    mine.mkdir()
    mine.chmod(0o755)
    return mine


def one_line(err: pytest.ExceptionInfo[BaseException], *parts: str) -> None:
    message = str(err.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


@pytest.mark.timeout(60)
def test_a_symlink_planted_at_the_cache_path_is_refused(
    attacker: int, shared_tmp: Path, store_dir: Path
) -> None:
    # Failed before: the tier followed the link, made the victim's directory 0700 and wrote
    # its chunks there.
    mine = victims_dir(shared_tmp)
    planted = shared_tmp / "job-cache"
    planted.symlink_to(mine)
    os.lchown(planted, attacker, attacker)
    with pytest.raises(ConfigError) as err:
        read_through(store_dir, planted)
    one_line(err, str(planted), "symbolic link", "remove it")
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755
    assert list(mine.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_directory_another_user_made_at_the_cache_path_is_refused(
    attacker: int, shared_tmp: Path, store_dir: Path
) -> None:
    # Failed before: root, seeing a 0700 directory, used it (the owner was checked only for a
    # directory open to others) and wrote its chunks into the attacker's directory.
    theirs = shared_tmp / "job-cache"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, attacker, attacker)
    for shared in (False, True):
        with pytest.raises(ConfigError) as err:
            disk_tier(theirs, 2**20, shared=shared)
        one_line(err, str(theirs), f"uid {attacker}", "choose a directory you own")
    with pytest.raises(ConfigError):
        read_through(store_dir, theirs)
    assert list(theirs.iterdir()) == []
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o700


AS_VICTIM = """
import os, sys
from pathlib import Path
from tierfeed.format.index import Index
from tierfeed.storage import PosixDriver, TierStack, disk_tier
from tierfeed.errors import TierfeedError
store, cache, uid = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
os.setgid(uid); os.setuid(uid)
index = Index(store)
try:
    TierStack(index.chunks(), PosixDriver(store, read_only=True), [disk_tier(cache, 2**30)])
except TierfeedError as exc:
    print(type(exc).__name__, exc)
    sys.exit(1)
"""


@pytest.mark.timeout(60)
def test_a_users_job_refuses_another_users_private_directory_in_one_line(
    attacker: int, shared_tmp: Path, packed: Callable[..., Path]
) -> None:
    # Failed before: the job died with a PermissionError traceback from landing.py.
    store = packed(FILES)
    public = shared_tmp / "store"
    subprocess.run(["cp", "-r", str(store), str(public)], check=True, timeout=30)
    subprocess.run(["chmod", "-R", "a+rX", str(public)], check=True, timeout=30)
    theirs = shared_tmp / "job-cache"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, attacker, attacker)
    done = subprocess.run(
        [sys.executable, "-c", AS_VICTIM, str(public), str(theirs), str(NOBODY)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("ConfigError "), done.stdout
    assert done.stdout.count("\n") == 1 and str(theirs) in done.stdout
    assert list(theirs.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_cache_path_swapped_after_the_check_gets_no_writes(
    attacker: int, shared_tmp: Path, store_dir: Path
) -> None:
    # Failed before: every write named the path, so after the swap the chunks went through
    # the link into the victim's directory.
    mine = victims_dir(shared_tmp)
    cache = shared_tmp / "job-cache"
    index = Index(store_dir)
    origin = PosixDriver(store_dir, read_only=True)
    stack = TierStack(index.chunks(), origin, [disk_tier(cache, 2**30)])
    with Store(index, stack) as store:
        moved = shared_tmp / "moved-away"
        cache.rename(moved)
        cache.symlink_to(mine)
        os.lchown(cache, attacker, attacker)
        for s in range(len(store)):
            assert store.read_sample(s).fields["bin"] == FILES[store.index.key_bytes(s) + b".bin"]
        stack.drain()
    assert list(mine.iterdir()) == []
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755
    assert len(list(moved.glob("*.tar"))) == len(index.chunks())


@pytest.mark.timeout(60)
def test_the_default_cache_under_tmp_taken_first_by_another_user_is_refused(
    attacker: int, shared_tmp: Path
) -> None:
    # Failed before: with no usable home the default was still ~/.cache/tierfeed, and no
    # directory under /tmp was made or checked.
    home = shared_tmp / "home-that-is-a-file"  # unusable even for root
    home.write_bytes(b"")
    env = {"HOME": str(home), "TMPDIR": str(shared_tmp)}
    fallback = shared_tmp / f"tierfeed-{os.getuid()}"
    assert default_cache_dir(env) == fallback
    assert stat.S_IMODE(fallback.stat().st_mode) == 0o700 and fallback.stat().st_uid == 0
    fallback.rmdir()
    fallback.mkdir(mode=0o700)
    os.chown(fallback, attacker, attacker)
    with pytest.raises(ConfigError) as err:
        default_cache_dir(env)
    one_line(err, str(fallback), f"uid {attacker}")
    fallback.rmdir()
    fallback.symlink_to(victims_dir(shared_tmp))
    with pytest.raises(ConfigError) as err:
        default_cache_dir(env)
    one_line(err, str(fallback), "symbolic link")


@pytest.mark.timeout(60)
def test_a_directory_of_ones_own_is_never_chmodded(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    mine.chmod(0o755)
    tier = disk_tier(mine, 2**20)
    tier.driver.write("x.tar", b"x")
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755
    assert stat.S_IMODE((mine / "x.tar").stat().st_mode) == 0o600
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(ConfigError) as err:
        disk_tier(open_to_all, 2**20)
    one_line(err, str(open_to_all), "0777")
    assert stat.S_IMODE(open_to_all.stat().st_mode) == 0o777
    made = tmp_path / "made" / "here"
    disk_tier(made, 2**20)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


@pytest.mark.timeout(60)
def test_stage_in_and_the_index_cache_refuse_a_planted_link(
    attacker: int, shared_tmp: Path, store_dir: Path
) -> None:
    # Failed before: stage-in copied its chunks and index through the link, an inbox was made
    # in the victim's directory, and the index cache beside a disk tier followed it too.
    from tierfeed.distributed.inbox import Inbox
    from tierfeed.distributed.staging import stage
    from tierfeed.loader.compose import TierConfig

    mine = victims_dir(shared_tmp)
    planted = shared_tmp / "node-local"
    planted.symlink_to(mine)
    os.lchown(planted, attacker, attacker)
    with pytest.raises(ConfigError) as err:
        stage(store_dir, planted, progress=False)
    one_line(err, str(planted), "symbolic link")
    with pytest.raises(ConfigError):
        Inbox(planted)
    with pytest.raises(ConfigError):
        TierConfig(disk_dir=str(planted), disk_bytes=2**20).index_cache()
    assert list(mine.iterdir()) == []
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755


@pytest.mark.timeout(60)
def test_links_planted_in_a_shared_sticky_cache_are_not_followed(
    attacker: int, shared_tmp: Path, store_dir: Path
) -> None:
    # Failed before: in a cache shared on purpose (sticky, writable by all), another user's
    # `.landing`, `.claims` and `.verified` links were followed: the victim's files of the
    # names arrivals, claims and marks take were removed or overwritten.
    mine = victims_dir(shared_tmp)
    index = Index(store_dir)
    victims = {}
    for info in index.chunks():
        key = f"{info.id:08d}-{info.checksum:016x}"
        for name in (key, f"{key}.map", cache_key(info)):
            victims[name] = f"the victim's {name}".encode()
            (mine / name).write_bytes(victims[name])
    cache = shared_tmp / "shared-cache"
    cache.mkdir()
    cache.chmod(0o1777)
    for name in (".landing", ".claims", ".verified"):
        (cache / name).symlink_to(mine)
        os.lchown(cache / name, attacker, attacker)
    origin = PosixDriver(store_dir, read_only=True)
    stack = TierStack(index.chunks(), origin, [disk_tier(cache, 2**30, shared=True)])
    with Store(index, stack) as store:
        for s in range(len(store)):
            assert store.read_sample(s).fields["bin"] == FILES[store.index.key_bytes(s) + b".bin"]
        stack.drain()
        # Its copies cannot land (the link is refused): counted, and read from the origin.
        assert stack.stats()[stack.tiers[0].name]["copy_failures"] >= 1
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == victims
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755
    assert stat.S_IMODE(cache.stat().st_mode) == 0o1777  # not chmodded either


@pytest.mark.timeout(60)
def test_shared_caches_must_be_sticky_where_others_may_write(tmp_path: Path) -> None:
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(ConfigError) as err:
        disk_tier(open_to_all, 2**20, shared=True)
    one_line(err, str(open_to_all), "0777", "sticky")
    open_to_all.chmod(0o1777)
    disk_tier(open_to_all, 2**20, shared=True).driver.write("x.tar", b"x")
    assert stat.S_IMODE((open_to_all / "x.tar").stat().st_mode) == 0o644
    with pytest.raises(ConfigError):  # sticky is not enough for a private cache
        disk_tier(open_to_all, 2**20)


@pytest.mark.timeout(60)
def test_a_dataset_over_another_users_disk_dir_fails_in_the_main_process(
    attacker: int, shared_tmp: Path, store_dir: Path
) -> None:
    # Failed before: nothing was refused (root wrote into the attacker's directory); for
    # another user, the error came from the workers' TierStack.
    from tierfeed.loader.compose import TierConfig
    from tierfeed.torch.dataset import Dataset

    theirs = shared_tmp / "job-cache"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, attacker, attacker)
    tiers = TierConfig(disk_dir=str(theirs), disk_bytes=2**30)
    with pytest.raises(ConfigError) as err:
        Dataset(store_dir, batch_size=4, tiers=tiers)
    one_line(err, str(theirs), f"uid {attacker}")
    assert list(theirs.iterdir()) == []


@pytest.mark.timeout(60)
def test_the_cli_says_it_in_one_line(
    attacker: int, shared_tmp: Path, store_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tierfeed.cli import main

    mine = victims_dir(shared_tmp)
    planted = shared_tmp / "node-local"
    planted.symlink_to(mine)
    os.lchown(planted, attacker, attacker)
    assert main(["stage", str(store_dir), "--to", str(planted), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tierfeed stage: error: "), err
    assert str(planted) in err and "symbolic link" in err and "Traceback" not in err
    assert list(mine.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_read_only_home_falls_back_to_the_uids_directory_under_tmp(
    tmpfs: Callable[..., Path], tmp_path: Path
) -> None:
    home = tmpfs("home", "size=64k", "mode=0700")
    (home / ".cache" / "tierfeed").mkdir(parents=True, mode=0o700)  # from an earlier run
    done = subprocess.run(["mount", "-o", "remount,ro", str(home)], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {"HOME": str(home), "TMPDIR": str(scratch)}
    assert default_cache_dir(env) == scratch / f"tierfeed-{os.geteuid()}"


AS_NOBODY = """
import os, sys
from tierfeed.storage import disk_tier
from tierfeed.errors import TierfeedError
os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2]))
try:
    disk_tier(sys.argv[1], 2**20, shared=True).driver.write("x.tar", b"x")
except TierfeedError as exc:
    print(type(exc).__name__, exc)
    sys.exit(1)
"""


@pytest.mark.timeout(60)
def test_a_shared_cache_of_roots_is_used_if_sticky_and_refused_in_one_line_if_not_writable(
    shared_tmp: Path,
) -> None:
    # Failed before: the root-owned 0755 directory was taken, and the first write failed
    # later, as a copy failure, far from the configuration that caused it.
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as user nobody")

    def as_nobody(cache: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", AS_NOBODY, str(cache), str(NOBODY)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
        )

    sticky = shared_tmp / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    done = as_nobody(sticky)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (sticky / "x.tar").stat().st_uid == NOBODY
    closed = shared_tmp / "closed"
    closed.mkdir()
    closed.chmod(0o755)
    done = as_nobody(closed)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("StorageError ") and done.stdout.count("\n") == 1
    assert str(closed) in done.stdout and "not writable" in done.stdout
