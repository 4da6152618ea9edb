"""A hand-edited loader state is input (issue 44, case 4): every field's type, sign and size is
checked against the store and world it is loaded into before anything is computed from it, so
a bad one is one ConfigError naming the field, under a time bound whatever the state holds."""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.torch.conftest import N
from tests.torch.conftest import store_dir as store_dir  # the numbered store
from tests.torch.test_loader import decode
from tierfeed.errors import ConfigError
from tierfeed.torch import Dataset, Loader
from tierfeed.world import World

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(60)]

BOUND_S = 5.0  # a refusal (or a load) takes well under a second; generous against CI noise
State = Any  # one rank's state (a dict) or every rank's (a list of them)


def loader_of(store: Path, world: World) -> Loader:
    return Loader(Dataset(store, "global", batch_size=8, decode=decode, world=world))


@pytest.fixture(scope="module")
def real(store_dir: Path) -> dict[str, tuple[World, State]]:
    """Real states, and the world each loads into: rank 0 of 2 after two batches; both ranks'
    states (an elastic resume into three ranks); rank 0 of 3 after that resume (its plan holds
    a segment with each old rank's done positions)."""
    gathered = []
    for rank in range(2):
        with loader_of(store_dir, World(rank, 2)) as loader:
            list(itertools.islice(iter(loader), 2))
            gathered.append(loader.state_dict())
    with loader_of(store_dir, World(0, 3)) as loader:
        loader.load_state_dict(gathered)
        list(itertools.islice(iter(loader), 1))
        elastic = loader.state_dict()
    return {
        "one": (World(0, 2), gathered[0]),
        "gathered": (World(0, 3), gathered),
        "elastic": (World(0, 3), elastic),
    }


def refused(store: Path, world: World, state: State) -> str:
    """The message of the ConfigError that loading ``state`` raises, checked to come in time
    and in one line."""
    with loader_of(store, world) as loader:
        started = time.monotonic()
        with pytest.raises(ConfigError) as error:
            loader.load_state_dict(state)
        took = time.monotonic() - started
    message = str(error.value)
    assert took < BOUND_S, f"refused after {took:.1f} s: {message}"
    assert "\n" not in message and "ConfigError:" not in message  # one error, not wrapped
    return message


def names(message: str, field: str) -> bool:
    """Whether ``message`` names ``field`` as the field at fault: ``field epoch``, as a whole
    dotted path (``epoch`` is not named by ``plan.epoch``, nor ``done[1]`` by ``done[1][0]``).
    One rank's state's fields are named from its top (``plan.segments[0][0]``); a state in a
    list from the list's (``states[1].epoch``)."""
    return re.search(rf"\bfield {re.escape(field)}(?![\w\[.])", message) is not None


def edited(state: State, path: str, value: Any) -> State:
    """A copy of ``state`` with the value at dotted ``path`` (``plan.segments[0][1]``) set."""
    state = copy.deepcopy(state)
    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
    parent = state
    for key in keys[:-1]:
        parent = parent[key]
    parent[keys[-1]] = value
    return state


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` deep, built without recursion."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


# The issue's cases: each was trusted with the machine (minutes of work, a huge allocation, an
# error deep in numpy, a silently wrapped epoch, a message comparing '4' with 4).
ISSUE_CASES = [
    ("one", "plan.segments", [[10**6, 0]], "plan.segments[0][0]"),
    ("one", "world_size", 10**9, "world_size"),
    ("one", "epoch", -1, "epoch"),
    ("one", "epoch", 2**70, "epoch"),
    ("one", "batch_size", "4", "batch_size"),
]


# Every whole-number field of the states (the elastic one holds a segment of done positions;
# its first rank's done gets an extra position so that one is there to damage too).
INT_FIELDS = [
    ("one", "version"),
    ("one", "epoch"),
    ("one", "num_workers"),
    ("one", "batch_size"),
    ("one", "rank"),
    ("one", "world_size"),
    ("one", "plan.plans"),
    ("one", "plan.seed"),
    ("one", "plan.epoch"),
    ("one", "store.samples"),
    ("one", "done[0]"),
    ("elastic", "plan.segments[0][0]"),
    ("elastic", "plan.segments[0][1][0][0]"),
    ("elastic", "plan.segments[0][1][0][1][0]"),
    ("elastic", "done[0]"),
    ("gathered", "[1].epoch"),
    ("gathered", "[1].rank"),
    ("gathered", "[1].done[0]"),
]


def field_of(path: str) -> str:
    """How a message names the field at ``path``: a state in a list is ``states[i]``."""
    return "states" + path if path.startswith("[") else path


def with_extras(state: State) -> State:
    """``state`` with an extra done position beyond each done prefix it lists (a hand-edited
    state that is still valid)."""
    state = copy.deepcopy(state)
    for done in [state["done"], *(d for _, c in state["plan"]["segments"] for d in c)]:
        done[1] = [done[0] + 2]
    return state


@pytest.mark.parametrize("value", [True, False, 4.0, "4", None, [4], {"4": 4}])
@pytest.mark.parametrize(("base", "field"), INT_FIELDS)
def test_a_whole_number_field_takes_nothing_else(
    store_dir: Path, real: dict[str, tuple[World, State]], base: str, field: str, value: Any
) -> None:
    message = refused_naming(store_dir, real, base, field, value)
    assert names(message, field_of(field)), message


def test_a_valid_hand_edit_still_loads(
    store_dir: Path, real: dict[str, tuple[World, State]]
) -> None:
    # Not over-strict: extra done positions where a state may have them still resume.
    world, state = real["elastic"]
    with loader_of(store_dir, world) as loader:
        loader.load_state_dict(with_extras(state))
        assert sum(len(batch[0]) for batch in loader) > 0


class Twice:
    """A plan of the user's whose orders are longer than the store: every sample twice."""

    def order(self, epoch: int, rank: int, world_size: int) -> npt.NDArray[np.int64]:
        return np.tile(np.arange(N, dtype=np.int64), 2)[rank::world_size]


def test_a_plan_with_orders_longer_than_the_store_resumes(store_dir: Path) -> None:
    # Positions are bounded by the rank's order, not by the store's sample count.
    def loader() -> Loader:
        return Loader(Dataset(store_dir, Twice(), batch_size=8, decode=decode, world=World(0, 1)))

    with loader() as first:
        list(itertools.islice(iter(first), 20))  # past position N
        state = first.state_dict()
    assert state["done"][0] > N
    with loader() as again:
        again.load_state_dict(state)
        assert sum(len(batch[0]) for batch in again) == 2 * N - 20 * 8


BIG = [1] * 10**7
BAD_SHAPES = [
    # negative positions and counts
    ("one", "done", [-1, []], "done[0]"),
    ("one", "done", [16, [-3]], "done[1][0]"),
    ("one", "done", [16, [20, 18]], "done[1][1]"),  # not increasing
    ("one", "done", [N + 1, []], "done[0]"),  # more than the store has
    ("one", "rank", -1, "rank"),
    ("one", "rank", 2, "rank"),  # not a rank of its world
    ("one", "num_workers", -2, "num_workers"),
    ("one", "plan.segments", [[2, -1]], "plan.segments[0][1]"),
    ("elastic", "plan.segments[0][1][1][0]", -1, "plan.segments[0][1][1][0]"),
    ("elastic", "plan.segments[0][1][1][1]", [-1], "plan.segments[0][1][1][1][0]"),
    ("one", "version", 99, "version"),  # a newer tierfeed's
    ("one", "plan.epoch", 1, "plan.epoch"),  # differs from the state's epoch
    # oversized lists: refused by their length, not walked
    ("one", "done", [0, BIG], "done[1]"),
    ("one", "plan.segments", [[1, 0]] * 10**6, "plan.segments"),
    ("one", "plan.segments", [[2, [[0, BIG], [0, []]]]], "plan.segments[0][1][0][1]"),
    ("elastic", "plan.segments[0][1]", [[0, [1, 2]]] * 10**6, "plan.segments[0][1]"),
    ("one", "done", [0, [0] * 10**7], "done[1]"),
    ("one", "plan.spec", "global" * 10**6, "plan.spec"),
    ("one", "store.where", "/x" * 10**6, "store.where"),
    # wrong nesting, and deep junk that must not be walked recursively
    ("one", "done", [[16], []], "done[0]"),
    ("one", "done", nested(10**5), "done"),
    ("one", "plan", [1, 2], "plan"),
    ("one", "plan.segments", [[[2, 0], 0]], "plan.segments[0][0]"),
    ("one", "plan.segments", nested(10**5), "plan.segments[0]"),
    ("one", "plan.segments", [[2, [nested(10**5), [0, []]]]], "plan.segments[0][1][0]"),
    ("one", "store", "somewhere", "store"),
    ("one", "drop_last", 0, "drop_last"),
    ("one", "plan.drop_last", "no", "plan.drop_last"),
]


def refused_naming(
    store: Path, real: dict[str, tuple[World, State]], base: str, path: str, value: Any
) -> str:
    """The refusal of the ``base`` state (an elastic one with extra done positions, still
    valid) edited at ``path`` (`refused`: in time, in one line)."""
    world, state = real[base]
    if base == "elastic":
        state = with_extras(state)
    return refused(store, world, edited(state, path, value))


@pytest.mark.parametrize(("base", "path", "value", "field"), ISSUE_CASES + BAD_SHAPES)
def test_an_issue_case_or_a_bad_shape_or_size_is_refused_in_time_naming_the_field(
    store_dir: Path,
    real: dict[str, tuple[World, State]],
    base: str,
    path: str,
    value: Any,
    field: str,
) -> None:
    message = refused_naming(store_dir, real, base, path, value)
    assert names(message, field), message


def test_positions_beyond_what_an_epoch_lists_are_refused(
    store_dir: Path, real: dict[str, tuple[World, State]]
) -> None:
    # Every rank of a segment lists (one shared list of) nearly every position: more than an
    # epoch of the store can have done, refused without walking them all.
    _, state = real["one"]
    many = [[0, list(range(1, N))]] * N
    message = refused(store_dir, World(0, 2), edited(state, "plan.segments", [[N, many]]))
    assert re.search(r"\bfield plan\.segments\[0\]\[1\]\[\d+\]\[1\] ", message), message


def with_cursors(state: State, cursor: Any = 16, ahead: Any = (17,)) -> State:
    """``state`` in the first layout: one worker's cursor in its slice instead of done
    positions (a JSON round trip made the worker's number text)."""
    state = {k: v for k, v in copy.deepcopy(state).items() if k != "done"}
    ahead = list(ahead) if isinstance(ahead, tuple) else ahead
    return {**state, "num_workers": 1, "workers": {"0": {"cursor": cursor, "ahead": ahead}}}


@pytest.mark.parametrize(
    ("cursor", "ahead", "field"),
    [
        (-1, [], "workers['0'].cursor"),  # would mark all but the last position delivered
        ("16", [], "workers['0'].cursor"),
        (16, [2**70], "workers['0'].ahead[0]"),
        (16, BIG, "workers['0'].ahead"),
        (16, {"17": 1}, "workers['0'].ahead"),
    ],
)
def test_a_state_of_worker_cursors_is_checked_too(
    store_dir: Path, real: dict[str, tuple[World, State]], cursor: Any, ahead: Any, field: str
) -> None:
    world, state = real["one"]
    with loader_of(store_dir, world) as loader:  # the layout still resumes
        loader.load_state_dict(with_cursors(state))
        assert sum(len(batch[0]) for batch in loader) == N // 2 - 17
    message = refused(store_dir, world, with_cursors(state, cursor, ahead))
    assert names(message, field), message


def test_too_many_states_are_refused_by_their_count(
    store_dir: Path, real: dict[str, tuple[World, State]]
) -> None:
    _, state = real["one"]
    many = [edited(state, "world_size", 10**7)] * 10**7  # one object, listed 10**7 times
    refused(store_dir, World(0, 3), many)


def test_a_state_that_is_not_a_mapping_or_list_is_refused(store_dir: Path) -> None:
    for junk in ["state", 42, None, b"\x80", nested(10**5)]:
        refused(store_dir, World(0, 2), junk)


# --- fuzzing: any leaf (or inner node) of a real state replaced by anything -------------------

NEARBY = st.integers(-2, N + 2)  # often a value a state may hold: the edit may load
ANYTHING = st.one_of(
    NEARBY,
    NEARBY,
    NEARBY,
    st.lists(NEARBY, max_size=4),
    st.integers(),
    st.sampled_from([-1, 0, 1, N, N + 1, 2**31, 2**62, 2**63, 2**64, 2**70, 10**9, -(2**70)]),
    st.booleans(),
    st.floats(),
    st.text(max_size=8),
    st.none(),
    st.lists(st.integers(), max_size=4),
    st.lists(st.lists(st.integers(-2, N + 2), max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def paths(value: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place inside a state (a state is a few levels deep: recursion is bounded)."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        yield (*here, key)
        if isinstance(child, dict | list):
            yield from paths(child, (*here, key))


def at(state: Any, where: tuple[Any, ...]) -> Any:
    for key in where:
        state = state[key]
    return state


def put(state: Any, where: tuple[Any, ...], value: Any) -> None:
    parent = state
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value


def loads_or_refuses(store: Path, world: World, state: State) -> None:
    """Loading ``state`` resumes (and the rest of its epoch is read) or is one ConfigError, in
    time; any other exception escapes and fails the test."""
    with loader_of(store, world) as loader:
        started = time.monotonic()
        try:
            loader.load_state_dict(state)
        except ConfigError as error:
            assert "\n" not in str(error)
            event("refused")
            return
        finally:
            assert time.monotonic() - started < BOUND_S
        event("loaded")
        for _ in loader:  # a state that loads resumes: no error deep inside later
            pass


# An edit: at the n-th place of a state (any value), at its n-th whole number (a nearby one:
# such edits often load, and then resume), or at a named field (any value).
Edit = tuple[str, Any, Any]
FIELDS = [("epoch",), ("world_size",), ("rank",), ("batch_size",), ("done",), ("plan", "segments")]
EDITS = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.integers(0, 2**16), ANYTHING),
        st.tuples(st.just("number"), st.integers(0, 2**16), NEARBY),
        st.tuples(st.just("field"), st.sampled_from(FIELDS), ANYTHING),
    ),
    min_size=1,
    max_size=3,
)


def apply(state: State, edits: list[Edit]) -> None:
    places = sorted(paths(state), key=repr)
    numbers = [p for p in places if type(at(state, p)) is int]
    for kind, which, value in edits:
        where = {"place": places, "number": numbers}.get(kind)
        place = which if where is None else where[which % len(where)]
        with contextlib.suppress(KeyError, IndexError, TypeError):
            put(state, place, value)  # unless an earlier edit replaced what held this place


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(base=st.sampled_from(["elastic", "gathered", "one"]), edits=EDITS)
@example(base="one", edits=[("field", ("epoch",), -1)])  # the issue: numpy's error, later
def test_fuzzed_states_load_or_are_refused(
    store_dir: Path, real: dict[str, tuple[World, State]], base: str, edits: list[Edit]
) -> None:
    world, state = real[base]
    state = copy.deepcopy(with_extras(state) if base == "elastic" else state)
    apply(state, edits)
    loads_or_refuses(store_dir, world, state)


def test_the_real_states_load(store_dir: Path, real: dict[str, tuple[World, State]]) -> None:
    # The fuzzing above is not vacuous: unchanged, every base state resumes.
    for world, state in real.values():
        with loader_of(store_dir, world) as loader:
            loader.load_state_dict(state)
            assert sum(len(batch[0]) for batch in loader) > 0


@pytest.mark.parametrize("epoch", [-1, 2**31, 2**70, True, 1.0, "2", None])
def test_set_epoch_refuses_what_would_wrap_or_is_no_epoch(store_dir: Path, epoch: Any) -> None:
    # The epoch is shared with the workers as an int64: 2**70 wrapped and restarted the plan.
    ds = Dataset(store_dir, batch_size=8, decode=decode)
    with Loader(ds, num_workers=0) as loader:
        with pytest.raises(ConfigError, match=r"set_epoch: the epoch is a whole number"):
            loader.set_epoch(epoch)
        loader.set_epoch(np.int64(3))  # numpy's ints are epochs too
        assert ds.epoch == 3
