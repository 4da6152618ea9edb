"""Parts of split chunks (issue 18) against a full disk, stray files and a second user."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.distributed.ranks import make_store
from tests.distributed.test_parts import ONE, holdings_of, namespace_store, payload
from tierfeed.distributed import stage
from tierfeed.distributed.inbox import parts_dir
from tierfeed.publish import is_temporary

pytestmark = pytest.mark.timeout(60)


def assert_part_served(store: Path, local_dir: Path, sample: int) -> None:
    """Rank 1's namespace serves ``sample`` of a part it staged, with the right bytes."""
    with namespace_store(local_dir, holdings_of(store, "local"), 1) as s:
        assert next(iter(s.read_sample(sample).fields.values())) == payload(sample)


def test_a_full_disk_while_copying_a_part_leaves_nothing_served(
    tmp_path: Path, tmpfs: Callable[..., Path]
) -> None:
    store = make_store(tmp_path, 61)
    disk = tmpfs("local", "size=1m")
    first = stage(store, disk / "node{node}", "local", world=ONE, progress=False)
    part = holdings_of(store, "local").parts_of(1)[0]
    where = parts_dir(first.local_dir, 1)
    for p in where.iterdir():
        p.unlink()
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # fill the disk to the last block
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    with pytest.raises(OSError) as caught:
        stage(store, disk / "node{node}", "local", world=ONE, progress=False)
    assert caught.value.errno == errno.ENOSPC
    assert not [p for p in where.iterdir() if is_temporary(p.name)]  # no half part left
    assert not list(where.glob("*.idx"))  # and no table: nothing is served from it
    filler.unlink()
    again = stage(store, disk / "node{node}", "local", world=ONE, progress=False)
    assert again.parts_copied >= 1 and again.chunks_copied == 0
    assert_part_served(store, first.local_dir, part.first)


def test_stray_files_in_the_parts_directory_are_left_alone(tmp_path: Path) -> None:
    store = make_store(tmp_path, 61)
    first = stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    where = parts_dir(first.local_dir, 1)
    (where / "notes.txt").write_text("a user's file")
    (where / ".tmp.999999999.chunk2.bin").write_bytes(b"\0" * 10)  # a dead writer's temporary
    (where / "chunk77.bin").write_bytes(b"no table: never read")
    again = stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    assert again.parts_copied == 0 and again.parts_present == 2
    assert (where / "notes.txt").read_text() == "a user's file"
    assert_part_served(store, first.local_dir, holdings_of(store, "local").parts_of(1)[0].first)


def test_parts_are_the_rank_owners_alone(tmp_path: Path) -> None:
    """A second user on the node can neither read nor replace a rank's parts."""
    store = make_store(tmp_path, 61)
    first = stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    where = parts_dir(first.local_dir, 1)
    assert stat.S_IMODE(where.stat().st_mode) & 0o077 == 0  # the rank's own: 0700
    assert stat.S_IMODE(where.parent.stat().st_mode) & 0o022 == 0  # nobody else writes there
    assert all(p.stat().st_uid == os.geteuid() for p in where.iterdir())


def test_clean_up_never_deletes_outside_the_local_directory(tmp_path: Path) -> None:
    """`Scheduler.clean_local_storage` removes the chunks a rank staged by their names in the
    index: a crafted name that climbs out of the local directory is refused, and the file it
    names is left alone."""
    from types import SimpleNamespace

    import numpy as np

    from tests.hostile import indexedit as ie
    from tierfeed.distributed.pls import Scheduler
    from tierfeed.errors import IndexFormatError
    from tierfeed.format.index import Index
    from tierfeed.format.layout import INDEX_NAME

    store = make_store(tmp_path, 20)
    raw = (store / INDEX_NAME).read_bytes()

    def climb(a: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
        a[:17] = np.frombuffer(b"../../../victim.x", dtype=np.uint8)  # chunk 0's name
        return a

    crafted = ie.store_with_index(
        tmp_path / "crafted", store, ie.edit_array(raw, "chunk_names", climb)
    )
    local = tmp_path / "a" / "b" / "c"
    local.mkdir(parents=True)
    victim = tmp_path / "victim.x"  # what local/../../../victim.x names
    victim.write_text("a user's file")
    with Index(crafted) as index:
        rank = SimpleNamespace(
            namespace=SimpleNamespace(
                local_dir=local,
                holdings=SimpleNamespace(staged_by=lambda rank: np.array([0])),
                world=SimpleNamespace(rank=0),
            ),
            store=SimpleNamespace(index=index),
            close=lambda: None,
        )
        with pytest.raises(IndexFormatError, match="outside the store"):
            Scheduler.clean_local_storage(rank)  # type: ignore[arg-type]
    assert victim.read_text() == "a user's file"
