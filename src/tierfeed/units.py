"""Byte sizes as people write them (64MiB, 1.5GB) and as people read them (97.2 MiB), and the
checks of the counts and sizes a user passes: one error that names the parameter, where a
comparison deep inside would say ``'<' not supported between instances of 'str' and 'int'``."""

from __future__ import annotations

import argparse
import numbers
import re

from tierfeed.errors import ConfigError

__all__ = ["byte_count", "count", "human", "parse_size", "size_argument"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """Parse ``"64MiB"``, ``"1.5GB"``, ``"4096"`` into bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ConfigError(f"cannot read size {text!r}; write e.g. 64MiB, 1GB or 4096")
    return int(float(match.group(1)) * _UNITS[unit])


def size_argument(text: str) -> int:
    """An argparse type: a bad size is a usage error (exit 2), in `parse_size`'s words."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def human(n: float) -> str:
    """Bytes as a short human string (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def count(value: object, name: str, least: int = 0) -> int:
    """``value`` of parameter ``name`` (e.g. ``"Loader(num_workers=...)"``) as a count: an int
    or a numpy integer, at least ``least``. A bool, a float (``64.0``) or a string is refused,
    as torch's DataLoader refuses them.

    Raises:
        ConfigError: naming ``name``, what it takes and what it was given.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(
            f"{_given(name, value)}: takes an int >= {least}, not a {type(value).__name__}"
        )
    if value < least:
        raise ConfigError(f"{_given(name, value)}: takes an int >= {least}")
    return int(value)


def byte_count(value: object, name: str, least: int = 0) -> int:
    """``value`` of parameter ``name`` as bytes: a count (`count`), or a size as text
    (``"10GB"``, ``"512MiB"``, ``"10gb"`` as MosaicML Streaming takes it), at least ``least``.

    Raises:
        ConfigError: naming ``name``, what it takes and what it was given.
    """
    if not isinstance(value, str):
        try:
            return count(value, name, least)
        except ConfigError:
            raise ConfigError(
                f"{_given(name, value)}: takes bytes, an int >= {least} or a size such as "
                f"'64MiB' or '10GB'"
            ) from None
    try:
        n = parse_size(value)
    except ConfigError:
        raise ConfigError(
            f"{_given(name, value)}: cannot read the size; write e.g. '64MiB', '10GB' or 4096"
        ) from None
    if n < least:
        raise ConfigError(f"{_given(name, value)}: takes at least {least} bytes")
    return n


def _given(name: str, value: object) -> str:
    """``Loader(num_workers='2')`` from ``"Loader(num_workers=...)"`` and ``'2'``."""
    return name.replace("...", repr(value)) if "..." in name else f"{name}={value!r}"
