"""A loader state resumes only on the store it was taken on (issue 32, case 4): a state of
store A loaded into a loader over store B is one ConfigError naming both, whether it is one
rank's state or every rank's (an elastic resume), and whatever the plan would allow."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.format.conftest import write_tree
from tests.torch.test_loader import decode
from tierfeed.errors import ConfigError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader import DeadlineOptions
from tierfeed.torch import Dataset, Loader
from tierfeed.world import World

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]
ONE = World(0, 1)


def numbered(root: Path, n: int, offset: int = 0) -> Path:
    """A store of ``n`` one-file samples holding the numbers offset .. offset + n - 1."""
    files = {f"c{i % 3}/s{i:04d}.txt".encode(): b"%d" % (i + offset) for i in range(n)}
    write_tree(root / "src", files)
    pack(root / "src", root / "store", PackOptions(chunk_size=8192, progress=False))
    return root / "store"


def loader_over(store: Path, world: World = ONE) -> Loader:
    # The plan's exact order (the guard off): a resumed run is compared with a whole one.
    exact = DeadlineOptions(enabled=False)
    ds = Dataset(store, "global", batch_size=8, decode=decode, world=world, deadline=exact)
    return Loader(ds)


def state_after(store: Path, batches: int, world: World = ONE) -> dict[str, Any]:
    with loader_over(store, world) as loader:
        list(itertools.islice(iter(loader), batches))
        return loader.state_dict()


def test_a_state_of_another_store_is_refused_naming_both(tmp_path: Path) -> None:
    a = numbered(tmp_path / "a", 100)
    b = numbered(tmp_path / "b", 130)
    state = state_after(a, 3)
    with loader_over(b) as loader, pytest.raises(ConfigError) as refused:
        loader.load_state_dict(state)
    message = str(refused.value)
    assert "\n" not in message
    assert str(a) in message and str(b) in message
    assert "100 samples" in message and "130 samples" in message


def test_a_store_of_the_same_size_but_other_content_is_refused(tmp_path: Path) -> None:
    # Same sample count, same plan: only the content differs (a rebuilt store).
    a = numbered(tmp_path / "a", 100)
    b = numbered(tmp_path / "b", 100, offset=1000)
    state = state_after(a, 2)
    with loader_over(b) as loader, pytest.raises(ConfigError, match="another store"):
        loader.load_state_dict(state)


def test_gathered_states_of_another_store_are_refused(tmp_path: Path) -> None:
    a = numbered(tmp_path / "a", 100)
    b = numbered(tmp_path / "b", 130)
    states = [state_after(a, 2, World(r, 2)) for r in range(2)]
    with loader_over(b, World(0, 3)) as loader, pytest.raises(ConfigError, match="another store"):
        loader.load_state_dict(states)


def test_the_same_store_elsewhere_resumes(tmp_path: Path) -> None:
    # The identity is the store's content, not its path: a copy of the store resumes.
    a = numbered(tmp_path / "a", 100)
    state = state_after(a, 3)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in a.rglob("*"):
        target = copy / f.relative_to(a)
        if f.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())
    with loader_over(copy) as loader:
        loader.load_state_dict(state)
        rest = [int(x) for batch in loader for x in batch[0]]
    with loader_over(a) as loader:
        whole = [int(x) for batch in loader for x in batch[0]]
    assert sorted(rest) == sorted(whole[24:]) and len(rest) == 100 - 24
