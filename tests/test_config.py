"""The World from torchrun's variables, and from a process group's rank and size; the
per-user default cache directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tierfeed.config import default_cache_dir, world_for, world_from_env
from tierfeed.errors import ConfigError
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


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_default_cache_is_per_user_and_made_0700(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert default_cache_dir({"HOME": str(home)}) == home / ".cache" / "tierfeed"
    assert mode_of(home / ".cache" / "tierfeed") == 0o700
    xdg = tmp_path / "xdg"
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(xdg)}
    assert default_cache_dir(env) == xdg / "tierfeed"
    explicit = tmp_path / "explicit"
    assert default_cache_dir({**env, "TIERFEED_CACHE": str(explicit)}) == explicit
    assert mode_of(explicit) == 0o700


def test_without_a_usable_home_the_cache_is_a_0700_directory_of_the_uid_under_tmp(
    tmp_path: Path,
) -> None:
    home = tmp_path / "a-file"
    home.write_bytes(b"")
    env = {"HOME": str(home), "TMPDIR": str(tmp_path)}
    own = tmp_path / f"tierfeed-{os.geteuid()}"
    assert default_cache_dir(env) == own
    assert mode_of(own) == 0o700 and own.stat().st_uid == os.geteuid()
    own.chmod(0o755)  # not as tierfeed made it: refused, and left as it is
    with pytest.raises(ConfigError) as err:
        default_cache_dir(env)
    assert str(own) in str(err.value) and "0700" in str(err.value)
    assert mode_of(own) == 0o755


def test_an_explicit_cache_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError) as err:
        default_cache_dir({"TIERFEED_CACHE": str(link)})
    assert str(link) in str(err.value) and "symbolic link" in str(err.value)
