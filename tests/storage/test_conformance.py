"""One conformance suite that every driver passes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tierfeed.errors import NotFoundError, ReadOnlyError, StorageError
from tierfeed.storage import Driver

pytestmark = pytest.mark.timeout(60)


def test_write_read_range_size(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    data = bytes(range(256)) * 40
    d.write("chunks/000001.tar", data)
    assert d.read("chunks/000001.tar") == data
    assert d.read_range("chunks/000001.tar", 1000, 300) == data[1000:1300]
    assert d.read_range("chunks/000001.tar", len(data) - 10, 100) == data[-10:]  # short at end
    assert d.size("chunks/000001.tar") == len(data)
    assert d.exists("chunks/000001.tar") and not d.exists("chunks/nope.tar")


def test_overwrite_is_whole(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    d.write("a.bin", b"first version")
    d.write("a.bin", b"2nd")
    assert d.read("a.bin") == b"2nd"


def test_list_and_delete(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    for name in ("x/1.tar", "x/2.tar", "y/3.tar"):
        d.write(name, b"z")
    assert d.list() == ["x/1.tar", "x/2.tar", "y/3.tar"]
    assert d.list("x/") == ["x/1.tar", "x/2.tar"]
    d.delete("x/1.tar")
    assert d.list() == ["x/2.tar", "y/3.tar"]
    with pytest.raises(NotFoundError):
        d.delete("x/1.tar")


def test_missing_objects(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    with pytest.raises(NotFoundError, match=r"missing\.tar"):
        d.read("missing.tar")
    with pytest.raises(NotFoundError):
        d.size("missing.tar")
    with pytest.raises(FileNotFoundError):  # NotFoundError is also the builtin
        d.read_range("missing.tar", 0, 1)


def test_read_only_refuses_writes_and_deletes(make_driver: Callable[..., Driver]) -> None:
    make_driver().write("keep.tar", b"origin bytes")
    ro = make_driver(read_only=True)
    with pytest.raises(ReadOnlyError):
        ro.write("new.tar", b"x")
    with pytest.raises(ReadOnlyError):
        ro.delete("keep.tar")
    assert ro.read("keep.tar") == b"origin bytes"


def test_counters(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    d.write("c.tar", b"0123456789")
    d.read_range("c.tar", 2, 5)
    snap = d.counters.snapshot()
    assert snap["writes"] == 1 and snap["bytes_written"] == 10
    assert snap["reads"] >= 1 and snap["bytes_read"] >= 5


def test_paths_cannot_escape(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    if type(d).__name__ == "MemoryDriver" or type(d).__name__ == "SlowDriver":
        return  # keys in a dict: no file system to escape
    with pytest.raises(StorageError):
        d.write("../escape.tar", b"x")
