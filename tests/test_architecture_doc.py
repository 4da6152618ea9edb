"""docs/architecture.md names contracts, not private code: every name it quotes exists, the
names its package table calls public are in the `__all__` it says, and every other class or
function it names is listed in its section of internal contracts, which no package exports."""

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
    "ThreadingHTTPServer", "flock", "fork", "torchrun", "pread", "DeprecationWarning",
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


# The section that lists the classes and functions the page names but no package exports.
INTERNAL_HEADING = "## 6. Internal contracts (not public API)"
# A public name in the package table: `module`: `name`, `name`; `module`: ...
EXPORTER = re.compile(r"`(tierfeed(?:\.\w+)*)`:")


def _section(heading: str) -> str:
    text = DOC.read_text()
    assert heading in text, f"docs/architecture.md has no section {heading!r}"
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _names(text: str) -> list[str]:
    """The identifiers quoted in ``text`` (not paths, commands or literals), without ``()``."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    quoted = re.findall(r"`([^`\n]+)`", text)
    return [q.removesuffix("()") for q in quoted if IDENT.fullmatch(q) and not q.endswith(".py")]


def _front_doors() -> dict[str, set[str]]:
    """Each module whose `__all__` is public API -> that `__all__`: the package, each of its
    packages (one without `__all__` exports nothing), and the exception tree (docs/errors.md)."""
    modules = ["tierfeed", "tierfeed.errors"]
    modules += [f"tierfeed.{p.parent.name}" for p in sorted(SRC.glob("*/__init__.py"))]
    return {m: set(getattr(importlib.import_module(m), "__all__", ())) for m in modules}


def _top_level() -> set[str]:
    """The classes and functions tierfeed's modules define at module level."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
    return names


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _table_rows() -> list[list[str]]:
    lines = _section("## 1. Packages and their contracts").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or lines[i][:1] != "|")
    table = lines[start:end]
    return [[c.strip() for c in r.strip("|").split(" | ")] for r in table[2:]]


def test_the_package_tables_public_names_are_exported() -> None:
    doors, wrong = _front_doors(), []
    rows = _table_rows()
    assert len(rows) >= 10, rows
    for package, _promise, public in rows:
        marks = list(EXPORTER.finditer(public))
        if _names(public[: marks[0].start() if marks else len(public)]):
            wrong.append(f"{package}: names before any `module`: {public}")
        for i, mark in enumerate(marks):
            module = mark.group(1)
            end = marks[i + 1].start() if i + 1 < len(marks) else len(public)
            if module not in doors:
                wrong.append(f"{package}: {module} is not a package's front door")
                continue
            for name in _names(public[mark.end() : end]):
                if name not in doors[module]:
                    wrong.append(f"{package}: {name} is not in {module}.__all__")
    assert wrong == [], wrong


def test_internal_contracts_are_defined_and_not_exported() -> None:
    exported = set().union(*_front_doors().values())
    top, internal = _top_level(), _names(_section(INTERNAL_HEADING))
    assert internal, "the internal contracts section names none"
    wrong = [n for n in internal if "." in n or n not in top]
    assert wrong == [], f"not a class or function tierfeed defines at module level: {wrong}"
    public = sorted(n for n in internal if n in exported)
    assert public == [], f"exported, so public: list them in the package table instead: {public}"
    rest = DOC.read_text().split(INTERNAL_HEADING, 1)[0]
    used = {part for name in _names(rest) for part in name.split(".")}
    unused = sorted(set(internal) - used)
    assert unused == [], f"listed as internal but named nowhere else on the page: {unused}"


def test_every_class_and_function_named_is_public_or_internal() -> None:
    """The page may name a contract no package exports only as one: listed in section 6."""
    doors = _front_doors()
    exported = set().union(*doors.values())
    internal = set(_names(_section(INTERNAL_HEADING)))
    members = _members()
    methods = set().union(*(members[n] for n in exported if n in members))
    top, unlisted = _top_level(), []
    for name in _names(DOC.read_text()):
        if name in EXTERNAL:
            continue
        if name.startswith("tierfeed."):  # a module, or `module.attr`
            module, _, attr = name.rpartition(".")
            if attr in doors.get(module, ()) or attr in internal or _is_module(name):
                continue
            unlisted.append(name)  # an attribute of a module that does not export it
            continue
        head = name.split(".")[0]
        if head not in top or head in exported or head in internal:
            continue  # a member, a field or an argument; a public name; a listed contract
        if "." not in name and name in methods:
            continue  # a public class's method named alone (a source's `open_ahead`)
        unlisted.append(name)
    assert unlisted == [], f"list these in {INTERNAL_HEADING!r}: {sorted(set(unlisted))}"
