"""The one place that reads environment variables: torchrun's rank variables and tierfeed's own."""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from tierfeed.cachedir import private_dir
from tierfeed.errors import ConfigError, StorageError
from tierfeed.world import World

__all__ = [
    "default_cache_dir",
    "gloo_on_loopback_if_local",
    "part_from_env",
    "worker_heap_wanted",
    "world_for",
    "world_from_env",
]

# Variables by which a user tunes glibc's malloc: a worker's heap is then left as they set it.
_MALLOC_VARIABLES = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


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


# Where a launcher says which of how many processes this one is, in the order they are asked:
# torchrun's, a Slurm array's (its ids may start above 0), a Slurm job step's.
_PART_VARIABLES = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def part_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """Which part of how many this process packs (`tierfeed pack --part env`): (index, count)
    from torchrun's RANK and WORLD_SIZE, else a Slurm array's task id (less its
    SLURM_ARRAY_TASK_MIN) and task count, else a Slurm step's SLURM_PROCID and SLURM_NTASKS.

    Raises:
        ConfigError: none of them is set, or they name no part (index outside 0..count-1).
    """
    env = os.environ if env is None else env
    for index_name, count_name in _PART_VARIABLES:
        if env.get(index_name, "") == "" or env.get(count_name, "") == "":
            continue
        index, count = _int(env, index_name, 0), _int(env, count_name, 1)
        if index_name == "SLURM_ARRAY_TASK_ID":
            index -= _int(env, "SLURM_ARRAY_TASK_MIN", 0)
        if not 0 <= index < count:
            raise ConfigError(
                f"environment variables {index_name} and {count_name} give part {index} of "
                f"{count}, which is not one of 0..{count - 1}; an array's ids must be "
                "consecutive (--array=0-7)"
            )
        return index, count
    names = ", ".join(f"{i}/{c}" for i, c in _PART_VARIABLES)
    raise ConfigError(
        f"--part env: none of {names} is set; run under torchrun or Slurm, or give --part I/N"
    )


def world_for(rank: int, world_size: int, env: Mapping[str, str] | None = None) -> World:
    """The World of ``rank`` of ``world_size`` (as a process group reports them), with the
    node layout from torchrun's variables when they describe this very job."""
    from_env = world_from_env(env)
    if from_env.rank == rank and from_env.world_size == world_size:
        return from_env
    return World(rank, world_size)


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where local caches live unless configured, created 0700 and checked (see
    `tierfeed.cachedir`): $TIERFEED_CACHE, else $XDG_CACHE_HOME/tierfeed or ~/.cache/tierfeed;
    where the home cannot hold it (none, read-only), ``tierfeed-<uid>`` in $TMPDIR or /tmp.

    Raises:
        ConfigError: the directory is a symbolic link, another user's, or writable by others.
        StorageError: $TIERFEED_CACHE names a directory that cannot be made or opened.
    """
    env = os.environ if env is None else env
    explicit = env.get("TIERFEED_CACHE")
    if explicit:
        return private_dir(explicit)
    home = env.get("HOME") or _home_of_uid()
    if env.get("XDG_CACHE_HOME") or home:
        base = Path(env.get("XDG_CACHE_HOME") or Path(home, ".cache"))
        try:
            return private_dir(base / "tierfeed")
        except StorageError:
            pass  # no home, or a read-only one: the per-user directory under /tmp
    # Under a /tmp every user writes: a name of our uid's, that must be ours and 0700.
    return private_dir(Path(env.get("TMPDIR") or "/tmp", f"tierfeed-{os.geteuid()}"), exact=True)


def _home_of_uid() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:  # a uid with no passwd entry (containers)
        return ""


def gloo_on_loopback_if_local(env: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Every rank on this host (torchrun --standalone, MASTER_ADDR local): let gloo use the
    loopback device unless GLOO_SOCKET_IFNAME says otherwise."""
    env = os.environ if env is None else env
    if env.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")


def worker_heap_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether DataLoader workers keep the heap memory they free (`tierfeed.torch.workerheap`):
    yes unless $TIERFEED_WORKER_HEAP is 0, or the environment tunes malloc itself (a
    ``MALLOC_*_`` threshold, ``GLIBC_TUNABLES`` naming ``glibc.malloc``, or jemalloc, tcmalloc
    or mimalloc in ``LD_PRELOAD``).

    Raises:
        ConfigError: $TIERFEED_WORKER_HEAP is neither 0 nor 1.
    """
    env = os.environ if env is None else env
    raw = env.get("TIERFEED_WORKER_HEAP", "")
    if raw not in ("", "0", "1"):
        raise ConfigError(
            f"environment variable TIERFEED_WORKER_HEAP={raw!r} must be 0 (leave the workers' "
            "malloc as it is) or 1 (keep the heap they free, the default)"
        )
    if raw == "0" or any(env.get(name) for name in _MALLOC_VARIABLES):
        return False
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return False
    preload = env.get("LD_PRELOAD", "")
    return not any(name in preload for name in _ALLOCATORS)
