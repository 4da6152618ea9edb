"""A damaged or foreign loader state ends in one ConfigError, never a traceback from deep
inside, and never resumes at the wrong place (fuzzed with hypothesis)."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.torch.conftest import store_dir as store_dir  # the numbered store
from tests.torch.test_loader import decode
from tierfeed.errors import ConfigError
from tierfeed.loader.loaderstate import STATE_VERSION
from tierfeed.loader.statecheck import MAX_WORKERS
from tierfeed.torch import Dataset, Loader
from tierfeed.world import World

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

RANK_0_OF_2 = World(0, 2)


def loader_of(store_dir: Path, world: World = RANK_0_OF_2) -> Loader:
    return Loader(Dataset(store_dir, "global", batch_size=8, decode=decode, world=world))


def saved(store_dir: Path, world: World = RANK_0_OF_2) -> dict[str, Any]:
    """The state after two batches of 8."""
    with loader_of(store_dir, world) as loader:
        list(itertools.islice(iter(loader), 2))
        return loader.state_dict()


def delivered(loader: Loader) -> list[int]:
    """The samples the loader's next iteration delivers, sorted: a late read may come after
    reads planned behind it (the deadline guard), so only which samples come is exact."""
    return sorted(int(value) for values, _ in loader for value in values)


@pytest.fixture(scope="module")
def intact(store_dir: Path) -> dict[str, Any]:
    return saved(store_dir)


@pytest.fixture(scope="module")
def intact_rest(store_dir: Path, intact: dict[str, Any]) -> list[int]:
    """What resuming the intact state delivers: what rank 0 of 2 has left of its 60."""
    with loader_of(store_dir) as loader:
        loader.load_state_dict(copy.deepcopy(intact))
        rest = delivered(loader)
    assert len(rest) == 60 - 16 and len(set(rest)) == len(rest)
    return rest


def harmless(key: str, value: object) -> bool:
    """A change the loader takes and resumes exactly as the intact state: a state does not
    depend on the number of workers (any count a state may hold), may lack its order record or
    its store entry (a state saved before states kept them), and may be of the first layout
    (version 1: with ``done``, read the same)."""
    if key == "num_workers":
        return type(value) is int and 0 <= value <= MAX_WORKERS
    if key in ("order", "store"):
        return value is None
    return key == "version" and type(value) is int and value in (1, STATE_VERSION)


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s.pop("epoch"),
        lambda s: s.pop("batch_size"),  # an older tierfeed's state: its own message
        lambda s: s.update(epoch="three"),
        lambda s: s.update(done=None),
        lambda s: s.update(done=[-5, []]),
        lambda s: s.update(done=[4, [2]]),  # an extra position below the prefix
        lambda s: s.update(done=["x", []]),
        lambda s: s["plan"].update(segments=[[2, "lots"]]),
        lambda s: s["plan"].update(segments=[[2, [[0, []]]]]),  # one rank's progress of two
        lambda s: s["plan"].update(spec="sideways"),
        lambda s: s.update(world_size=0),
        lambda s: s.update(done=[10**6, []]),  # positions this rank's order does not have
        lambda s: s.update(done=[0, [10**6]]),
        lambda s: s.update(store=[1, 2]),  # the store it was taken on, damaged
        lambda s: s["store"].pop("samples"),
        lambda s: s["store"].update(samples="many"),
        lambda s: s["store"].update(index="0" * 16),  # another store's
    ],
)
def test_a_damaged_state_is_one_config_error(
    store_dir: Path, intact: dict[str, Any], damage: Any
) -> None:
    state = copy.deepcopy(intact)
    damage(state)
    with loader_of(store_dir) as loader, pytest.raises(ConfigError) as refused:
        loader.load_state_dict(state)
    message = str(refused.value)
    assert "\n" not in message and "ConfigError:" not in message  # one error, not wrapped


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzzed_states_resume_or_refuse(
    store_dir: Path, intact: dict[str, Any], intact_rest: list[int], data: st.DataObject
) -> None:
    """One field replaced: refused in one line naming it, or taken as a state that can be
    genuine, resuming exactly where that state does; never loaded to resume elsewhere."""
    state = copy.deepcopy(intact)
    key = data.draw(st.sampled_from(sorted(state)))
    value = data.draw(
        st.one_of(st.none(), st.integers(-3, 10**6), st.text(max_size=5), st.lists(st.integers()))
    )
    state[key] = value
    with loader_of(store_dir) as loader:
        try:
            loader.load_state_dict(state)
        except ConfigError as refused:
            message = str(refused)
            assert "\n" not in message and "ConfigError:" not in message  # one error
            # It names the field (a world size it cannot take: the job it describes).
            assert key in message or (key == "world_size" and f"a job of {value} ranks" in message)
            return
        if key == "world_size" and value == 1:
            # Field for field the state a job of one rank saves after the same two batches:
            # nothing in it tells it apart, so it resumes as that job's state.
            assert state == saved(store_dir, World(0, 1))
            return
        unchanged = type(value) is type(intact[key]) and value == intact[key]
        assert unchanged or harmless(key, value), f"loaded with {key}={value!r}"
        assert delivered(loader) == intact_rest
