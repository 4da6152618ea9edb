"""Shared pytest set-up: hypothesis profiles; an S3 server for the object-store tests."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.objectstore import client, free_port

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is reproducible
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "explore", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in this process, on loopback only."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


_buckets = itertools.count()


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """A new, empty bucket on `s3_endpoint`."""
    name = f"test-{os.getpid()}-{next(_buckets)}"
    client(s3_endpoint).create_bucket(Bucket=name)
    return name
