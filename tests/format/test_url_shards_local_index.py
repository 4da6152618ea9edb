"""`tierfeed index` of shards in a bucket its user cannot write (issue 46), on moto's S3: the
index kept in a local directory that records the shards' URL as its chunk root; the store read
there through the object-store driver and its tiers; a shard replaced after indexing named
where it fails; a URL root honoured only in a store's own local index, and no way out of it."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from tests.format.wds_shards import Samples, make_shards, read_back
from tests.hostile import indexedit as ie
from tests.objectstore import client, env, s3_options, upload
from tierfeed import open_store, verify_store
from tierfeed.cli import main
from tierfeed.errors import ChunkCorruptError, ConfigError, IndexFormatError, TierfeedError
from tierfeed.format.index import Index, write_index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.commands import verify_location
from tierfeed.loader.compose import TierConfig
from tierfeed.loader.location import StoreLocation
from tierfeed.torch import Dataset

pytestmark = pytest.mark.timeout(180)

PATTERN = "shard-{000000..000003}.tar"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def bucket_shards(
    tmp_path: Path, s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, Samples]:
    """Four WebDataset shards at ``s3://BUCKET/public/wds`` (put there by the test's own
    hands); the CLI pointed at the bucket by the environment, as a user's would be."""
    samples = make_shards(tmp_path / "shards")
    url = upload(s3_endpoint, tmp_path / "shards", bucket, "public/wds")
    for name, value in env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    return url, samples


def keys(s3_endpoint: str, bucket: str) -> list[tuple[str, int, str]]:
    """Every object of the bucket: key, size and ETag (unchanged: nothing was written)."""
    listed = client(s3_endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted((o["Key"], o["Size"], o["ETag"]) for o in listed)


def indexed(url: str, store: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`tierfeed index 'URL/PATTERN' --out store`; its output line."""
    assert main(["index", f"{url}/{PATTERN}", "--out", str(store), "-q"]) == 0
    return capsys.readouterr().out.strip()


@pytest.fixture
def store(
    tmp_path: Path, bucket_shards: tuple[str, Samples], capsys: pytest.CaptureFixture[str]
) -> Path:
    """The bucket's shards indexed into ``tmp_path/store`` by the CLI."""
    indexed(bucket_shards[0], tmp_path / "store", capsys)
    return tmp_path / "store"


def test_url_shards_indexed_into_a_local_directory_read_there(
    tmp_path: Path, s3_endpoint: str, bucket: str, bucket_shards: tuple[str, Samples],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url, samples = bucket_shards
    before = keys(s3_endpoint, bucket)
    store = tmp_path / "store"
    line = indexed(url, store, capsys)
    assert line.endswith(f"-> {store / INDEX_NAME} (shards read from {url})"), line
    assert keys(s3_endpoint, bucket) == before  # the bucket is only read
    assert sorted(p.name for p in store.iterdir()) == [INDEX_NAME]  # no shard copied here
    raw = (store / INDEX_NAME).read_bytes()
    assert struct.unpack_from("<8sII", raw)[1] == 4 and ie.read_header(raw)["chunk_root"] == url
    with Index(store) as index:
        assert index.chunk_url == url and index.chunk_root == store
        assert [c.name for c in index.chunks()] == [f"shard-{s:06d}.tar" for s in range(4)]
    options = s3_options(s3_endpoint)
    ds = Dataset(store, plan="global", batch_size=5, storage_options=options)
    for epoch in range(2):  # every sample once an epoch, its bytes as written
        ds.set_epoch(epoch)
        assert read_back(ds) == samples
    tiered = Dataset(store, plan="global", batch_size=5, cache_dir=tmp_path / "dataset-disk")
    assert read_back(tiered) == samples  # the environment's credentials; a disk tier


def test_a_disk_tier_copies_the_shards_from_their_url_once(
    tmp_path: Path, bucket_shards: tuple[str, Samples], store: Path
) -> None:
    url, samples = bucket_shards
    tiers = TierConfig(disk_dir=str(tmp_path / "disk"), disk_bytes=2**30, policy="fill-top")
    with open_store(store, tiers) as opened:
        assert opened.chunk_location(1) == f"{url}/shard-000001.tar"
        for i in range(len(opened)):
            opened.read_sample(i)
        opened.source.drain(30)  # type: ignore[attr-defined]
        origin = opened.source.origin  # type: ignore[attr-defined]
        assert origin.url == url  # the object-store driver over the shards' URL
        gets = origin.counters.reads
        again = {opened.read_sample(i).key for i in range(len(opened))}
        assert origin.counters.reads == gets and again == set(samples)  # from the disk tier


def test_inspect_and_verify_name_the_shards_url(
    tmp_path: Path, bucket_shards: tuple[str, Samples], store: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url, _ = bucket_shards
    assert main(["inspect", str(store)]) == 0
    assert f"shards    {url} (the chunks: read there, never written)" in capsys.readouterr().out
    assert main(["verify", "-q", str(store)]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {store}"
    [problem] = verify_store(store, progress=False)  # no local file to check: says where
    assert f"its chunks lie under {url}" in problem and "`tierfeed verify`" in problem


def test_a_shard_replaced_after_indexing_fails_naming_it(
    tmp_path: Path, s3_endpoint: str, bucket: str, bucket_shards: tuple[str, Samples],
    store: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url, _ = bucket_shards
    shard = bytearray((tmp_path / "shards/shard-000001.tar").read_bytes())
    shard[600] ^= 0xFF  # one byte of the first member's data: the same size, other bytes
    client(s3_endpoint).put_object(Bucket=bucket, Key="public/wds/shard-000001.tar", Body=shard)
    named = f"{url}/shard-000001.tar"
    with open_store(store) as opened, pytest.raises(ChunkCorruptError, match=named):
        with Index(store) as index:
            first = int(next(s for s in range(len(opened)) if index.sample_chunk[s] == 1))
        opened.read_sample(first)
    problems = verify_location(StoreLocation.of(store), progress=False)
    assert len(problems) == 1 and named in problems[0], problems
    assert main(["verify", "-q", str(store)]) == 1
    assert named in capsys.readouterr().out


def test_an_index_at_a_url_naming_a_url_root_is_refused(
    tmp_path: Path, s3_endpoint: str, bucket: str, store: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    elsewhere = f"s3://{bucket}/mirror"  # someone else's index, naming the shards' URL
    client(s3_endpoint).put_object(
        Bucket=bucket, Key=f"mirror/{INDEX_NAME}", Body=(store / INDEX_NAME).read_bytes()
    )
    with pytest.raises(IndexFormatError, match="only a store's own local index"):
        open_store(elsewhere)
    with pytest.raises(IndexFormatError, match="only a store's own local index"):
        Dataset(elsewhere, batch_size=5)
    assert main(["verify", "-q", elsewhere]) == 1
    assert "only a store's own local index" in capsys.readouterr().out


def outside(store: Path, url: str, name: str) -> None:
    """The store's index, its first chunk named ``name`` instead (sealed as a writer would)."""
    with Index(store) as index:
        content = ie.content_of(index)
    content.chunk_names[0] = name
    content.chunk_root = url
    write_index(store / INDEX_NAME, content)


@pytest.mark.parametrize("name", ["../secret/shard-000000.tar", "/public/secret/shard.tar"])
def test_a_local_index_reaches_nothing_outside_its_url_root(
    tmp_path: Path, s3_endpoint: str, bucket: str, bucket_shards: tuple[str, Samples],
    capsys: pytest.CaptureFixture[str], name: str,
) -> None:  # fmt: skip
    url, _ = bucket_shards
    make_shards(tmp_path / "secret", shards=1, prefix="x")
    upload(s3_endpoint, tmp_path / "secret", bucket, "public/secret")  # a real tar out there
    store = tmp_path / "store"
    indexed(url, store, capsys)
    outside(store, url, name)
    with open_store(store) as opened, pytest.raises(TierfeedError, match="leave the root"):
        opened.read_sample(0)
    with pytest.raises(TierfeedError, match="leave the root"):
        read_back(Dataset(store, plan="sequential", batch_size=5))
    problems = verify_location(StoreLocation.of(store), progress=False)
    assert any("leave the root" in p for p in problems), problems


@pytest.mark.parametrize(
    ("root", "match"),
    [
        ("file:///etc", "no object-store scheme"),
        ("s3://bucket/../other", r"'\.\.' part"),
        ("s3://bucket/path/", "ends in '/'"),
        ("s3://", "empty"),
        ("://bucket/x", "no object-store scheme"),
    ],
)
def test_a_crafted_url_root_is_damaged(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str], root: str, match: str,
) -> None:  # fmt: skip
    raw = (store / INDEX_NAME).read_bytes()
    edited = ie.read_header(raw) | {"chunk_root": root}
    (store / INDEX_NAME).write_bytes(ie.with_header(raw, edited))  # resealed, as crafted
    with pytest.raises(IndexFormatError, match=match):
        Index(store)


def test_storage_options_take_a_local_store_only_where_it_reads_a_url(
    tmp_path: Path, s3_endpoint: str, bucket_shards: tuple[str, Samples],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url, _ = bucket_shards
    options = s3_options(s3_endpoint)
    indexed(url, tmp_path / "store", capsys)
    assert StoreLocation.of(tmp_path / "store", options).storage_options == options
    make_shards(tmp_path / "plain", shards=1)
    assert main(["index", str(tmp_path / "plain/shard-000000.tar"), "--out",
                 str(tmp_path / "plain"), "-q"]) == 0  # fmt: skip
    for plain in (tmp_path / "plain", tmp_path / "nothing"):
        with pytest.raises(ConfigError, match="storage_options apply to URLs, not to local"):
            open_store(plain, storage_options=options)


def test_a_glob_and_a_list_of_urls_index_the_same_store(
    tmp_path: Path, bucket_shards: tuple[str, Samples], capsys: pytest.CaptureFixture[str]
) -> None:
    url, samples = bucket_shards
    listed = [f"{url}/shard-{s:06d}.tar" for s in range(4)]
    assert main(["index", *listed, "--out", str(tmp_path / "listed"), "-q"]) == 0
    assert main(["index", f"{url}/shard-*.tar", "--out", str(tmp_path / "globbed"), "-q"]) == 0
    for store in ("listed", "globbed"):
        with Index(tmp_path / store) as index:
            assert index.chunk_url == url and index.num_chunks == 4
        assert read_back(Dataset(tmp_path / store, plan="sequential", batch_size=5)) == samples
    assert main(["index", f"{url}/nothing-*.tar", "--out", str(tmp_path / "none"), "-q"]) == 1
    assert "no object matches" in capsys.readouterr().err
    assert main(["index", f"{url}/shard-{{000000..000004}}.tar", "--out",
                 str(tmp_path / "missing"), "-q"]) == 1  # fmt: skip
    assert "shard-000004.tar: no such object" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()  # refused before any work


def test_stage_in_copies_the_shards_from_their_url(tmp_path: Path, store: Path) -> None:
    from tierfeed.distributed.staging import stage

    report = stage(store, tmp_path / "local", progress=False)
    assert report.chunks_copied == 4 and report.origin_reads > 0
    for s in range(4):
        name = f"shard-{s:06d}.tar"
        staged = Path(report.local_dir) / name
        assert staged.read_bytes() == (tmp_path / "shards" / name).read_bytes()


@pytest.mark.fuse
def test_the_mount_reads_the_shards_from_their_url(
    tmp_path: Path, bucket_shards: tuple[str, Samples], store: Path
) -> None:
    from tierfeed.fuse.process import FuseProcess

    _, samples = bucket_shards
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = [sys.executable, "-m", "tierfeed", "mount", str(store), str(mnt), "--foreground"]
    with FuseProcess(argv, mnt):  # the bucket reached through the environment, as the CLI's
        for key, fields in samples.items():
            for ext, data in fields.items():
                assert (mnt / f"{key}.{ext}").read_bytes() == data


def every_sample(store: Path) -> list[tuple[str, int, dict[str, bytes]]]:
    """Key, label and members of every sample of ``store``, read back through its tiers."""
    with open_store(store) as opened:
        return [(s.key, s.label, s.fields) for s in map(opened.read_sample, range(len(opened)))]


def test_url_shards_indexed_in_parts_merge_into_the_single_index(
    tmp_path: Path, bucket: str, bucket_shards: tuple[str, Samples], store: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url, samples = bucket_shards
    parted, pattern = tmp_path / "parted", f"{url}/{PATTERN}"
    for i in range(2):
        assert main(["index", pattern, "--out", str(parted), "--part", f"{i}/2", "-q"]) == 0
        assert capsys.readouterr().out.strip().endswith(f"tierfeed merge {parted}")
    assert main(["merge", str(parted), "-q"]) == 0
    with Index(store) as single, Index(parted, recheck=True) as merged:
        assert merged.chunk_url == single.chunk_url == url
        assert merged.chunk_checksum.tolist() == single.chunk_checksum.tolist()
    got = every_sample(parted)
    assert got == every_sample(store) and {key for key, _, _ in got} == set(samples)
    assert main(["index", pattern, "--out", f"s3://{bucket}/x", "--part", "0/2", "-q"]) == 1
    assert "drop --part" in capsys.readouterr().err  # the parts go to a local directory


def test_a_missing_part_of_url_shards_is_refused_in_one_line(
    tmp_path: Path, bucket_shards: tuple[str, Samples], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = bucket_shards
    parted = tmp_path / "parted"
    assert main(["index", f"{url}/{PATTERN}", "--out", str(parted), "--part", "0/2", "-q"]) == 0
    capsys.readouterr()
    assert main(["merge", str(parted), "-q"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "part 1 of 2 is missing" in line, line
    assert not (parted / INDEX_NAME).exists()


def test_a_shard_rewritten_between_parts_is_refused_at_the_merge(
    tmp_path: Path, s3_endpoint: str, bucket: str, bucket_shards: tuple[str, Samples],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Each part fingerprints the whole shard list with the objects' ETags: a shard rewritten
    with other bytes of the same size between two parts makes them parts of two lists."""
    url, _ = bucket_shards
    parted = tmp_path / "parted"
    assert main(["index", f"{url}/{PATTERN}", "--out", str(parted), "--part", "0/2", "-q"]) == 0
    shard = bytearray((tmp_path / "shards/shard-000001.tar").read_bytes())
    shard[600] ^= 0xFF  # the same size, other bytes: only the ETag tells
    client(s3_endpoint).put_object(Bucket=bucket, Key="public/wds/shard-000001.tar", Body=shard)
    assert main(["index", f"{url}/{PATTERN}", "--out", str(parted), "--part", "1/2", "-q"]) == 0
    capsys.readouterr()
    assert main(["merge", str(parted), "-q"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "another" in line, line
    assert not (parted / INDEX_NAME).exists()
