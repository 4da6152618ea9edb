"""`pack` keeps a private source private (issue 44).

A chunk grants its group and others no more than the widest member it holds grants them
(read only, and only where every directory above the member lets them through); the index,
which names every file, no more than the widest member of the store. The packer keeps read
and write on what it wrote.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.conftest import write_tree
from tests.hostile.conftest import NOBODY
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import PackOptions, pack
from tierfeed.format.packplan import PackPlan, plan_pack
from tierfeed.format.source import SourceTree

# One sample per chunk (each file is bigger than half a chunk), so that each chunk's mode
# is one member's.
OPTIONS = PackOptions(chunk_size=8192, workers=2, progress=False)
BODY = b"z" * 5000

# A child that becomes nobody and opens one file, printing OK or the errno name.
OPEN_AS = """
import errno, os, sys
os.setgid(int(sys.argv[1])); os.setgroups([]); os.setuid(int(sys.argv[1]))
try:
    os.close(os.open(sys.argv[2], os.O_RDONLY))
    print("OK")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def make_tree(src: Path, modes: dict[str, int]) -> None:
    """Files (one chunk's worth each) and directories with the given modes; umask 022."""
    write_tree(src, {os.fsencode(rel): BODY for rel in modes if rel.endswith(".bin")})
    for rel, mode in sorted(modes.items(), key=lambda kv: -kv[0].count("/")):
        (src / rel).chmod(mode)


def chunk_of(store: Path, rel: bytes) -> Path:
    index = Index(store)
    try:
        member = index.find_member(rel)
        assert member is not None
        return store / index.chunks()[int(index.member_chunk[member])].name
    finally:
        index.close()


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield None
    os.umask(old)


def test_private_tree_gives_private_store(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {"a/x.bin": 0o600, "a/y.bin": 0o600, "b/z.bin": 0o600})
    pack(tmp_path / "src", tmp_path / "store", OPTIONS)
    chunks = sorted((tmp_path / "store" / "chunks").iterdir())
    assert len(chunks) == 3
    assert [mode_of(c) for c in chunks] == [0o600] * 3
    assert mode_of(tmp_path / "store" / INDEX_NAME) == 0o600


def test_mixed_tree_widens_only_what_it_must(tmp_path: Path) -> None:
    modes = {
        "a/own.bin": 0o600,
        "a/pub.bin": 0o644,
        "a/grp.bin": 0o640,
        "a/rw.bin": 0o666,  # writable by all in the source: the chunk is never writable by others
        "hid": 0o700,
        "hid/pub.bin": 0o644,  # readable, but no one else reaches it in the source
    }
    make_tree(tmp_path / "src", modes)
    store = tmp_path / "store"
    pack(tmp_path / "src", store, OPTIONS)
    assert mode_of(chunk_of(store, b"a/own.bin")) == 0o600
    assert mode_of(chunk_of(store, b"a/pub.bin")) == 0o644
    assert mode_of(chunk_of(store, b"a/grp.bin")) == 0o640
    assert mode_of(chunk_of(store, b"a/rw.bin")) == 0o644
    assert mode_of(chunk_of(store, b"hid/pub.bin")) == 0o600
    assert mode_of(store / INDEX_NAME) == 0o644  # as wide as the widest member, no wider


def test_shared_chunk_is_as_wide_as_its_widest_member(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {"a/x.bin": 0o600, "a/y.bin": 0o604})
    store = tmp_path / "store"
    pack(tmp_path / "src", store, PackOptions(chunk_size=64 * 1024, progress=False))
    assert chunk_of(store, b"a/x.bin") == chunk_of(store, b"a/y.bin")
    assert mode_of(chunk_of(store, b"a/x.bin")) == 0o604


@pytest.mark.timeout(60)
def test_other_user_cannot_open_private_store(nobody_dir: Path) -> None:
    # The store in a directory nobody may enter: only the files' own modes stand in the way.
    src = nobody_dir / "src"
    make_tree(src, {"a/x.bin": 0o600, "a/y.bin": 0o600, "a": 0o700})
    store = nobody_dir / "store"
    pack(src, store, OPTIONS)
    opened = [
        subprocess.run(
            [sys.executable, "-I", "-c", OPEN_AS, str(NOBODY), str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        for path in (store / INDEX_NAME, chunk_of(store, b"a/x.bin"), store / "chunks")
    ]
    assert all(done.returncode == 0 for done in opened), [d.stderr for d in opened]
    results = [done.stdout.strip() for done in opened]
    eacces = errno.errorcode[errno.EACCES]
    assert results == [eacces, eacces, "OK"]  # the chunks directory lists only chunk numbers


def test_resumed_chunks_keep_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-run of an interrupted pack keeps a finished chunk only if its mode is the one the
    rule gives now: a directory closed since then narrows it (no file's own stat changed)."""
    import tierfeed.format.pack as packing

    src = tmp_path / "src"
    make_tree(src, {"a/x.bin": 0o644, "a/y.bin": 0o644})
    store = tmp_path / "store"

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(packing, "write_index", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pack(src, store, OPTIONS)
    assert [mode_of(c) for c in sorted((store / "chunks").iterdir())] == [0o644, 0o644]
    (src / "a").chmod(0o700)
    report = pack(src, store, OPTIONS)
    assert report.resumed_chunks == 0
    assert [mode_of(c) for c in sorted((store / "chunks").iterdir())] == [0o600, 0o600]
    assert mode_of(store / INDEX_NAME) == 0o600


@pytest.mark.timeout(60)
def test_skipped_member_does_not_widen_its_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 0644 file planned into a chunk with a 0600 one, gone when read (skipped): the chunk
    holds only the private file, and is as private as it."""
    import tierfeed.format.pack as packing

    src = tmp_path / "src"
    write_tree(src, {b"a/own.bin": b"o" * 100, b"a/pub.bin": b"p" * 100})
    (src / "a" / "own.bin").chmod(0o600)

    def plan_then_remove(tree: SourceTree, chunk_size: int) -> PackPlan:
        plan = plan_pack(tree, chunk_size)
        (src / "a" / "pub.bin").unlink()  # listed and planned, then gone when read
        return plan

    monkeypatch.setattr(packing, "plan_pack", plan_then_remove)
    store = tmp_path / "store"
    options = PackOptions(chunk_size=64 * 1024, progress=False, skip_unreadable=True)
    report = pack(src, store, options)
    assert [path for path, _ in report.skipped] == ["a/pub.bin"]
    assert mode_of(chunk_of(store, b"a/own.bin")) == 0o600
    assert mode_of(store / INDEX_NAME) == 0o600


@pytest.mark.parametrize(("modes", "want"), [((0o600, 0o600), 0o600), ((0o600, 0o640), 0o640)])
def test_an_index_of_shards_in_place_is_no_wider_than_the_shards(
    tmp_path: Path, modes: tuple[int, int], want: int
) -> None:
    import io
    import tarfile

    from tierfeed.format.shards import index_shards

    shards = []
    for i, mode in enumerate(modes):
        shard = tmp_path / f"shard-{i}.tar"
        with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
            info = tarfile.TarInfo(f"s{i}.txt")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
        shard.chmod(mode)
        shards.append(shard)
    report = index_shards(shards, tmp_path, progress=False)
    assert stat.S_IMODE(Path(report.index).stat().st_mode) == want  # was 0644, whatever they were
