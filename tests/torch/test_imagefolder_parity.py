"""ImageFolder parity: a store of a messy tree gives torchvision's samples, in its order.

torchvision does not import beside this torch, so its rules (``find_classes`` and
``make_dataset`` of torchvision 0.2x) are re-implemented here on the source tree, with
``os.scandir`` and ``os.walk`` exactly as torchvision calls them, and compared with
`tierfeed.torch.ImageFolder` on the packed store. A second re-implementation walks the store's
own tree view (`Store.listdir`/`Store.stat`) the same way, which proves the vectorised
selection equal to a literal walk.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.format.conftest import write_tree
from tests.hostile.indexedit import content_without_tree
from tierfeed.errors import ConfigError, NotFoundError
from tierfeed.format.index import Index, IndexContent, write_index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.compose import open_store
from tierfeed.storage.store import Store
from tierfeed.torch import IMG_EXTENSIONS, ImageFolder
from tierfeed.torch.imagefolder import make_dataset

# --- torchvision 0.2x's rules, on a real directory ---------------------------------------


def tv_find_classes(directory: str) -> tuple[list[str], dict[str, int]]:
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {c: i for i, c in enumerate(classes)}


def tv_make_dataset(
    directory: str,
    class_to_idx: dict[str, int],
    extensions: str | Sequence[str] | None = None,
    is_valid_file: Callable[[str], bool] | None = None,
    allow_empty: bool = False,
) -> list[tuple[str, int]]:
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("Both extensions and is_valid_file cannot be None or not None")
    if extensions is not None:
        exts = extensions if isinstance(extensions, str) else tuple(extensions)

        def is_valid_file(x: str) -> bool:
            return x.lower().endswith(exts)

    assert is_valid_file is not None
    instances = []
    available = set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if is_valid_file(path):
                    instances.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx) - available
    if empty and not allow_empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}.")
    return instances


def torchvision_samples(src: Path, **kwargs: object) -> list[tuple[str, int]]:
    """torchvision's ImageFolder samples of ``src``, paths made relative to ``src``."""
    if kwargs.get("is_valid_file") is None and kwargs.get("extensions") is None:
        kwargs["extensions"] = IMG_EXTENSIONS
    top = os.fspath(src)
    _, class_to_idx = tv_find_classes(top)
    found = tv_make_dataset(top, class_to_idx, **kwargs)  # type: ignore[arg-type]
    return [(os.path.relpath(p, top), t) for p, t in found]


# --- the same rules, walking the store's tree view -----------------------------------------


def store_walk(store: Store, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` (top-down) over the store's tree: listdir, and stat to tell dirs from files."""
    dirs: list[str] = []
    files: list[str] = []
    for name in store.listdir(top):
        (dirs if store.stat(f"{top}/{name}").is_dir else files).append(name)
    yield top, dirs, files
    for d in dirs:
        yield from store_walk(store, f"{top}/{d}")


def walk_samples(store: Store, keep: Callable[[str], bool]) -> list[tuple[str, int]]:
    classes = sorted(n for n in store.listdir("") if store.stat(n).is_dir)
    found = []
    for index, cls in enumerate(classes):
        for root, _, fnames in sorted(store_walk(store, cls)):
            for fname in sorted(fnames):
                path = f"{root}/{fname}"
                if keep(path):
                    found.append((path, index))
    return found


# --- the messy tree ----------------------------------------------------------------------

MESSY: dict[bytes, bytes] = {
    b"README.md": b"top-level file: no sample",
    b"top.jpg": b"top-level image: no sample either",
    b"cat/.DS_Store": b"finder",
    b"cat/notes.txt": b"notes",
    b"cat/.x.jpg": b"hidden image: a sample",
    b"cat/photo.v2.jpg": b"dots in the name",
    b"cat/photo.v2.json": b"sidecar",
    b"cat/IMG_1.JPG": b"upper-case extension",
    b"cat/A.jpg": b"A",
    b"cat/a.jpg": b"a",
    b"cat/b.jpeg": b"b",
    b"cat/README": b"no extension",
    b"cat/x.tar.gz": b"not an image",
    b"cat/sub/x.png": b"nested",
    b"cat/sub/deeper/z.jpeg": b"deeper",
    b"cat/sub-x/y.png": b"'-' sorts before '/'",
    b"cat/sub.d/w.webp": b"'.' sorts before '/' too",
    b"cat/sub0/v.tif": b"'0' sorts after '/'",
    b"cat/z.bmp": b"a file after the subdirectories' names",
    b"cat/\xc3\xa9t\xc3\xa9.png": "été".encode(),
    b"cat/\xff\xfe.png": b"not UTF-8",
    b"cat/\xe2\x82\xac.png": b"euro",
    b"dog/1.png": b"1",
    b"dog/10.png": b"10",
    b"dog/2.png": b"2",
    b"dog/archive.jpg.txt": b"txt",
    b"dog/strange.jpgx": b"jpgx",
    b"dog/TIFF.TIFF": b"tiff",
    b"a/x.jpg": b"class a",
    b"a/b/z.jpg": b"a/b after a-b? no: classes first",
    b"a-b/y.jpg": b"class a-b",
    b"a.b/y.PPM": b"a class name with a dot",
    b"Zebra/q.pgm": b"upper case sorts first",
    b"junk/.DS_Store": b"a class with no image",
    b"junk/deep/notes.txt": b"still none",
}


def make_messy(root: Path) -> Path:
    src = root / "src"
    base = os.fsencode(src)
    write_tree(src, MESSY)
    os.symlink(os.path.join(base, b"cat", b"sub"), os.path.join(base, b"dog", b"linked"))
    os.mkdir(src / "empty_class")  # a class folder with no file yet: still a class
    os.makedirs(src / "cat" / "empty" / "deeper")  # empty directories inside a class
    return src


@pytest.fixture(scope="module", params=["file", "key"])
def messy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"messy-{request.param}")
    src = make_messy(root)
    options = PackOptions(chunk_size=4096, progress=False, group_by=request.param)
    pack(src, root / "store", options)
    return root


def test_messy_tree_samples_match_torchvision(messy: Path) -> None:
    want = torchvision_samples(messy / "src", allow_empty=True)
    ds = ImageFolder(messy / "store", allow_empty=True)
    assert ds.classes == sorted(["cat", "dog", "a", "a-b", "a.b", "Zebra", "junk", "empty_class"])
    assert ds.samples == want
    assert ds.imgs is ds.samples
    assert ds.targets == [t for _, t in want]
    paths = [p for p, _ in ds.samples]
    assert "cat/.x.jpg" in paths and "dog/linked/deeper/z.jpeg" in paths
    assert not {"cat/.DS_Store", "cat/notes.txt", "top.jpg", "dog/strange.jpgx"} & set(paths)


def test_messy_tree_is_valid_file_and_extensions(messy: Path) -> None:
    seen: list[str] = []

    def valid(path: str) -> bool:
        seen.append(path)
        return "/." not in path  # every file that is not hidden

    want = torchvision_samples(messy / "src", is_valid_file=valid, allow_empty=True)
    want_calls, seen[:] = list(seen), []
    ds = ImageFolder(messy / "store", is_valid_file=valid, allow_empty=True)
    assert ds.samples == want and ds.extensions is None
    assert seen == [os.path.relpath(p, messy / "src") for p in want_calls]  # same calls, order
    txt = ImageFolder(messy / "store", allow_empty=True, extensions=(".txt", ".TIFF"))
    want = torchvision_samples(messy / "src", extensions=(".txt", ".TIFF"), allow_empty=True)
    assert txt.samples == want and [p for p, _ in want] == [
        "cat/notes.txt",
        "dog/archive.jpg.txt",
        "junk/deep/notes.txt",  # torchvision does not lower-case the extensions given
    ]


def test_reads_the_file_at_each_path(messy: Path) -> None:
    ds = ImageFolder(messy / "store", loader=lambda path: Path(path).read_bytes(), allow_empty=True)
    with open_store(messy / "store") as store:
        for i, (path, target) in enumerate(ds.samples):
            image, label = ds[i]
            assert label == target
            assert image == (messy / "src" / path).read_bytes()
            assert store.read_member(store.stat(path).member) == image


def test_vectorised_selection_equals_a_walk_of_the_store_tree(messy: Path) -> None:
    with open_store(messy / "store") as store:
        everything = walk_samples(store, lambda p: True)
        images = walk_samples(store, lambda p: p.lower().endswith(IMG_EXTENSIONS))
        _, class_to_idx = tv_find_classes(os.fspath(messy / "src"))
        got, members = make_dataset(
            store, class_to_idx, is_valid_file=lambda p: True, allow_empty=True
        )
        assert got == everything
        assert members.tolist() == [store.stat(p).member for p, _ in got]
        got, _ = make_dataset(store, class_to_idx, IMG_EXTENSIONS, allow_empty=True)
        assert got == images


def test_empty_class_is_a_file_not_found_error(messy: Path) -> None:
    with pytest.raises(FileNotFoundError, match="empty_class, junk"):
        torchvision_samples(messy / "src")
    with pytest.raises(NotFoundError, match=r"empty_class, junk.*allow_empty=True") as caught:
        ImageFolder(messy / "store")
    assert isinstance(caught.value, FileNotFoundError)
    assert str(messy / "store") in str(caught.value)


def test_a_store_without_the_tree_behaves_as_before(messy: Path, tmp_path: Path) -> None:
    """An index without the tree (written before it existed, or by `tierfeed index`) knows
    only the directories that hold files: no empty class."""
    (tmp_path / "chunks").symlink_to(messy / "store" / "chunks")
    with Index(messy / "store") as ix:
        content = content_without_tree(ix)
    write_index(tmp_path / INDEX_NAME, content)
    full = ImageFolder(messy / "store", allow_empty=True)
    old = ImageFolder(tmp_path, allow_empty=True)
    assert old.classes == [c for c in full.classes if c != "empty_class"]
    assert [p for p, _ in old.samples] == [p for p, _ in full.samples]
    with pytest.raises(NotFoundError, match=r"classes junk \("):
        ImageFolder(tmp_path)


def test_both_extensions_and_is_valid_file_is_a_value_error(messy: Path) -> None:
    with pytest.raises(ValueError):
        torchvision_samples(messy / "src", extensions=".jpg", is_valid_file=bool)
    with pytest.raises(ConfigError, match="exactly one") as caught:
        ImageFolder(messy / "store", is_valid_file=bool, extensions=".jpg")
    assert isinstance(caught.value, ValueError)


# --- the order, property-tested on indexes of random trees --------------------------------

_NAMES = st.text(alphabet="aAb-._0é\udcff", min_size=1, max_size=4).filter(
    lambda n: n not in (".", "..")
)
_TREES = st.lists(st.lists(_NAMES, min_size=1, max_size=4).map("/".join), min_size=1, max_size=40)


def index_of_paths(where: Path, paths: list[str]) -> None:
    """An index whose members are ``paths`` (one member per sample, no chunk data)."""
    raw = sorted({os.fsencode(p) for p in paths})
    n = len(raw)
    write_index(
        where / INDEX_NAME,
        IndexContent(
            keys=raw,
            labels=np.full(n, -1, dtype=np.int32),
            member_start=np.arange(n + 1, dtype=np.uint64),
            member_chunk=np.zeros(n, dtype=np.uint32),
            member_offset=np.zeros(n, dtype=np.uint64),
            member_length=np.zeros(n, dtype=np.uint64),
            member_checksum=np.zeros(n, dtype=np.uint64),
            member_ext=np.zeros(n, dtype=np.uint16),
            exts=[b""],
            chunk_names=["chunks/000000.tar"],
            chunk_size=np.zeros(1, dtype=np.uint64),
            chunk_checksum=np.zeros(1, dtype=np.uint64),
        ),
    )


def consistent_tree(paths: list[str]) -> list[str]:
    """Drop paths that would make a file and a directory of one name (not a tree)."""
    kept: list[str] = []
    dirs: set[str] = set()
    for p in sorted(set(paths), key=lambda p: (p.count("/"), p), reverse=True):
        parts = p.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if p in dirs or any(q in kept for q in prefixes):
            continue
        kept.append(p)
        dirs.update(prefixes)
    return kept


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(paths=_TREES)
def test_order_equals_the_walk_on_random_trees(tmp_path: Path, paths: list[str]) -> None:
    tree = consistent_tree(paths)
    for old in tmp_path.glob("*"):
        old.unlink()
    index_of_paths(tmp_path, tree)
    with open_store(tmp_path) as store:
        want = walk_samples(store, lambda p: True)
        classes = sorted(n for n in store.listdir("") if store.stat(n).is_dir)
        if not classes:
            return
        got, members = make_dataset(
            store, {c: i for i, c in enumerate(classes)}, is_valid_file=lambda p: True
        )
        assert got == want
        assert members.tolist() == [store.stat(p).member for p, _ in got]
