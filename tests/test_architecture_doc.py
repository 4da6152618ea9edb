"""docs/architecture.md names contracts, not private code: every name it quotes exists."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import tierfeed

SRC = Path(tierfeed.__file__).parent
ROOT = SRC.parent.parent
DOC = ROOT / "docs" / "architecture.md"

# Names the document quotes that are not tierfeed's (the standard library, PyTorch, POSIX).
EXTERNAL = {
    "DataLoader", "DistributedSampler", "IterableDataset", "Dataset", "Executor",
    "ThreadPoolExecutor", "SeedSequence", "Generator", "Future", "OSError", "EIO", "ESTALE",
    "EAGAIN", "ETIMEDOUT", "ConnectionResetError", "If-Match", "ETag", "Lock", "Event",
    "Condition", "Queue", "AbstractFileSystem", "None", "True", "False", "RawValue",
    "ThreadingHTTPServer", "flock", "fork", "torchrun",
}  # fmt: skip

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _quoted() -> list[str]:
    text = DOC.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks: commands, not names
    return re.findall(r"`([^`\n]+)`", text)


def _defined() -> set[str]:
    """Every name a tierfeed module defines: packages, modules, classes, functions, methods,
    attributes assigned at module or class level (``self.x`` too), dataclass fields, and the
    one-word strings the code takes by name (a policy such as ``lru``, a plan's ``global``)."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        names.add(path.stem)
        names.add(path.parent.name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)  # a keyword argument a contract names
            elif isinstance(node, ast.Constant) and NAME.fullmatch(str(node.value)):
                names.add(str(node.value))
    return names


def _members() -> dict[str, set[str]]:
    """Each tierfeed class name -> what its body defines (methods, class attributes, fields,
    ``self.x``) and what its tierfeed bases define: `Class.name` must name one of these."""
    own: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            names = own.setdefault(cls.name, set())  # one name, several classes: their union
            bases.setdefault(cls.name, set()).update(
                ast.unparse(b).split("[")[0].rsplit(".", 1)[-1] for b in cls.bases
            )
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
            for node in cls.body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                targets = [node.target] if isinstance(node, ast.AnnAssign) else targets
                names |= {t.id for t in targets if isinstance(t, ast.Name)}

    def inherited(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out = set(own.get(name, ()))
        for base in bases.get(name, set()) - seen:
            out |= inherited(base, seen | {name})
        return out

    return {name: inherited(name) for name in own}


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?")


def test_no_private_names() -> None:
    private = [q for q in _quoted() if IDENT.fullmatch(q) and re.search(r"(^|\.)_[a-z]", q)]
    assert private == [], private


def test_quoted_names_exist() -> None:
    defined, members = _defined(), _members()
    missing = []
    for q in _quoted():
        if not IDENT.fullmatch(q) or q in EXTERNAL or q.endswith(".py") or q.isupper():
            continue  # not a name; a name of others; a path; a constant of the OS (O_DIRECT)
        name = q.removesuffix("()")
        if name.startswith("tierfeed.") or name == "tierfeed":
            try:
                importlib.import_module(name)
            except ImportError:
                module, _, attr = name.rpartition(".")
                try:
                    ok = hasattr(importlib.import_module(module), attr)
                except ImportError:
                    ok = False
                if not ok:
                    missing.append(q)
            continue
        parts = name.split(".")
        if parts[0] in {"os", "torch", "np", "numpy", "fcntl", "threading", "sys", "time"}:
            continue  # the standard library's and the frameworks' own
        if not all(p in defined for p in parts):
            missing.append(q)
        elif len(parts) == 2 and parts[0] in members and parts[1] not in members[parts[0]]:
            missing.append(q)  # a class's member: defined in that class or a base
    assert missing == [], sorted(set(missing))


def test_quoted_paths_exist() -> None:
    missing = []
    for q in _quoted():
        if " " in q or not re.fullmatch(r"[\w./-]+/?", q) or not (q.endswith((".py", "/"))):
            continue
        bare = "/" not in q and any(SRC.rglob(q))  # a module named in its package's context
        if not bare and not any((base / q).exists() for base in (SRC, ROOT, ROOT / "tests")):
            missing.append(q)
    assert missing == [], missing
