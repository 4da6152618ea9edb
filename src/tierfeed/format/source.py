"""What to pack: walk a source tree or read a file list into sorted samples with labels."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import DuplicateKeyError, EmptySourceError, PackError, UnreadableFileError
from tierfeed.format.names import label_dir, split_for

__all__ = [
    "SourceDir",
    "SourceFile",
    "SourceSample",
    "SourceTree",
    "assign_labels",
    "file_kind",
    "group_samples",
    "list_files",
    "read_source_file",
    "tree_content",
    "unreadable_error",
    "walk_tree",
]


@dataclass(frozen=True)
class SourceFile:
    """One file to pack: its path in the store, where to read it, and its stat."""

    rel: bytes
    abs: bytes
    size: int
    mtime: int  # seconds (the tar header's)
    mode: int  # permission bits (S_IMODE)
    mtime_ns: int = 0  # the index's


@dataclass(frozen=True)
class SourceDir:
    """One directory of the packed tree (the root's path is empty): its path, mode and mtime."""

    rel: bytes
    mode: int  # permission bits (S_IMODE)
    mtime_ns: int


@dataclass
class SourceSample:
    """Files sharing a key, sorted by extension."""

    key: bytes
    files: list[tuple[bytes, SourceFile]]  # (ext, file)
    label: int = -1


@dataclass
class SourceTree:
    """The sorted samples of a source, its class names and what was skipped."""

    samples: list[SourceSample]
    classes: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    dirs: list[SourceDir] | None = None  # sorted by path; None when not recorded


def unreadable_error(path: bytes | str, reason: str) -> UnreadableFileError:
    """The error for a source file that cannot be packed: names it and says what to do."""
    return UnreadableFileError(
        f"{os.fsdecode(path)}: {reason}; fix or remove it, or pass --skip-unreadable to skip "
        "such files (they are then counted and listed)"
    )


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file of this st_mode is, in words (for messages)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _stat_file(rel: bytes, path: bytes, skipped: list[tuple[str, str]] | None) -> SourceFile | None:
    """Stat a source file (symlinks followed); only a regular file is packed.

    A device, FIFO or socket is never opened: reading one could block forever (a FIFO) or
    never end (``/dev/zero``).
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        reason = "broken symlink" if os.path.islink(path) else (exc.strerror or str(exc))
    else:
        if stat.S_ISREG(st.st_mode):
            mode = stat.S_IMODE(st.st_mode)
            return SourceFile(rel, path, st.st_size, int(st.st_mtime), mode, st.st_mtime_ns)
        via = ", through a symlink" if os.path.islink(path) else ""
        reason = f"not a regular file ({file_kind(st.st_mode)}{via}); only regular files are packed"
    if skipped is None:
        raise unreadable_error(path, reason)
    skipped.append((os.fsdecode(rel), reason))
    return None


def _list_dir(
    path: bytes, ancestors: tuple[tuple[int, int], ...]
) -> tuple[os.stat_result, list[os.DirEntry[bytes]]] | str:
    """A directory's stat and its entries sorted by name, or why it cannot be walked."""
    try:
        st = os.stat(path)
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        return f"cannot list directory ({exc.strerror or exc})"
    if (st.st_dev, st.st_ino) in ancestors:
        return "symlink loop (it leads back to one of its parents)"
    return st, entries


def _entries(
    rel_dir: bytes, entries: list[os.DirEntry[bytes]], skipped: list[tuple[str, str]] | None
) -> Iterator[tuple[bytes, bool, SourceFile | None]]:
    """(path, is a directory, the file) of each entry of directory ``rel_dir``, last first
    (the walk's stack then pops them in order); every entry but a directory is stat'ed, so
    that odd types are named, not ignored (None: skipped)."""
    for entry in reversed(entries):
        rel = rel_dir + b"/" + entry.name if rel_dir else entry.name
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        yield rel, is_dir, None if is_dir else _stat_file(rel, entry.path, skipped)


def walk_tree(
    root: Path,
    skipped: list[tuple[str, str]] | None = None,
    exclude: Path | None = None,
    dirs: list[SourceDir] | None = None,
) -> list[SourceFile]:
    """Every regular file under ``root`` (symlinks followed, loops refused), sorted by path.

    Args:
        root: the source directory.
        skipped: collect unreadable files, non-regular files and unlistable directories
            here instead of raising.
        exclude: a directory to leave out (the destination, should a symlink in the source
            lead to it: a destination inside the source itself is refused earlier).
        dirs: collect every directory walked here, sorted by path: the root (path ``b""``)
            and every other, empty ones included (skipped and excluded ones left out).

    Raises:
        UnreadableFileError: a file or directory cannot be read, is not a regular file or a
            directory (a device, FIFO or socket), or a symlink loops.
    """
    base = os.fsencode(root)
    excluded = os.stat(exclude) if exclude is not None and exclude.exists() else None
    found: list[SourceFile] = []
    # Depth-first with the (dev, inode) of each directory on the path: a link up is caught.
    stack: list[tuple[bytes, tuple[tuple[int, int], ...]]] = [(b"", ())]
    while stack:
        rel_dir, ancestors = stack.pop()
        path = os.path.join(base, rel_dir) if rel_dir else base
        listing = _list_dir(path, ancestors)
        if isinstance(listing, str):
            if skipped is None or not rel_dir:  # the source itself cannot be skipped
                raise unreadable_error(path, listing)
            skipped.append((os.fsdecode(rel_dir), listing))
            continue
        st, entries = listing
        ident = (st.st_dev, st.st_ino)
        if excluded is not None and ident == (excluded.st_dev, excluded.st_ino):
            continue
        if dirs is not None:
            dirs.append(SourceDir(rel_dir, stat.S_IMODE(st.st_mode), st.st_mtime_ns))
        for rel, is_dir, info in _entries(rel_dir, entries, skipped):
            if is_dir:
                stack.append((rel, (*ancestors, ident)))
            elif info is not None:
                found.append(info)
    found.sort(key=lambda f: f.rel)
    if dirs is not None:
        dirs.sort(key=lambda d: d.rel)
    return found


def tree_content(
    files: Sequence[SourceFile], kept: npt.NDArray[np.bool_], dirs: list[SourceDir] | None
) -> dict[str, Any]:
    """The tree fields of `IndexContent` (all None when ``dirs`` was not recorded): the modes
    and mtimes of the ``kept`` files, the directories but the root, and the root's."""
    if dirs is None:
        return {}
    n = len(files)
    modes = np.fromiter((f.mode for f in files), dtype=np.uint16, count=n)
    mtimes = np.fromiter((f.mtime_ns for f in files), dtype=np.int64, count=n)
    inner = [d for d in dirs if d.rel]
    return {
        "member_mode": modes[kept],
        "member_mtime": mtimes[kept],
        "dir_paths": [d.rel for d in inner],
        "dir_mode": np.array([d.mode for d in inner], dtype=np.uint16),
        "dir_mtime": np.array([d.mtime_ns for d in inner], dtype=np.int64),
        "root": next(((d.mode, d.mtime_ns) for d in dirs if not d.rel), None),
    }


@contextlib.contextmanager
def opened_source(f: SourceFile) -> Iterator[int]:
    """The listed file ``f`` open, without blocking (a FIFO swapped in since the listing cannot
    hang the pack), checked with fstat to be a regular file; an OSError within names it."""
    fd = -1
    try:
        fd = os.open(f.abs, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise unreadable_error(
                f.abs,
                f"not a regular file any more ({file_kind(mode)}); only regular files are packed",
            )
        yield fd
    except OSError as exc:
        raise unreadable_error(f.abs, exc.strerror or str(exc)) from None
    finally:
        if fd >= 0:
            os.close(fd)


def check_read_size(f: SourceFile, got: int) -> None:
    """``got`` bytes read of ``f`` (asked: its size + 1) not its size: an error naming it."""
    if got != f.size:
        change = f"grew (more than {f.size} bytes)" if got > f.size else f"shrank to {got} bytes"
        raise unreadable_error(
            f.abs, f"{change} during the pack (listed with {f.size} bytes); is it being written?"
        )


def read_source_file(f: SourceFile) -> bytes:
    """The bytes of a listed file, asking for its size + 1 (`check_read_size`)."""
    parts: list[bytes] = []
    got = 0
    with opened_source(f) as fd:
        while got <= f.size:  # the + 1 byte tells a file that grew from one that did not
            part = os.read(fd, f.size + 1 - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
    check_read_size(f, got)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def list_files(
    root: Path,
    listing: Path,
    skipped: list[tuple[str, str]] | None,
    dirs: list[SourceDir] | None = None,
) -> list[SourceFile]:
    """The files named in ``listing`` (one path relative to ``root`` per line), sorted.

    ``dirs`` collects the directories the listed files lie in (each with every parent, the
    root's path ``b""`` included), sorted by path, and no others.

    Raises:
        PackError: the listing itself cannot be read.
        UnreadableFileError: a listed file cannot be packed (unless ``skipped`` collects it).
    """
    base = os.fsencode(root)
    found: list[SourceFile] = []
    try:
        raw_lines = listing.read_bytes().splitlines()
    except OSError as exc:
        raise PackError(
            f"{listing}: cannot read this --files listing ({exc.strerror or exc}); give a file "
            "with one path relative to SRC per line"
        ) from None
    for lineno, line in enumerate(raw_lines, 1):
        rel = line.strip(b"/").rstrip(b"\r")
        if not rel:
            continue
        if b"\0" in rel or b".." in rel.split(b"/"):
            raise UnreadableFileError(
                f"{listing}:{lineno}: path {os.fsdecode(rel)!r} leaves the source directory"
            )
        info = _stat_file(rel, os.path.join(base, rel), skipped)
        if info is not None:
            found.append(info)
    found.sort(key=lambda f: f.rel)
    if dirs is not None:
        dirs.extend(_parent_dirs(base, [f.rel for f in found]))
    return found


def _parent_dirs(base: bytes, rels: list[bytes]) -> list[SourceDir]:
    """The directories holding ``rels`` and all their parents (the root: ``b""``), stat'ed."""
    wanted: set[bytes] = {b""}
    for rel in rels:
        parent = rel.rpartition(b"/")[0]
        while parent and parent not in wanted:
            wanted.add(parent)
            parent = parent.rpartition(b"/")[0]
    out: list[SourceDir] = []
    for rel in sorted(wanted):
        try:
            st = os.stat(os.path.join(base, rel) if rel else base)
        except OSError as exc:
            raise unreadable_error(os.path.join(base, rel), exc.strerror or str(exc)) from None
        out.append(SourceDir(rel, stat.S_IMODE(st.st_mode), st.st_mtime_ns))
    return out


def group_samples(
    files: Iterable[SourceFile],
    labels: str,
    source: Path,
    grouping: str = "file",
    dirs: Iterable[SourceDir] = (),
) -> SourceTree:
    """Group files into samples by key; derive ImageFolder labels when asked.

    Args:
        files: the files, sorted by path.
        labels: ``"auto"`` (class = top-level directory, as torchvision's ImageFolder),
            ``"folder"`` (the same, and a file at the top level is an error), or ``"none"``.
        source: the source, for error messages.
        grouping: ``"file"``: a sample is a file (its key is its path without its extension;
            files that differ only in their extension, a sidecar ``x.json`` beside ``x.jpg``,
            are one sample); ``"key"``: WebDataset's rule (the path up to the first dot).
        dirs: the tree's directories: a top-level one is a class even with no file in it,
            as for torchvision (which numbers classes over every top-level directory).
    """
    split = split_for(grouping)
    by_key: dict[bytes, SourceSample] = {}
    for f in files:
        key, ext = split(f.rel)
        sample = by_key.setdefault(key, SourceSample(key, []))
        if any(e == ext for e, _ in sample.files):
            raise DuplicateKeyError(
                f"{source}: {os.fsdecode(f.rel)!r} is listed twice (sample key "
                f"{os.fsdecode(key)!r}, extension {os.fsdecode(ext)!r}); remove the duplicate"
            )
        sample.files.append((ext, f))
    if not by_key:
        raise EmptySourceError(f"{source}: no file to pack (the source is empty)")
    samples = [by_key[k] for k in sorted(by_key)]
    for s in samples:
        s.files.sort(key=lambda item: item[0])
    top = [d.rel for d in dirs if d.rel and b"/" not in d.rel]
    labels_of, classes = assign_labels([s.key for s in samples], labels, source, top)
    for s, label in zip(samples, labels_of, strict=True):
        s.label = label
    return SourceTree(samples, classes)


def assign_labels(
    keys: list[bytes], mode: str, source: Path, top_dirs: Iterable[bytes] = ()
) -> tuple[list[int], list[str]]:
    """ImageFolder labels of sample keys, as torchvision's ``find_classes`` gives them: the
    classes are the top-level directories, sorted; a sample's class is its first directory.

    A sample at the top level belongs to no class (label -1) and does not take the others'
    labels away (torchvision ignores files at the root); callers count and report them.

    Args:
        keys: sample keys in store order.
        mode: ``auto`` (as above), ``folder`` (as above, and a top-level sample is an error)
            or ``none`` (all -1, no classes).
        source: the source, for error messages.
        top_dirs: top-level directories of the tree, classes even when they hold no sample.

    Returns:
        (label per key, sorted class names).
    """
    if mode == "none":
        return [-1] * len(keys), []
    dirs = [label_dir(k) for k in keys]
    if mode == "folder" and None in dirs:
        top = next(k for k, d in zip(keys, dirs, strict=True) if d is None)
        raise PackError(
            f"{source}: --labels folder needs every file inside a class directory, but "
            f"{os.fsdecode(top)!r} is at the top level; move it, or use --labels auto (it "
            "then has label -1)"
        )
    names = sorted({d for d in dirs if d is not None} | set(top_dirs))
    number = {n: i for i, n in enumerate(names)}
    return [-1 if d is None else number[d] for d in dirs], [os.fsdecode(n) for n in names]
