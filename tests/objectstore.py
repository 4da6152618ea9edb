"""An S3 protocol server for tests (moto's, on loopback), and the helpers that talk to it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

__all__ = ["client", "env", "free_port", "s3_options", "upload"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_options(endpoint: str, **config: Any) -> dict[str, Any]:
    """storage_options for an fsspec S3 file system on ``endpoint`` (``config``: botocore
    Config settings, e.g. ``read_timeout``)."""
    options: dict[str, Any] = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    if config:
        options["config_kwargs"] = config
    return options


def env(endpoint: str) -> dict[str, str]:
    """Environment variables that point the AWS SDKs (and so the CLI) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def client(endpoint: str) -> Any:
    """A boto3 S3 client on ``endpoint`` (the tests' own hands, not tierfeed's)."""
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


def upload(endpoint: str, directory: Path, bucket: str, prefix: str) -> str:
    """Put every file under ``directory`` at ``s3://bucket/prefix/...``; returns that URL."""
    s3 = client(endpoint)
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(directory).as_posix()}"
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}"
