"""`tierfeed.Writer` and `tierfeed.optimize`: stores written from Python, crash safety, hostile
samples, and optimize's processes giving the same store as one Writer."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tierfeed import Writer, open_store, optimize, verify_store
from tierfeed.errors import (
    BadMemberError,
    ConfigError,
    DuplicateKeyError,
    PackError,
    TierfeedError,
)
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.tarchunk import member_header
from tierfeed.publish import is_temporary


def make_sample(i: int) -> dict[str, Any]:
    """A module-level fn, so that spawned optimize workers can import it."""
    return {"__key__": f"s/{i:05d}", "jpg": bytes([i % 251]) * (300 + 37 * i), "cls": i % 3}


def keyless(i: int) -> dict[str, Any]:
    return {"txt": f"sample {i}"}


def fails_at_five(i: int) -> dict[str, Any]:
    if i == 5:
        raise RuntimeError("no such image")
    return make_sample(i)


def same_key(i: int) -> dict[str, Any]:
    return {"__key__": "twin" if i in (2, 7) else f"k{i}", "txt": "x"}


def dies_at_three(i: int) -> dict[str, Any]:
    if i == 3:
        os._exit(3)  # as if killed: no exception, no message
    return make_sample(i)


def bad_key_at_four(i: int) -> dict[str, Any]:
    return {"__key__": "../up" if i == 4 else f"k{i}", "txt": "x"}


def contents(store_dir: Path) -> list[tuple[str, int, dict[str, bytes]]]:
    with open_store(store_dir) as store:
        return [
            (s.key, s.label, dict(s.fields))
            for s in (store.read_sample(i) for i in range(len(store)))
        ]


def test_round_trip_keys_fields_labels_classes(tmp_path: Path) -> None:
    with Writer(tmp_path / "st", chunk_size=8192, classes=["cat", "dog", "fish"]) as w:
        for i in range(30):
            w.write(make_sample(i))
        w.write({"__key__": "extra/one", "txt": "héllo", "json": bytearray(b"{}")})
    assert w.report is not None and w.report.samples == 31
    with open_store(tmp_path / "st") as store:
        assert store.classes == ["cat", "dog", "fish"]
        first = store.read_sample(4)
        assert first.key == "s/00004" and first.label == 1
        assert first.fields == {"cls": b"1", "jpg": bytes([4]) * (300 + 37 * 4)}
        last = store.read_sample(30)
        assert last.label == -1 and last.fields == {"json": b"{}", "txt": "héllo".encode()}
        assert store.listdir("s")[:2] == ["00000.cls", "00000.jpg"]
    assert verify_store(tmp_path / "st", progress=False) == []


def test_chunk_sizes_are_respected(tmp_path: Path) -> None:
    with Writer(tmp_path / "st", chunk_size=8192) as w:
        for i in range(40):
            w.write(make_sample(i))
        w.write({"__key__": "big", "bin": b"b" * 20000})  # larger than a chunk: its own chunk
    with open_store(tmp_path / "st") as store:
        sizes = [c.size for c in store.chunks]
        assert len(sizes) > 5
        assert all(size <= 8192 for size in sizes[:-1])
        assert sizes[-1] > 20000
        assert store.index.sample_chunk[-1] == len(sizes) - 1  # alone in the last chunk
    for chunk in (tmp_path / "st" / "chunks").iterdir():  # plain tar, as `tar -tvf` sees it
        with tarfile.open(chunk) as tar:
            assert all(m.isfile() and m.mtime == 0 for m in tar.getmembers())


def test_labels_without_classes_are_named_by_number(tmp_path: Path) -> None:
    with Writer(tmp_path / "st") as w:
        w.write({"__key__": "a", "jpg": b"1", "cls": 2})
        w.write({"__key__": "b", "jpg": b"2", "cls": b"0"})  # integer text counts as well
        w.write({"__key__": "c", "jpg": b"3", "cls2": 1})
    with open_store(tmp_path / "st") as store:
        assert store.classes == ["0", "1", "2"]
        assert [int(x) for x in store.index.sample_label] == [2, 0, 1]


def test_folder_labels_as_pack_gives_them(tmp_path: Path) -> None:
    with Writer(tmp_path / "st") as w:
        for key in ("dog/1", "cat/1", "dog/2"):
            w.write({"__key__": key, "jpg": b"x"})
    with open_store(tmp_path / "st") as store:
        assert store.classes == ["cat", "dog"]
        assert [store.read_sample(i).label for i in range(3)] == [1, 0, 1]


def test_generated_keys_follow_write_order(tmp_path: Path) -> None:
    with Writer(tmp_path / "st") as w:
        for i in range(3):
            w.write(keyless(i))
    assert [k for k, _, _ in contents(tmp_path / "st")] == ["000000000", "000000001", "000000002"]


def test_exception_in_with_leaves_no_index(tmp_path: Path) -> None:
    dst = tmp_path / "st"
    with pytest.raises(RuntimeError, match="boom") as info, Writer(dst, chunk_size=8192) as w:
        for i in range(20):
            w.write(make_sample(i))
        raise RuntimeError("boom")
    assert any("no index was written" in note for note in info.value.__notes__)
    assert not (dst / INDEX_NAME).exists()
    assert list((dst / "chunks").iterdir()) == []
    with pytest.raises(TierfeedError, match="no index"):
        open_store(dst)
    with Writer(dst) as w2:  # nothing left behind: a new write needs no overwrite
        w2.write(make_sample(1))
    assert len(contents(dst)) == 1


def test_interrupted_write_is_refused_without_overwrite(tmp_path: Path) -> None:
    dst = tmp_path / "st"
    w = Writer(dst, chunk_size=8192)
    for i in range(20):
        w.write(make_sample(i))
    w._release()  # as if the process died: chunks on disk, no index, the lock gone
    assert not (dst / INDEX_NAME).exists()
    assert any(is_temporary(p.name) for p in (dst / "chunks").iterdir())
    with pytest.raises(PackError, match=r"interrupted.*cannot resume.*overwrite=True"):
        Writer(dst)
    with Writer(dst, overwrite=True) as again:
        again.write(make_sample(3))
    assert [k for k, _, _ in contents(dst)] == ["s/00003"]
    assert [p.name for p in (dst / "chunks").iterdir()] == ["000000.tar"]


def test_existing_store_needs_overwrite_and_one_writer_at_a_time(tmp_path: Path) -> None:
    dst = tmp_path / "st"
    with Writer(dst) as w:
        w.write(make_sample(0))
    with pytest.raises(PackError, match="already holds a store"):
        Writer(dst)
    first = Writer(dst, overwrite=True)
    assert not (dst / INDEX_NAME).exists()  # the old index goes first
    with pytest.raises(PackError, match="another tierfeed writer"):
        Writer(dst, overwrite=True)
    first.abort()


def test_empty_writer_writes_no_index(tmp_path: Path) -> None:
    with pytest.raises(TierfeedError, match="no sample"), Writer(tmp_path / "st"):
        pass
    assert not (tmp_path / "st" / INDEX_NAME).exists()


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("sample", "error", "match"),
    [
        ({"__key__": "../escape", "jpg": b"1"}, BadMemberError, r"'\.\./escape'.*'\.\.'"),
        ({"__key__": "a/../../b", "jpg": b"1"}, BadMemberError, r"'a/\.\./\.\./b'"),
        ({"__key__": "/etc/passwd", "jpg": b"1"}, BadMemberError, r"'/etc/passwd'.*absolute"),
        ({"__key__": "a\0b", "jpg": b"1"}, BadMemberError, "NUL"),
        ({"__key__": "a/./b", "jpg": b"1"}, BadMemberError, r"'a/\./b'.*'\.' component"),
        ({"__key__": "a//b", "jpg": b"1"}, BadMemberError, r"'a//b'.*empty"),
        ({"__key__": "", "jpg": b"1"}, BadMemberError, "empty"),
        ({"__key__": 7, "jpg": b"1"}, BadMemberError, "must be a str"),
        ({"__key__": "k", "a/b": b"1"}, BadMemberError, r"'k'.*'a/b'"),
        ({"__key__": "k", "a\0": b"1"}, BadMemberError, r"'k'.*NUL"),
        ({"__key__": "k", "jpg": 3.5}, PackError, r"'k'.*'jpg' is a float"),
        ({"__key__": "k", "jpg": 3}, PackError, r"'k'.*'jpg' is a int"),
        ({"__key__": "k", "jpg": None}, PackError, r"'k'.*NoneType"),
        ({"__key__": "k", "cls": 2.5}, PackError, r"'k'.*'cls' is a float"),  # (a bool: 1 or 0)
        ({"__key__": "k", "cls": "three"}, PackError, r"'k'.*integer text"),
        ({"__key__": "k", "cls": 2**40}, PackError, "outside"),
        ({"__key__": "k"}, PackError, r"'k' has no field"),
        ({"__key__": "k", "txt": "\ud800"}, PackError, r"'k'.*not valid Unicode"),
    ],
)
def test_hostile_samples_are_refused(
    tmp_path: Path, sample: dict[str, Any], error: type[Exception], match: str
) -> None:
    dst = tmp_path / "st"
    with pytest.raises(error, match=match), Writer(dst) as w:
        w.write({"__key__": "ok", "jpg": b"1"})
        w.write(sample)
    assert not (dst / INDEX_NAME).exists()
    assert not list(dst.rglob("*.tar"))  # nothing written outside, nothing kept
    assert not (tmp_path / "escape.jpg").exists()


@pytest.mark.hostile
def test_duplicate_key_and_file_over_directory(tmp_path: Path) -> None:
    with (
        pytest.raises(DuplicateKeyError, match="'a/b' is written twice"),
        Writer(tmp_path / "1") as w,
    ):
        w.write({"__key__": "a/b", "jpg": b"1"})
        w.write({"__key__": "a/b", "png": b"2"})
    with (
        pytest.raises(BadMemberError, match=r"'x\.jpg'.*also a directory"),
        Writer(tmp_path / "2") as w,
    ):
        w.write({"__key__": "x", "jpg": b"1"})
        w.write({"__key__": "x.jpg/y", "png": b"2"})


def test_the_keys_pack_makes_are_writable(tmp_path: Path) -> None:
    # Issue 33, friction 3: a store rebuilt from Python with the keys pack gave it. One file
    # per sample: dotted names keep their dots in the key, a file without an extension is
    # the field "" (its path is the key itself).
    from tests.format.conftest import write_tree
    from tierfeed.format.pack import PackOptions, pack

    files = {
        b"cat dog/a.b.c.248.jpg": b"1",
        b"cat dog/photo.v2.png": b"2",
        b"cat dog/.DS_Store": b"3",
        b"README": b"4",
        b"fish/log.2024-01-01": b"5",
    }
    write_tree(tmp_path / "tree", files)
    pack(tmp_path / "tree", tmp_path / "packed", PackOptions(progress=False))
    packed = contents(tmp_path / "packed")
    assert "cat dog/a.b.c.248" in [key for key, _, _ in packed]
    with Writer(tmp_path / "written") as w:
        for key, _, fields in packed:
            w.write({"__key__": key, **fields})
    assert contents(tmp_path / "written") == packed
    assert verify_store(tmp_path / "written", progress=False) == []


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("first", "second", "match"),
    [
        ({"__key__": "a.b", "c": b"1"}, {"__key__": "a", "b.c": b"2"}, r"'a\.b\.c'.*twice"),
        ({"__key__": "a", "": b"1"}, {"__key__": "a/b", "jpg": b"2"}, r"'a'.*also a directory"),
        ({"__key__": "a/x.v", "": b"1"}, {"__key__": "a/x", "v": b"2"}, r"'a/x\.v'.*twice"),
    ],
)
def test_two_samples_naming_one_path_are_refused(
    tmp_path: Path, first: dict[str, Any], second: dict[str, Any], match: str
) -> None:
    with pytest.raises(BadMemberError, match=match), Writer(tmp_path / "st") as w:
        w.write(first)
        w.write(second)
    assert not (tmp_path / "st" / INDEX_NAME).exists()


def test_classes_map_bounds_labels(tmp_path: Path) -> None:
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    classes = tmp_path / "classes.txt"
    with (
        pytest.raises(PackError, match=r"'k' has cls label 2.*only 2 classes"),
        Writer(tmp_path / "st", classes=classes) as w,
    ):
        w.write({"__key__": "k", "cls": 2})
    with Writer(tmp_path / "st", classes=tmp_path / "classes.txt") as w:
        w.write({"__key__": "k", "cls": 1, "jpg": b""})
    with open_store(tmp_path / "st") as store:
        assert store.classes == ["cat", "dog"] and store.read_sample(0).label == 1


@pytest.mark.timeout(120)
def test_optimize_two_workers_equals_one_writer(tmp_path: Path) -> None:
    inputs = list(range(50))
    with Writer(tmp_path / "w", chunk_size=8192) as w:
        for i in inputs:
            w.write(make_sample(i))
    report = optimize(make_sample, inputs, tmp_path / "o", workers=2, chunk_size=8192)
    assert report.samples == 50
    assert contents(tmp_path / "o") == contents(tmp_path / "w")
    with open_store(tmp_path / "o") as a, open_store(tmp_path / "w") as b:
        assert a.classes == b.classes == ["0", "1", "2"]
        assert all(c.name == f"chunks/{n:06d}.tar" for n, c in enumerate(a.chunks))
        assert all(c.size <= 8192 for c in a.chunks)
    assert sorted(p.name for p in (tmp_path / "o" / "chunks").iterdir()) == [
        f"{n:06d}.tar" for n in range(report.chunks)
    ]
    assert verify_store(tmp_path / "o", progress=False) == []
    # Generated keys are the input's index, as a Writer numbers one sample per input.
    optimize(keyless, list(range(7)), tmp_path / "k", workers=3)
    assert [k for k, _, _ in contents(tmp_path / "k")] == [f"{i:09d}" for i in range(7)]


@pytest.mark.timeout(120)
def test_optimize_failures_leave_no_store(tmp_path: Path) -> None:
    dst = tmp_path / "o"
    with pytest.raises(PackError, match=r"fn failed on input 5:(.|\n)*no such image"):
        optimize(fails_at_five, list(range(12)), dst, workers=2, chunk_size=8192)
    assert not (dst / INDEX_NAME).exists() and list((dst / "chunks").iterdir()) == []
    with pytest.raises(DuplicateKeyError, match="'twin' is written twice"):
        optimize(same_key, list(range(10)), dst, workers=2)
    assert not (dst / INDEX_NAME).exists() and list((dst / "chunks").iterdir()) == []


@pytest.mark.parametrize(
    "path", [b"a", b"x" * 99, b"x" * 100, b"x" * 101, b"cat/000001.jpg", "é.jpg".encode()]
)
@pytest.mark.parametrize("size", [0, 1, 511, 512, 10**9, 8**11 - 1, 8**11])
@pytest.mark.parametrize(
    ("mtime", "mode"), [(0, 0o644), (1_700_000_000, 0o600), (8**11 - 1, 0o7777)]
)
def test_fast_headers_are_tarfiles_bytes(path: bytes, size: int, mtime: int, mode: int) -> None:
    from tierfeed.format.tarchunk import _tarfile_header

    assert member_header(path, size, mtime, mode) == _tarfile_header(path, size, mtime, mode)


@pytest.mark.hostile
@pytest.mark.timeout(120)
def test_optimize_worker_death_bad_samples_and_unpicklable_fn(tmp_path: Path) -> None:
    dst = tmp_path / "o"
    with pytest.raises(PackError, match="worker 0 died \\(exit code 3\\)"):
        optimize(dies_at_three, list(range(8)), dst, workers=2)
    assert not (dst / INDEX_NAME).exists() and list((dst / "chunks").iterdir()) == []
    with pytest.raises(BadMemberError, match=r"input 4: sample key '\.\./up'"):
        optimize(bad_key_at_four, list(range(8)), dst, workers=2)
    with pytest.raises(ConfigError, match="module-level function"):
        optimize(lambda i: {"txt": "x"}, [1], dst, workers=1)
    with pytest.raises(PackError, match="input 1 cannot be sent"):
        optimize(make_sample, [1, lambda: 0], dst, workers=1)
    assert not (dst / INDEX_NAME).exists() and list((dst / "chunks").iterdir()) == []
