"""The import rule of docs/architecture.md: no package imports one above it in the data flow."""

from __future__ import annotations

import ast
from pathlib import Path

import tierfeed

SRC = Path(tierfeed.__file__).parent

TOP = 9  # the command line, the demo and the package's front doors may import anything

# Level of each top-level package or module; a package may import its own level's leaves
# (level 0) and anything of a lower level.
LEVEL = {
    **dict.fromkeys(["errors", "units", "world", "config", "publish", "cachedir", "latency"], 0),
    "telemetry": 0,
    **dict.fromkeys(["format", "plan", "fuse", "synth"], 1),
    **dict.fromkeys(["storage", "slowfs"], 2),
    "loader": 3,
    **dict.fromkeys(["torch", "mount", "distributed"], 4),
    **dict.fromkeys(["cli", "demo", "dist", "__init__", "__main__"], 9),
}
# The one crossing at one level, documented: Namespace.dataset() hands out a torch Dataset.
ALLOWED = {("distributed", "torch")}


def imports_of(path: Path) -> set[str]:
    """The top-level tierfeed packages ``path`` imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n.split(".")[1] for n in names if n.startswith("tierfeed.")}
    return out


def test_no_package_imports_one_above_it() -> None:
    crossings = []
    for path in sorted(SRC.rglob("*.py")):
        package = path.relative_to(SRC).parts[0].removesuffix(".py")
        for target in imports_of(path) - {package}:
            here, there = LEVEL[package], LEVEL[target]
            upward = here < TOP and (there > here or (there == here and there > 0))
            if upward and (package, target) not in ALLOWED:
                crossings.append(f"{path.relative_to(SRC)} imports tierfeed.{target}")
    assert crossings == []


def test_leaves_import_only_leaves() -> None:
    for name in ("telemetry", "errors", "units", "publish", "latency"):
        paths = (
            [SRC / f"{name}.py"] if (SRC / f"{name}.py").exists() else (SRC / name).rglob("*.py")
        )
        for path in paths:
            assert all(LEVEL[t] == 0 for t in imports_of(path)), path
