"""Byte sizes as people write them (64MiB, 1.5GB) and as people read them (97.2 MiB)."""

from __future__ import annotations

import re

from tierfeed.errors import ConfigError

__all__ = ["human", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}  # fmt: skip


def parse_size(text: str) -> int:
    """Parse ``"64MiB"``, ``"1.5GB"``, ``"4096"`` into bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ConfigError(f"cannot read size {text!r}; write e.g. 64MiB, 1GB or 4096")
    return int(float(match.group(1)) * _UNITS[unit])


def human(n: float) -> str:
    """Bytes as a short human string (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
