"""The World from torchrun's variables, and from a process group's rank and size."""

from __future__ import annotations

from tierfeed.config import world_for, world_from_env
from tierfeed.world import World


def test_world_from_torchrun_variables() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert world_from_env(env) == World(3, 8, 1, 2)
    assert world_from_env({}) == World()


def test_world_for_a_group_keeps_the_node_layout_only_of_the_same_job() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert world_for(3, 8, env) == World(3, 8, 1, 2)
    assert world_for(1, 4, env) == World(1, 4)  # the variables describe another job


def test_gloo_uses_loopback_only_for_a_local_rendezvous() -> None:
    from tierfeed.config import gloo_on_loopback_if_local

    local: dict[str, str] = {"MASTER_ADDR": "localhost"}
    gloo_on_loopback_if_local(local)
    assert local["GLOO_SOCKET_IFNAME"] == "lo"
    chosen = {"GLOO_SOCKET_IFNAME": "eth1"}
    gloo_on_loopback_if_local(chosen)
    assert chosen["GLOO_SOCKET_IFNAME"] == "eth1"  # the user's choice stays
    remote = {"MASTER_ADDR": "10.0.0.7"}
    gloo_on_loopback_if_local(remote)
    assert "GLOO_SOCKET_IFNAME" not in remote
