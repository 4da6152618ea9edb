"""The one place that reads environment variables: torchrun's rank variables and tierfeed's own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tierfeed.errors import ConfigError
from tierfeed.world import World

__all__ = ["default_cache_dir", "gloo_on_loopback_if_local", "world_for", "world_from_env"]


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def world_from_env(env: Mapping[str, str] | None = None) -> World:
    """Build the World from torchrun / Slurm-style variables (RANK, WORLD_SIZE, LOCAL_*).

    Missing variables mean a single process: rank 0 of 1.
    """
    env = os.environ if env is None else env
    world_size = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK", 0)
    local_world = _int(env, "LOCAL_WORLD_SIZE", world_size)
    local_rank = _int(env, "LOCAL_RANK", rank % max(local_world, 1))
    return World(rank, world_size, local_rank, local_world)


def world_for(rank: int, world_size: int, env: Mapping[str, str] | None = None) -> World:
    """The World of ``rank`` of ``world_size`` (as a process group reports them), with the
    node layout from torchrun's variables when they describe this very job."""
    from_env = world_from_env(env)
    if from_env.rank == rank and from_env.world_size == world_size:
        return from_env
    return World(rank, world_size)


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where local cache tiers live unless configured: $TIERFEED_CACHE, else ~/.cache/tierfeed."""
    env = os.environ if env is None else env
    explicit = env.get("TIERFEED_CACHE")
    if explicit:
        return Path(explicit)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tierfeed"


def gloo_on_loopback_if_local(env: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Every rank on this host (torchrun --standalone, MASTER_ADDR local): let gloo use the
    loopback device unless GLOO_SOCKET_IFNAME says otherwise."""
    env = os.environ if env is None else env
    if env.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
