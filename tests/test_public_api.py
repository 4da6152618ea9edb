"""The public API: `__all__` lists exactly what the package exports, and every name resolves."""

from __future__ import annotations

import tierfeed


def test_all_is_honest() -> None:
    public = {n for n in vars(tierfeed) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if type(getattr(tierfeed, n)).__name__ == "module"}
    assert sorted(public - modules) == sorted(n for n in tierfeed.__all__ if n != "__version__")
    for name in tierfeed.__all__:
        assert getattr(tierfeed, name) is not None
