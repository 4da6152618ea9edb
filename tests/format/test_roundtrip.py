"""Pack then read: identical bytes through tierfeed, Python's tarfile and GNU tar."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.format.conftest import QUIET, read_tree, write_tree
from tierfeed import open_store
from tierfeed.format.names import split_file
from tierfeed.format.pack import PackOptions, pack
from tierfeed.storage.files import FdCache

# Name components: printable ASCII, non-ASCII UTF-8, and bytes that are not UTF-8 at all.
_component = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=12)
    .map(os.fsencode)
    .filter(lambda b: b not in (b".", b"..") and len(b) <= 200),
    st.binary(min_size=1, max_size=8).filter(
        lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
    ),
)
_path = st.lists(_component, min_size=1, max_size=3).map(b"/".join)
_trees = st.dictionaries(_path, st.binary(max_size=3000), min_size=1, max_size=12).filter(
    lambda t: not any(a != b and b.startswith(a + b"/") for a in t for b in t)  # file vs dir
)


def _check_store(store_dir: Path, files: dict[bytes, bytes]) -> None:
    with open_store(store_dir) as store:
        got: dict[bytes, bytes] = {}
        for i in range(len(store)):
            sample = store.read_sample(i)
            key = os.fsencode(sample.key)
            for m in store.index.members(i):
                path = store.index.member_path_bytes(m)
                assert split_file(path)[0] == key
                got[path] = store.read_member(m)
            assert sorted(sample.fields) == sorted(
                (e[1:] if len(e) > 1 else e).decode("utf-8", "surrogateescape")
                for e in (split_file(p)[1] for p in got if split_file(p)[0] == key)
            )
        assert got == files
        for path, data in files.items():
            stat = store.stat(path)
            assert not stat.is_dir and stat.size == len(data)


@settings(max_examples=60)
@given(files=_trees, chunk_kib=st.sampled_from([4, 8, 64]))
def test_random_trees_round_trip(
    tmp_path_factory: pytest.TempPathFactory, files, chunk_kib
) -> None:
    root = tmp_path_factory.mktemp("rt")
    write_tree(root / "src", files)
    pack(root / "src", root / "store", PackOptions(chunk_size=chunk_kib * 1024, progress=False))
    _check_store(root / "store", files)
    # Python's tarfile extracts the same bytes.
    out = root / "py"
    for chunk in sorted((root / "store" / "chunks").iterdir()):
        with tarfile.open(chunk, encoding="utf-8", errors="surrogateescape") as tar:
            tar.extractall(out, filter="data")
    assert read_tree(out) == files


TRICKY = {
    b"cat/plain.jpg": b"a" * 1000,
    b"cat/" + b"long" * 40 + b".jpg": b"long name",  # > 100 bytes: pax path record
    "dog/ünïcödé.jpg".encode(): b"unicode",
    b"dog/latin1-\xe9\xff.jpg": b"not utf-8",  # pax hdrcharset=BINARY
    b"dog/a/b/c/d/" + b"x" * 200 + b".png": b"deep and long",
    b"dog/empty.txt": b"",
    b"dog/multi.part.ext": b"two dots",
    b"dog/noext": b"no extension",
}


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar not installed")
def test_gnu_tar_lists_and_extracts_exact_bytes(
    packed: Callable[..., Path], tmp_path: Path
) -> None:
    store = packed(TRICKY)
    out = tmp_path / "gnu"
    out.mkdir()
    listed: set[bytes] = set()
    for chunk in sorted((store / "chunks").iterdir()):
        listing = subprocess.run(
            ["tar", "--quoting-style=literal", "-tf", chunk], capture_output=True, check=True
        )
        listed.update(listing.stdout.splitlines())
        subprocess.run(["tar", "-xf", chunk, "-C", out], check=True, capture_output=True)
    assert listed == set(TRICKY)
    assert read_tree(out) == TRICKY
    _check_store(store, dict(TRICKY))


def test_pack_is_deterministic(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", TRICKY)
    pack(tmp_path / "src", tmp_path / "a", QUIET)
    pack(tmp_path / "src", tmp_path / "b", QUIET)
    assert read_tree(tmp_path / "a") == read_tree(tmp_path / "b")


def test_imagefolder_labels_and_sample_grouping(packed: Callable[..., Path]) -> None:
    store_dir = packed({b"b/x.jpg": b"1", b"b/x.cls": b"7", b"a/y.jpg": b"2", b"a/sub/z.jpg": b"3"})
    with open_store(store_dir) as store:
        assert store.classes == ["a", "b"]
        samples = [store.read_sample(i) for i in range(len(store))]
    assert [(s.key, s.label) for s in samples] == [("a/sub/z", 0), ("a/y", 0), ("b/x", 1)]
    assert samples[2].fields == {"cls": b"7", "jpg": b"1"}


def test_top_level_files_have_no_class_and_keep_the_others_labels(
    packed: Callable[..., Path],
) -> None:
    """torchvision's rule: classes are the top-level directories; a stray README.txt at the
    root is no sample of any class, and does not take the classes away."""
    tree = {b"a/x.jpg": b"1", b"b/y.jpg": b"3", b"README.txt": b"2", b"top.jpg": b"4"}
    with open_store(packed(tree)) as store:
        assert store.classes == ["a", "b"]
        labels = {store.read_sample(i).key: store.read_sample(i).label for i in range(len(store))}
    assert labels == {"README": -1, "a/x": 0, "b/y": 1, "top": -1}


def test_pack_reports_the_unlabelled(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {b"a/x.jpg": b"1", b"README.txt": b"2"})
    report = pack(tmp_path / "src", tmp_path / "store", PackOptions(progress=False))
    assert (report.classes, report.unlabelled) == (1, 1)


def test_each_file_is_a_sample_whatever_dots_its_name_holds(packed: Callable[..., Path]) -> None:
    tree = {
        b"fish/photo.v2.jpg": b"v2",
        b"fish/photo.jpg": b"v1",
        b"fish/.DS_Store": b"mac",
        b"fish/.x.jpg": b"hidden",
        b"fish/log.2024-01-01": b"log",
        b"fish/notes": b"n",
        b"fish/y.jpg": b"y",
        b"fish/y.json": b"{}",  # a sidecar: the same sample as y.jpg
    }
    with open_store(packed(tree)) as store:
        got = {store.read_sample(i).key: store.read_sample(i).fields for i in range(len(store))}
        assert store.index.find_sample("fish/photo") != store.index.find_sample("fish/photo.v2")
        for key in got:
            i = store.index.find_sample(key)
            assert i is not None and store.index.key(i) == key
    assert got == {
        "fish/.DS_Store": {"": b"mac"},
        "fish/.x": {"jpg": b"hidden"},
        "fish/log.2024-01-01": {"": b"log"},
        "fish/notes": {"": b"n"},
        "fish/photo": {"jpg": b"v1"},
        "fish/photo.v2": {"jpg": b"v2"},
        "fish/y": {"jpg": b"y", "json": b"{}"},
    }


def test_group_by_key_is_webdataset_grouping(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {b"s/a.jpg": b"1", b"s/a.seg.png": b"2"})
    options = PackOptions(progress=False, group_by="key")
    pack(tmp_path / "src", tmp_path / "store", options)
    with open_store(tmp_path / "store") as store:
        assert len(store) == 1
        assert store.read_sample(0).fields == {"jpg": b"1", "seg.png": b"2"}


def test_big_file_gets_a_chunk_of_its_own(packed: Callable[..., Path]) -> None:
    files = {b"c/small1.bin": b"s" * 100, b"c/zbig.bin": os.urandom(200_000), b"c/m.bin": b"m"}
    with open_store(packed(files)) as store:
        big = store.index.find_sample("c/zbig")
        assert big is not None
        chunk = int(store.index.sample_chunk[big])
        assert (store.index.sample_chunk == chunk).sum() == 1
        assert store.chunks[chunk].size > QUIET.chunk_size
        assert store.read_sample(big).fields["bin"] == files[b"c/zbig.bin"]


def test_listdir_and_stat_match_the_source(packed: Callable[..., Path], tmp_path: Path) -> None:
    store_dir = packed(TRICKY)
    src = tmp_path / "src"
    with open_store(store_dir) as store:
        for dirpath, dirnames, filenames in os.walk(os.fsencode(src)):
            rel = os.path.relpath(dirpath, os.fsencode(src))
            rel = b"" if rel == b"." else rel
            assert store.listdir(rel) == sorted(
                (os.fsdecode(n) for n in dirnames + filenames), key=os.fsencode
            )
            assert store.stat(rel).is_dir
        with pytest.raises(FileNotFoundError):
            store.stat("dog/missing.jpg")
        with pytest.raises(FileNotFoundError):
            store.listdir("cat/plain.jpg")


def test_reads_use_one_open_per_chunk(packed: Callable[..., Path]) -> None:
    files = {f"c{i % 3}/f{i:04d}.bin".encode(): os.urandom(500) for i in range(300)}
    with open_store(packed(files)) as store:
        for i in range(len(store)):
            store.read_sample(i)
        source = store.source
        assert source.opens == len(store.chunks)  # type: ignore[attr-defined]
        assert source.reads == 300  # type: ignore[attr-defined]


def test_open_ahead_opens_chunks_before_reads(packed: Callable[..., Path]) -> None:
    files = {f"c{i % 3}/f{i:04d}.bin".encode(): os.urandom(3000) for i in range(120)}
    with open_store(packed(files)) as store:
        source = store.source
        chunks = list(range(len(store.chunks)))[::-1]
        source.open_ahead(chunks)  # type: ignore[attr-defined]
        source._driver._fds._ahead.join(timeout=10)  # type: ignore[attr-defined]
        assert source.opens == len(chunks)  # type: ignore[attr-defined]
        for i in range(len(store)):
            store.read_sample(i)
        assert source.opens == len(chunks)  # every read found its file already open  # type: ignore[attr-defined]


def test_threads_racing_for_a_file_open_it_once(tmp_path: Path) -> None:
    # A chunk's copy and its first range reads start together; the origin must see one open.
    path = tmp_path / "chunk.tar"
    path.write_bytes(b"x" * 4096)
    fds = FdCache()
    opened: list[str] = []
    real_open = fds._open_file

    def slow_open(p: str) -> int:
        opened.append(p)
        time.sleep(0.05)  # an open on slow storage: every other thread arrives meanwhile
        return real_open(p)

    fds._open_file = slow_open  # type: ignore[method-assign]
    start = threading.Barrier(8)

    def read() -> bytes:
        start.wait()
        with fds.fd(str(path)) as fd:
            return os.pread(fd, 16, 0)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: read(), range(8)))
    fds.close()
    assert results == [b"x" * 16] * 8
    assert opened == [str(path)]
    assert fds.opens == 1


def test_a_failed_open_is_retried_by_the_next_reader(tmp_path: Path) -> None:
    fds = FdCache()
    missing = str(tmp_path / "later.tar")
    with pytest.raises(FileNotFoundError), fds.fd(missing):
        pass
    Path(missing).write_bytes(b"now")
    with fds.fd(missing) as fd:
        assert os.pread(fd, 3, 0) == b"now"
    fds.close()
