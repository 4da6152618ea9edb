"""The public API: `__all__` lists exactly what the package exports, and every name resolves."""

from __future__ import annotations

import tierfeed


def test_all_is_honest() -> None:
    for name in tierfeed.__all__:  # the lazily loaded names, loaded (PEP 562)
        getattr(tierfeed, name)
    public = {n for n in vars(tierfeed) if not n.startswith("_")} - {"annotations"}
    public -= {"TYPE_CHECKING", "Any", "importlib"}  # the lazy loader's own imports
    modules = {n for n in public if type(getattr(tierfeed, n)).__name__ == "module"}
    assert sorted(public - modules) == sorted(n for n in tierfeed.__all__ if n != "__version__")
    for name in tierfeed.__all__:
        assert getattr(tierfeed, name) is not None


def test_every_lazy_name_is_public_and_the_same_object() -> None:
    from tierfeed.loader.compose import open_store

    assert set(tierfeed._LAZY) | {"TierfeedError", "__version__"} == set(tierfeed.__all__)
    assert tierfeed.open_store is open_store
    assert set(tierfeed.__all__) <= set(dir(tierfeed))
