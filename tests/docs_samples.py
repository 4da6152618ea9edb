"""A sample function the README's `tierfeed.optimize` example names as the reader's own
(`make_sample`): module level, so that optimize's spawned workers import it."""

from __future__ import annotations

from typing import Any


def make_sample(i: int) -> dict[str, Any]:
    return {"__key__": f"{i:06d}", "txt": f"sample {i}", "cls": i % 2}
