"""How `tierfeed.optimize` starts its workers: the start method, and ``fn`` as they get it.

Spawn (the default) starts a worker by importing the parent's main module again, by name
(``python -m``) or from its file, then unpickling ``fn``. Where it cannot, the worker would die
as it starts with its error printed to stderr only: a program read from stdin (``python - <
script.py``: ``<stdin>`` is no file), or an ``fn`` that needs an object of a main module of no
file (``python -c``, a notebook). `start_method` runs those by ``fork`` where the platform has
it and uses it safely (not macOS), and is a one-line `ConfigError` elsewhere, before anything
starts. ``fn`` is pickled here and loaded in the worker (`load_fn`), so an ``fn`` a worker
cannot load is an error that says why.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import pickle
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tierfeed.errors import ConfigError, PackError

__all__ = ["Fn", "load_fn", "sendable", "start_method"]

Fn = Callable[[Any], Mapping[str, Any] | Iterable[Mapping[str, Any]]]


def _main_object(fn: Fn) -> str | None:
    """The name of a function or class of ``__main__`` that pickling ``fn`` refers to (``fn``
    itself, a ``partial``'s function, an instance's class), or None."""
    found: list[str] = []

    class Finder(pickle.Pickler):
        def persistent_id(self, obj: Any) -> None:  # called on every object pickled
            if isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
                found.append(obj.__qualname__)
            return None

    with contextlib.suppress(Exception):  # a lambda: found already if it is __main__'s
        Finder(io.BytesIO()).dump(fn)
    return found[0] if found else None


def _spawn_obstacle(fn: Fn) -> str | None:
    """Why a spawned worker could not load ``fn``, or None when it can."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return None  # imported again by name
    path = getattr(main, "__file__", None)
    if path is not None:
        return None if os.path.isfile(path) else f"this program was read from {path!r}"
    name = _main_object(fn)
    if name is None:
        return None
    return f"fn needs `{name}`, defined in a __main__ of no file (python -c, or a notebook)"


def start_method(fn: Fn, method: str) -> str:
    """``method``, or ``fork`` where spawned workers could not load ``fn``.

    Fork is how torch's DataLoader and tierfeed's Loader start workers on POSIX; a forked
    optimize worker copies no thread of the run (its feeders start after every worker), and
    runs only ``fn`` and the encoders. Python deems fork unsafe on macOS (system libraries start
    threads of their own), so there, and where there is no fork, it is an error instead.

    Raises:
        ConfigError: spawned workers cannot load ``fn`` and fork is not used here; one line
            saying what to do.
    """
    obstacle = None if method == "fork" else _spawn_obstacle(fn)
    if obstacle is None:
        return method
    has_fork = "fork" in mp.get_all_start_methods()
    if has_fork and sys.platform != "darwin":
        return "fork"
    hint = " or pass start_method='fork' (unsafe beside threads)," if has_fork else ""
    raise ConfigError(
        f"optimize: {obstacle}, which {method} worker processes cannot import; define fn in a "
        f"module file and run the script from a file,{hint} or write the samples in this "
        "process with tierfeed.Writer"
    )


def sendable(fn: Fn, method: str) -> Fn | bytes:
    """``fn`` as the workers get it: pickled here unless they fork (a forked worker has it).

    Raises:
        ConfigError: ``fn`` cannot be pickled (a lambda, a local function).
    """
    if method == "fork":
        return fn
    try:
        return pickle.dumps(fn)
    except Exception as exc:
        raise ConfigError(
            f"optimize: fn {fn!r} cannot be sent to {method} workers ({exc}); use a "
            "module-level function, or start_method='fork'"
        ) from None


def load_fn(sent: Fn | bytes, worker: int) -> Fn:
    """In worker ``worker``: ``fn`` from what `sendable` made.

    Raises:
        PackError: it cannot be loaded here, saying why (its module fails to import, or it
            needs an object of the parent's ``__main__`` that this process lacks).
    """
    if not isinstance(sent, bytes):
        return sent
    try:
        fn: Fn = pickle.loads(sent)
    except Exception as exc:
        raise PackError(
            f"optimize: worker {worker} cannot load fn ({type(exc).__name__}: {exc}); define "
            "fn at the top level of a module the workers import, or pass start_method='fork'"
        ) from None
    return fn
