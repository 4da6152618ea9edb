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
from tierfeed.torch import Dataset, Loader
from tierfeed.world import World

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]


def saved(store_dir: Path) -> dict[str, Any]:
    loader = Loader(Dataset(store_dir, "global", batch_size=8, decode=decode, world=World(0, 2)))
    list(itertools.islice(iter(loader), 2))
    state = loader.state_dict()
    loader.close()
    return state


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
def test_a_damaged_state_is_one_config_error(store_dir: Path, damage: Any) -> None:
    state = copy.deepcopy(saved(store_dir))
    damage(state)
    loader = Loader(Dataset(store_dir, "global", batch_size=8, decode=decode, world=World(0, 2)))
    with pytest.raises(ConfigError) as refused:
        loader.load_state_dict(state)
    loader.close()
    message = str(refused.value)
    assert "\n" not in message and "ConfigError:" not in message  # one error, not wrapped


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzzed_states_resume_or_refuse(store_dir: Path, data: st.DataObject) -> None:
    state = copy.deepcopy(saved(store_dir))
    key = data.draw(st.sampled_from(sorted(state)))
    state[key] = data.draw(
        st.one_of(st.none(), st.integers(-3, 10**6), st.text(max_size=5), st.lists(st.integers()))
    )
    loader = Loader(Dataset(store_dir, "global", batch_size=8, decode=decode, world=World(0, 2)))
    # Loads (the change did not matter) or is refused in one line; any other exception
    # escapes and fails the test.
    try:
        loader.load_state_dict(state)
    except ConfigError:
        pass
    finally:
        loader.close()
