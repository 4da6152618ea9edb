"""`tierfeed inspect` and `tierfeed verify` on stores given by URL (moto's S3 on loopback)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.format.conftest import QUIET, write_tree
from tests.objectstore import client, env, upload
from tierfeed.cli import main
from tierfeed.format.index import Index
from tierfeed.format.pack import pack

pytestmark = pytest.mark.timeout(120)

FILES = {f"k{i % 2}/s{i:03d}.jpg".encode(): os.urandom(2000 + 97 * i) for i in range(60)}


@pytest.fixture
def url(tmp_path: Path, s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in env(s3_endpoint).items():  # the CLI takes the SDK's own settings
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    return upload(s3_endpoint, tmp_path / "store", bucket, "ds")


def test_inspect_a_url(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", url]) == 0
    out = capsys.readouterr().out
    assert f"store     {url}" in out and "samples   60" in out and "classes   2 (k0, k1)" in out


def test_verify_a_url_good_then_damaged(
    url: str, s3_endpoint: str, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "-q", url]) == 0
    assert f"ok: {url}" in capsys.readouterr().out
    # One bit of one member flipped in the bucket: verify names the URL and the member.
    with Index(tmp_path / "store") as ix:
        member = int(np.flatnonzero(ix.member_chunk == 1)[0])
        chunk, offset = ix.chunk_name(1), int(ix.member_offset[member])
        name = ix.member_path_bytes(member).decode()
    s3, key = client(s3_endpoint), f"ds/{chunk}"
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[offset] ^= 1
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    assert main(["verify", "-q", url]) == 1
    out = capsys.readouterr().out
    assert f"BAD: chunk {url}/{chunk}: checksum mismatch" in out and repr(name) in out
    assert str(tmp_path) not in out  # the temporary copy is never what a problem names


def test_verify_names_a_missing_and_a_resized_chunk(
    url: str, s3_endpoint: str, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Index(tmp_path / "store") as ix:
        first, second = ix.chunk_name(0), ix.chunk_name(1)
    s3 = client(s3_endpoint)
    s3.delete_object(Bucket=bucket, Key=f"ds/{first}")
    s3.put_object(Bucket=bucket, Key=f"ds/{second}", Body=b"x" * 10)
    assert main(["verify", "-q", url]) == 1
    out = capsys.readouterr().out
    assert f"BAD: {url}/{first}: no such object" in out
    assert f"BAD: chunk {url}/{second}: size 10 bytes, the index says" in out


def test_a_missing_bucket_is_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "s3://no-such-bucket-y/ds"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tierfeed inspect: error: s3://no-such-bucket-y")
    assert "no such bucket" in err[0]
