"""The destination's lock: one writer at a time, and no lock file left in a finished store
(issue 46: `.tierfeed-pack.lock` stayed in every store a user packed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tierfeed
from tests.format.conftest import write_tree
from tierfeed.errors import PackError
from tierfeed.format import packstate
from tierfeed.format.pack import PackOptions, pack

pytestmark = pytest.mark.timeout(120)


def _files(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())


def _sample(i: int) -> dict[str, object]:
    return {"__key__": f"{i:04d}", "txt": f"sample {i}"}


def test_a_finished_store_holds_no_lock_file(tmp_path: Path) -> None:
    write_tree(tmp_path / "tree", {b"a/x.txt": b"x", b"b/y.txt": b"y"})
    pack(tmp_path / "tree", tmp_path / "packed", PackOptions(progress=False))
    with tierfeed.Writer(tmp_path / "written") as w:
        for i in range(3):
            w.write(_sample(i))
    tierfeed.optimize(_sample, list(range(3)), tmp_path / "optimized", workers=1)
    for store in ("packed", "written", "optimized"):
        files = _files(tmp_path / store)
        assert packstate.LOCK not in files, store
        assert files == ["chunks/000000.tar", "index.tfi"], (store, files)


def test_a_second_writer_is_refused_while_the_first_writes(tmp_path: Path) -> None:
    first = tierfeed.Writer(tmp_path / "st")
    with pytest.raises(PackError, match="another tierfeed writer"):
        tierfeed.Writer(tmp_path / "st", overwrite=True)
    first.abort()
    tierfeed.Writer(tmp_path / "st", overwrite=True).abort()  # free again once it is done


def test_a_lock_taken_on_the_file_the_last_writer_removed_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race: a writer opens the lock file, the writer before it removes that file as it
    # lets it go, and the first then locks a file no name leads to: a third writer would
    # lock a new file beside it, and two would write at once.
    opened = os.open
    raced: list[int] = []

    def removed_after_open(path: str, flags: int, mode: int = 0o777) -> int:
        fd = opened(path, flags, mode)
        if not raced:
            raced.append(fd)
            os.unlink(path)  # the last writer lets go
        return fd

    monkeypatch.setattr(packstate.os, "open", removed_after_open)
    fd = packstate.lock_destination(tmp_path)
    monkeypatch.undo()
    assert raced and os.fstat(fd).st_ino == os.stat(tmp_path / packstate.LOCK).st_ino
    with pytest.raises(PackError, match="another tierfeed writer"):
        packstate.lock_destination(tmp_path)  # the name's file is held: others wait
    packstate.unlock_destination(tmp_path, fd)
    assert not (tmp_path / packstate.LOCK).exists()


def test_pack_takes_the_lock_a_writer_holds_the_same_way(tmp_path: Path) -> None:
    # pack claims its destination as a Writer does: the same lock, the same one-line error.
    write_tree(tmp_path / "tree", {b"a/x.txt": b"x"})
    first = tierfeed.Writer(tmp_path / "st")
    quiet = PackOptions(progress=False, overwrite=True)
    with pytest.raises(PackError, match="another tierfeed writer"):
        pack(tmp_path / "tree", tmp_path / "st", quiet)
    first.abort()
    pack(tmp_path / "tree", tmp_path / "st", quiet)
    assert _files(tmp_path / "st") == ["chunks/000000.tar", "index.tfi"]


def test_a_refused_claim_leaves_no_lock_file(tmp_path: Path) -> None:
    write_tree(tmp_path / "tree", {b"a/x.txt": b"x"})
    pack(tmp_path / "tree", tmp_path / "st", PackOptions(progress=False))
    with pytest.raises(PackError, match=r"already holds a store; pass --overwrite \(PackOptions"):
        pack(tmp_path / "tree", tmp_path / "st", PackOptions(progress=False))
    with pytest.raises(PackError, match="already holds a store; pass overwrite=True"):
        tierfeed.Writer(tmp_path / "st")
    assert _files(tmp_path / "st") == ["chunks/000000.tar", "index.tfi"]


def test_storage_options_for_a_local_path_are_refused_by_every_writer(tmp_path: Path) -> None:
    write_tree(tmp_path / "tree", {b"a/x.txt": b"x"})
    options = {"anon": True}
    with pytest.raises(PackError, match="storage_options apply to URLs"):
        tierfeed.pack(tmp_path / "tree", tmp_path / "p", storage_options=options)
    with pytest.raises(PackError, match="storage_options apply to URLs"):
        tierfeed.Writer(tmp_path / "w", storage_options=options)
    with pytest.raises(PackError, match="storage_options apply to URLs"):
        tierfeed.optimize(_sample, [0], tmp_path / "o", storage_options=options)
    assert not any((tmp_path / d).exists() for d in ("p", "w", "o"))  # refused before a write
