"""A damaged or crafted tree in index.tfi (modes, mtimes, the directory table, the root): each
ends in IndexFormatError naming the file, or opens into a store that walks without error."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.format.conftest import QUIET, write_messy_tree
from tests.hostile import indexedit as ie
from tierfeed.errors import IndexFormatError, NotFoundError
from tierfeed.format.index import Index, write_index
from tierfeed.format.layout import INDEX_NAME, TREE_SECTIONS
from tierfeed.format.pack import pack
from tierfeed.loader.compose import open_store
from tierfeed.storage.store import Store

pytestmark = pytest.mark.timeout(60)

DIRS = [
    b"cat",
    b"cat/empty",
    b"cat/sub",
    b"dog",
    b"empty_class",
    b"valid",
    b"valid/deeper",
    b"valid/deeper/deepest",
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """The messy tree packed once; (store dir, index bytes)."""
    base = tmp_path_factory.mktemp("pristine")
    write_messy_tree(base / "src")
    pack(base / "src", base / "store", QUIET)
    return base / "store", (base / "store" / INDEX_NAME).read_bytes()


@pytest.fixture
def store_with(tmp_path: Path, pristine: tuple[Path, bytes]) -> Callable[[bytes], Path]:
    """Write index bytes into a fresh store directory sharing the pristine chunks."""

    def make(raw: bytes) -> Path:
        return ie.store_with_index(tmp_path / "store", pristine[0], raw)

    return make


@pytest.fixture
def crafted(
    tmp_path: Path, pristine: tuple[Path, bytes], store_with: Callable[[bytes], Path]
) -> Callable[..., Path]:
    """A store whose index is the pristine one with some `IndexContent` fields replaced,
    written whole (every checksum right: only the invariant checks can catch it)."""

    def make(**changes: Any) -> Path:
        with Index(pristine[0]) as ix:
            content = ie.content_of(ix)
        if "dir_paths" in changes and "dir_mode" not in changes:
            n = len(changes["dir_paths"])
            changes["dir_mode"] = np.full(n, 0o755, np.uint16)
            changes["dir_mtime"] = np.zeros(n, np.int64)
        path = tmp_path / "crafted.tfi"
        write_index(path, dataclasses.replace(content, **changes))
        return store_with(path.read_bytes())

    return make


def assert_rejected(store: Path, match: str | None = None) -> None:
    with pytest.raises(IndexFormatError, match=match) as info:
        Index(store).close()
    assert str(store / INDEX_NAME) in str(info.value)
    with pytest.raises(IndexFormatError):
        open_store(store)


def walk(store: Store, top: str = "", budget: list[int] | None = None) -> int:
    """Every entry under ``top`` (stat and listdir), bounded: a crafted tree never loops."""
    budget = budget if budget is not None else [10_000]
    count = 0
    for name in store.listdir(top):
        budget[0] -= 1
        assert budget[0] > 0, "the walk does not end"
        rel = f"{top}/{name}" if top else name
        count += 1
        if store.stat(rel).is_dir:
            count += walk(store, rel, budget)
    return count


def test_pristine_tree(pristine: tuple[Path, bytes]) -> None:
    with open_store(pristine[0]) as store:
        assert store.index.dir_paths == DIRS
        assert walk(store) == 14


@pytest.mark.parametrize(
    "dirs",
    [
        pytest.param([DIRS[1], DIRS[0], *DIRS[2:]], id="unsorted"),
        pytest.param([DIRS[0], *DIRS], id="duplicate"),
        pytest.param([*DIRS, b"cat//x"], id="empty-component"),
        pytest.param([b"/cat", *DIRS], id="leading-slash"),
        pytest.param([*DIRS, b"zz/"], id="trailing-slash"),
        pytest.param([b".", *DIRS], id="dot"),
        pytest.param([*DIRS[:3], b"cat/sub/..", *DIRS[3:]], id="dotdot"),
        pytest.param([b"", *DIRS], id="empty"),
        pytest.param([*DIRS, b"z\0z"], id="nul"),
        pytest.param(DIRS[1:], id="parent-missing"),
        pytest.param([*DIRS[:4], b"dog/x/y", *DIRS[4:]], id="grandparent-missing"),
        pytest.param([d for d in DIRS if d != b"dog"], id="member-directory-missing"),
        pytest.param([d for d in DIRS if not d.startswith(b"cat")], id="member-deep-missing"),
        pytest.param([], id="flat-table-nested-members"),
    ],
)
def test_bad_directory_table(dirs: list[bytes], crafted: Callable[..., Path]) -> None:
    assert_rejected(crafted(dir_paths=dirs))


def test_bad_modes(crafted: Callable[..., Path], pristine: tuple[Path, bytes]) -> None:
    with Index(pristine[0]) as ix:
        assert ix.member_mode is not None
        members = ix.num_members
    assert_rejected(crafted(member_mode=np.full(members, 0o10644, np.uint16)), match="mode")
    bad = np.full(len(DIRS), 0o755, np.uint16)
    bad[-1] = 0o40755
    assert_rejected(
        crafted(dir_paths=DIRS, dir_mode=bad, dir_mtime=np.zeros(len(DIRS), np.int64)),
        match="mode",
    )


def test_extra_empty_directories_are_listed(crafted: Callable[..., Path]) -> None:
    with open_store(crafted(dir_paths=[*DIRS, b"zzz", b"zzz/y"])) as store:
        assert store.listdir("") == ["cat", "dog", "empty_class", "top.txt", "valid", "zzz"]
        assert store.listdir("zzz") == ["y"] and store.listdir("zzz/y") == []
        with pytest.raises(NotFoundError):
            store.listdir("zzz/x")


def _edit(raw: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    header = ie.read_header(raw)
    change(header)
    return ie.reseal(ie.with_header(raw, header))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda h: h.pop("dirs"), id="dirs-missing"),
        pytest.param(lambda h: h.pop("root"), id="root-missing"),
        pytest.param(lambda h: h.update(dirs=h["dirs"] + 1), id="dirs-too-many"),
        pytest.param(lambda h: h.update(dirs=-1), id="dirs-negative"),
        pytest.param(lambda h: h.update(dirs="8"), id="dirs-string"),
        pytest.param(lambda h: h.update(root=[0o755]), id="root-short"),
        pytest.param(lambda h: h.update(root=[0o10755, 0]), id="root-mode"),
        pytest.param(lambda h: h.update(root=[0o755, 2**63]), id="root-mtime"),
        pytest.param(lambda h: h.update(root=["755", 0]), id="root-string"),
        pytest.param(lambda h: h.update(root={"mode": 1}), id="root-object"),
        pytest.param(lambda h: h["sections"].pop("dir_mode"), id="section-missing"),
        pytest.param(lambda h: h["sections"].pop("member_mtime"), id="member-section-missing"),
        pytest.param(
            lambda h: [h["sections"].pop(n) for n in TREE_SECTIONS], id="sections-without-dirs"
        ),
        pytest.param(
            lambda h: [h.pop("dirs"), h.pop("root"), h["sections"].pop("dir_paths")],
            id="some-sections-without-dirs",
        ),
    ],
)
def test_bad_tree_header(
    change: Callable[[dict[str, Any]], None],
    pristine: tuple[Path, bytes],
    store_with: Callable[[bytes], Path],
) -> None:
    assert_rejected(store_with(_edit(pristine[1], change)))


def test_no_tree_at_all_opens(
    pristine: tuple[Path, bytes], store_with: Callable[[bytes], Path]
) -> None:
    def strip(h: dict[str, Any]) -> None:
        h.pop("dirs"), h.pop("root")
        for name in TREE_SECTIONS:
            h["sections"].pop(name)

    with open_store(store_with(_edit(pristine[1], strip))) as store:
        assert not store.index.has_tree
        assert store.listdir("") == ["cat", "dog", "top.txt"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda a: a[::-1], id="reversed"),
        pytest.param(lambda a: np.r_[a[:-1], a[-1] - 1], id="short-of-blob"),
        pytest.param(lambda a: np.r_[1, a[1:]], id="not-from-zero"),
        pytest.param(lambda a: np.r_[a[:3], a[4], a[3], a[5:]], id="not-monotone"),
    ],
)
def test_bad_directory_offsets(
    change: Callable[[Any], Any], pristine: tuple[Path, bytes], store_with: Callable[[bytes], Path]
) -> None:
    assert_rejected(store_with(ie.edit_array(pristine[1], "dir_path_offset", change)))


@pytest.mark.parametrize("name", list(TREE_SECTIONS))
def test_damage_without_reseal_fails_the_checksum(
    name: str, pristine: tuple[Path, bytes], store_with: Callable[[bytes], Path]
) -> None:
    offset, nbytes = ie.section(pristine[1], name)
    raw = bytearray(pristine[1])
    raw[offset + nbytes // 2] ^= 0x20
    assert_rejected(store_with(bytes(raw)), match="checksum")


def test_random_resealed_edits_end_in_an_error_or_a_walk(
    pristine: tuple[Path, bytes], store_with: Callable[[bytes], Path]
) -> None:
    rng = random.Random(14)
    for _ in range(300):
        name = rng.choice(list(TREE_SECTIONS))
        offset, nbytes = ie.section(pristine[1], name)
        raw = bytearray(pristine[1])
        for _ in range(rng.randint(1, 3)):
            raw[offset + rng.randrange(nbytes)] = rng.choice(
                [0, 0x2E, 0x2F, 0xFF, rng.randrange(256)]
            )
        store = store_with(ie.reseal(bytes(raw)))
        try:
            opened = open_store(store)
        except IndexFormatError as exc:
            assert str(store / INDEX_NAME) in str(exc)
            continue
        with opened:
            walk(opened)
