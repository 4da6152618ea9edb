"""Writing stores to a URL (moto's S3 on loopback): `pack`, `Writer`, `optimize`, the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.format.conftest import QUIET, write_tree
from tests.objectstore import client, env, s3_options, upload
from tests.s3proxy import Fault, S3Proxy
from tierfeed import Writer, open_store, optimize, pack
from tierfeed.cli import main
from tierfeed.errors import PackError, StorageError
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import PackOptions
from tierfeed.loader.upload import staging_dir

pytestmark = pytest.mark.timeout(120)

FILES = {f"c{i % 2}/f{i:03d}.bin".encode(): os.urandom(3000 + 11 * i) for i in range(40)}


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))


def keys(s3_endpoint: str, bucket: str) -> list[str]:
    listed = client(s3_endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(o["Key"] for o in listed)


def test_pack_to_a_url_reads_back_and_leaves_no_staging(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    write_tree(tmp_path / "src", FILES)
    url, options = f"s3://{bucket}/packed", s3_options(s3_endpoint)
    report = pack(tmp_path / "src", url, QUIET, storage_options=options)
    assert report.store == url and report.samples == len(FILES)
    stored = keys(s3_endpoint, bucket)
    assert f"packed/{INDEX_NAME}" in stored and len(stored) == report.chunks + 1
    with open_store(url, storage_options=options) as store:
        got = {store.index.key(i): store.read_sample(i) for i in range(len(store))}
    assert {k: next(iter(s.fields.values())) for k, s in got.items()} == {
        os.fsdecode(p).rsplit(".", 1)[0]: data for p, data in FILES.items()
    }
    assert not staging_dir(url).exists()
    # A URL that holds a store is refused before anything is built; --overwrite replaces it
    # and removes the chunks the new store does not name.
    with pytest.raises(PackError, match=r"pass --overwrite \(PackOptions\(overwrite=True\)"):
        pack(tmp_path / "src", url, QUIET, storage_options=options)
    write_tree(tmp_path / "small", dict(list(FILES.items())[:3]))
    big = PackOptions(chunk_size=1 << 20, progress=False, overwrite=True)
    pack(tmp_path / "small", url, big, storage_options=options)
    assert len(keys(s3_endpoint, bucket)) == 2  # one chunk and the index
    with open_store(url, storage_options=options) as store:
        assert len(store) == 3


def test_an_upload_that_fails_announces_no_store(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    write_tree(tmp_path / "src", FILES)
    with S3Proxy(s3_endpoint) as proxy:
        proxy.inject(Fault(method="PUT", key_contains="/chunks/", status=403, code="AccessDenied"))
        url = f"s3://{bucket}/denied"
        with pytest.raises(StorageError, match="access denied"):
            pack(tmp_path / "src", url, QUIET, storage_options=s3_options(proxy.url))
    assert f"denied/{INDEX_NAME}" not in keys(s3_endpoint, bucket)  # no index: no store
    # Run again: the store built locally is built anew and uploaded whole.
    pack(tmp_path / "src", url, QUIET, storage_options=s3_options(s3_endpoint))
    with open_store(url, storage_options=s3_options(s3_endpoint)) as store:
        assert len(store) == len(FILES)


@pytest.mark.parametrize("where", ["missing bucket", "access denied"])
def test_a_url_that_cannot_be_written_is_refused_before_anything_is_built(
    tmp_path: Path, s3_endpoint: str, bucket: str, where: str,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    write_tree(tmp_path / "src", FILES)
    with S3Proxy(s3_endpoint) as proxy:
        proxy.inject(Fault("PUT", "/", status=403, code="AccessDenied", times=-1))
        if where == "missing bucket":
            url, options = "s3://no-such-bucket-z/ds", s3_options(s3_endpoint)
        else:
            url, options = f"s3://{bucket}/ro", s3_options(proxy.url)
        with pytest.raises(PackError, match=f"{url}: cannot write there .*nothing was built"):
            pack(tmp_path / "src", url, QUIET, storage_options=options)
        with pytest.raises(PackError, match="cannot write there"):
            Writer(url, storage_options=options)
        with pytest.raises(PackError, match="cannot write there"):
            optimize(bytes, [b"x"], url, storage_options=options)
    assert not staging_dir(url).exists()  # nothing packed: no staging directory
    assert keys(s3_endpoint, bucket) == []  # and no probe left behind
    for name, value in env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    assert main(["pack", str(tmp_path / "src"), "s3://no-such-bucket-z/ds", "-q"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("tierfeed pack: error: s3://no-such-bucket-z/ds: cannot write there")
    assert "no such bucket" in line


def test_a_pack_to_a_url_leaves_no_write_check_behind(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", f"s3://{bucket}/checked", QUIET, storage_options=s3_options(s3_endpoint))
    assert not [k for k in keys(s3_endpoint, bucket) if "write-check" in k]


def test_writer_to_a_url(s3_endpoint: str, bucket: str) -> None:
    url, options = f"s3://{bucket}/written", s3_options(s3_endpoint)
    with Writer(url, chunk_size=8192, storage_options=options) as w:
        for i in range(30):
            w.write({"__key__": f"k{i % 3}/s{i:02d}", "txt": str(i), "cls": i % 3})
    assert w.report is not None and w.report.samples == 30
    with open_store(url, storage_options=options) as store:
        assert [store.read_sample(i).fields["txt"] for i in range(3)] == [b"0", b"1", b"2"]
        assert store.read_sample(4).label == 1
    assert not staging_dir(url).exists()
    # The error names the Python spelling: Writer has no --overwrite.
    with pytest.raises(PackError, match="already holds a store; pass overwrite=True"):
        Writer(url, storage_options=options)


def sample_of(i: int) -> dict[str, object]:
    return {"__key__": f"s{i:03d}", "bin": bytes([i]) * 100}


def test_optimize_to_a_url(s3_endpoint: str, bucket: str) -> None:
    url, options = f"s3://{bucket}/optimized", s3_options(s3_endpoint)
    report = optimize(sample_of, list(range(20)), url, workers=2, chunk_size=4096,
                      storage_options=options)  # fmt: skip
    assert report.samples == 20
    with open_store(url, storage_options=options) as store:
        assert store.read_sample(7).fields["bin"] == bytes([7]) * 100


def test_the_pack_command_to_a_url(
    tmp_path: Path, s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for name, value in env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    write_tree(tmp_path / "src", FILES)
    url = f"s3://{bucket}/cli"
    assert main(["pack", str(tmp_path / "src"), url, "-q", "--chunk-size", "64KiB"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"-> {url}")
    assert main(["verify", "-q", url]) == 0
    assert main(["pack", str(tmp_path / "src"), url, "-q"]) == 1
    assert "already holds a store" in capsys.readouterr().err


def test_index_shards_at_a_url_uploads_only_the_index(
    tmp_path: Path, s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from tests.format.test_shards import make_shard

    shards = tmp_path / "shards"
    shards.mkdir()
    for s in range(3):
        members = [(f"k{s}{i:02d}.{ext}", f"{s}-{i}-{ext}".encode()) for i in range(5)
                   for ext in ("jpg", "cls")]  # fmt: skip
        members = [(n, str(int(n[2:4]) % 2).encode() if n.endswith(".cls") else d)
                   for n, d in members]  # fmt: skip
        make_shard(shards / f"shard-{s}.tar", members)
    url = upload(s3_endpoint, shards, bucket, "wds")
    before = keys(s3_endpoint, bucket)
    for name, value in env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    assert main(["index", f"{url}/shard-*.tar", "--out", url, "-q"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"-> {url}/{INDEX_NAME}")
    assert keys(s3_endpoint, bucket) == sorted([*before, f"wds/{INDEX_NAME}"])
    with open_store(url) as store:
        assert len(store) == 15 and store.read_sample(0).fields["jpg"] == b"0-0-jpg"
        assert sorted({store.read_sample(i).label for i in range(15)}) == [0, 1]
    assert main(["verify", "-q", url]) == 0
    assert main(["index", f"{url}/shard-*.tar", "--out", url, "-q"]) == 1  # it has an index
    assert "--overwrite" in capsys.readouterr().err
    assert main(["index", f"{url}/nothing-*.tar", "--out", url, "-q", "--overwrite"]) == 1
    assert "no object matches" in capsys.readouterr().err
