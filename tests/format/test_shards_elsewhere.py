"""`tierfeed index` of shards kept elsewhere (issue 46): the index in a local store directory,
the chunks the original shards in another, read-only one; symbolic links to shards; and the
shard root an index records, which no crafted index can turn into a way out of it."""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.wds_shards import (
    Samples,
    make_read_only,
    make_shards,
    make_writable,
    read_back,
    snapshot,
)
from tests.hostile import indexedit as ie
from tests.hostile.test_cli_errors import assert_user_error, tierfeed
from tierfeed import index_shards, open_store, verify_store
from tierfeed.distributed.staging import check_stageable
from tierfeed.errors import ChunkCorruptError, IndexFormatError, StorageError
from tierfeed.format.index import Index, write_index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.location import fetch_index
from tierfeed.storage import PosixDriver
from tierfeed.torch import Dataset, Loader

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[tuple[Path, Samples]]:
    """Four WebDataset shards in a read-only directory ``ro`` (made writable again after)."""
    samples = make_shards(tmp_path / "ro")
    make_read_only(tmp_path / "ro")
    yield tmp_path / "ro", samples
    make_writable(tmp_path / "ro")


def header(store: Path) -> tuple[int, dict[str, object]]:
    """The format version and JSON header of the store's index."""
    raw = (store / INDEX_NAME).read_bytes()
    return struct.unpack_from("<8sII", raw)[1], ie.read_header(raw)


def read_all(store: Path | str) -> Samples:
    return read_back(Dataset(store, plan="sequential", batch_size=5))


def test_read_only_shards_indexed_into_a_local_store(
    tmp_path: Path, shards: tuple[Path, Samples]
) -> None:
    ro, samples = shards
    before = snapshot(ro)
    store = tmp_path / "local" / "store"  # made by the command
    done = tierfeed("index", *sorted(ro.glob("*.tar")), "--out", store, "-q")
    assert done.returncode == 0, done.stderr
    assert f"shards read from {ro}" in done.stdout
    assert sorted(p.name for p in store.iterdir()) == [INDEX_NAME]  # the shards stay there
    version, h = header(store)
    assert (version, h["chunk_root"]) == (4, str(ro))
    with Index(store) as index:
        assert index.chunk_root == ro
        assert [index.chunk_name(c) for c in range(4)] == [f"shard-{s:06d}.tar" for s in range(4)]
    assert read_all(store) == samples
    verify = tierfeed("verify", store, "-q")
    assert verify.returncode == 0 and f"ok: {store}" in verify.stdout, verify.stdout
    inspect = tierfeed("inspect", store)
    assert f"shards    {ro}" in inspect.stdout, inspect.stdout
    assert snapshot(ro) == before  # nothing there was written, made or touched


def test_relative_paths_record_a_root_the_store_moves_with(
    tmp_path: Path, shards: tuple[Path, Samples], monkeypatch: pytest.MonkeyPatch
) -> None:
    ro, samples = shards
    monkeypatch.chdir(tmp_path)
    index_shards([f"ro/shard-{s:06d}.tar" for s in range(4)], "store", progress=False)
    assert header(tmp_path / "store")[1]["chunk_root"] == "../ro"  # relative to the store
    make_writable(ro)
    (tmp_path / "moved").mkdir()
    for name in ("ro", "store"):
        (tmp_path / name).rename(tmp_path / "moved" / name)
    make_read_only(tmp_path / "moved" / "ro")
    before = snapshot(tmp_path / "moved" / "ro")
    ds = Dataset(tmp_path / "moved" / "store", plan="global", batch_size=4)
    with Loader(ds, num_workers=2) as loader:
        assert read_back(loader) == samples  # every sample once, through two workers
    assert verify_store(tmp_path / "moved" / "store", progress=False) == []
    assert snapshot(tmp_path / "moved" / "ro") == before
    make_writable(tmp_path / "moved" / "ro")
    (tmp_path / "moved" / "ro").rename(ro)  # for the fixture's clean-up


def test_symlinked_shards_are_read_as_their_targets(
    tmp_path: Path, shards: tuple[Path, Samples]
) -> None:
    ro, samples = shards
    mix = tmp_path / "mix"  # a shard set assembled with ln -s
    mix.mkdir()
    for s in range(4):
        (mix / f"part-{s}.tar").symlink_to(ro / f"shard-{s:06d}.tar")
    before = snapshot(ro)
    done = tierfeed("index", *sorted(mix.glob("*.tar")), "--out", mix, "-q")
    assert done.returncode == 0, done.stderr
    assert header(mix)[1]["chunk_root"] == str(ro)  # the links' targets are recorded
    (mix / "part-0.tar").unlink()  # the link re-pointed: what is read does not change
    (mix / "part-0.tar").symlink_to(ro / "shard-000003.tar")
    assert read_all(mix) == samples
    assert verify_store(mix, progress=False) == []
    assert snapshot(ro) == before
    make_writable(ro)  # the target itself rewritten, same size: caught at read
    target = ro / "shard-000001.tar"
    data = bytearray(target.read_bytes())
    data[600] ^= 0xFF  # inside the first member's data
    target.write_bytes(bytes(data))
    with pytest.raises(ChunkCorruptError, match=r"shard-000001\.tar"):
        read_all(mix)
    assert any("shard-000001.tar" in p for p in verify_store(mix, progress=False))


def test_a_link_to_no_regular_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-dir.tar").symlink_to(tmp_path / "dir")
    (tmp_path / "dangling.tar").symlink_to(tmp_path / "nothing.tar")
    for link, what in (("to-dir.tar", "directory"), ("dangling.tar", "does not exist")):
        done = tierfeed("index", tmp_path / link, "--out", tmp_path / "store", "-q")
        assert what in assert_user_error(done, "index", tmp_path / link)
    assert not (tmp_path / "store").exists()  # refused before any work


def test_in_place_indexes_keep_format_3(tmp_path: Path) -> None:
    samples = make_shards(tmp_path / "shards", shards=2)
    done = tierfeed("index", *sorted((tmp_path / "shards").glob("*.tar")), "--out",
                    tmp_path / "shards", "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "read from" not in done.stdout
    version, h = header(tmp_path / "shards")
    assert version == 3 and "chunk_root" not in h  # what a tierfeed before format 4 opens
    assert read_all(tmp_path / "shards") == samples


def crafted(tmp_path: Path, ro: Path, name: str) -> Path:
    """A store whose index records the shard root ``ro`` but names its first chunk
    ``name``: a real tar outside the root, sealed as a writer would seal it."""
    make_shards(tmp_path / "secret", shards=1, prefix="x")
    store = tmp_path / "store"
    index_shards(sorted(ro.glob("*.tar")), store, progress=False)
    with Index(store) as index:
        content = ie.content_of(index)
    content.chunk_names[0] = name
    content.chunk_root = str(ro)
    write_index(store / INDEX_NAME, content)
    return store


@pytest.mark.parametrize("name", ["../secret/shard-000000.tar", "{tmp}/secret/shard-000000.tar"])
def test_a_chunk_outside_its_recorded_root_is_refused(
    tmp_path: Path, shards: tuple[Path, Samples], name: str
) -> None:
    store = crafted(tmp_path, shards[0], name.format(tmp=tmp_path))
    outside = "outside the store's chunk directory"
    with open_store(store) as opened, pytest.raises(IndexFormatError, match=outside):
        opened.read_sample(0)
    with pytest.raises(IndexFormatError, match=outside):
        read_all(store)
    assert any(outside in p for p in verify_store(store, progress=False))
    done = tierfeed("verify", store, "-q")
    assert done.returncode == 1 and outside in done.stdout


def test_a_format_3_index_naming_a_root_is_damaged(
    tmp_path: Path, shards: tuple[Path, Samples]
) -> None:
    store = tmp_path / "store"
    index_shards(sorted(shards[0].glob("*.tar")), store, progress=False)
    raw = bytearray((store / INDEX_NAME).read_bytes())
    struct.pack_into("<I", raw, 8, 3)  # an older format that cannot say where chunks lie
    (store / INDEX_NAME).write_bytes(bytes(raw))
    with pytest.raises(IndexFormatError, match="format 3 index names a chunk root"):
        Index(store)


@pytest.mark.parametrize("root", ["", "a\0b", "x" * 5000, 7, ["/"]])
def test_a_crafted_chunk_root_is_damaged(
    tmp_path: Path, shards: tuple[Path, Samples], root: object
) -> None:
    store = tmp_path / "store"
    index_shards(sorted(shards[0].glob("*.tar")), store, progress=False)
    raw = (store / INDEX_NAME).read_bytes()
    edited = ie.read_header(raw) | {"chunk_root": root}
    (store / INDEX_NAME).write_bytes(ie.with_header(raw, edited))  # resealed, as crafted
    with pytest.raises(IndexFormatError, match=r"chunk root|'chunk_root' is not a JSON str"):
        Index(store)


def test_a_store_at_a_url_naming_a_root_is_refused(
    tmp_path: Path, shards: tuple[Path, Samples]
) -> None:
    store = tmp_path / "store"  # served as if it were the store at the URL
    index_shards(sorted(shards[0].glob("*.tar")), store, progress=False)
    with (
        PosixDriver(store, read_only=True) as origin,
        pytest.raises(IndexFormatError, match="only a store's own local index"),
    ):
        fetch_index(origin, "s3://bucket/ds", tmp_path / "cache")


def test_stage_in_never_writes_into_the_shards(
    tmp_path: Path, shards: tuple[Path, Samples]
) -> None:
    store = tmp_path / "store"
    index_shards(sorted(shards[0].glob("*.tar")), store, progress=False)
    with Index(store) as index:
        with pytest.raises(StorageError, match="read-only"):
            check_stageable(index, shards[0] / "staged")
        check_stageable(index, tmp_path / "local")


@pytest.mark.fuse
def test_the_mount_reads_shards_kept_elsewhere(
    tmp_path: Path, shards: tuple[Path, Samples]
) -> None:
    from tierfeed.fuse.process import FuseProcess

    ro, samples = shards
    store = tmp_path / "store"
    index_shards(sorted(ro.glob("*.tar")), store, progress=False)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    before = snapshot(ro)
    argv = [sys.executable, "-m", "tierfeed", "mount", str(store), str(mnt), "--foreground"]
    with FuseProcess(argv, mnt):
        for key, fields in samples.items():
            for ext, data in fields.items():
                assert (mnt / f"{key}.{ext}").read_bytes() == data
    assert snapshot(ro) == before
