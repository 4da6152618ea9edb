"""Shared pytest set-up: hypothesis profiles; the object stores of the object-store tests
(moto's S3 server, the GCS emulator, Azurite; each on loopback)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.format.conftest import QUIET, Tree, write_tree
from tests.objectstore import SCHEMES, Remote, client, free_port, make_remote
from tests.s3proxy import S3Proxy
from tierfeed.format.pack import PackOptions, pack

# gcsfs asks Google's control plane (gRPC, 60 s timeout, never cached on failure) for every
# bucket's layout unless told not to: against an emulator, every call would wait for it.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
ROOT = Path(__file__).resolve().parent.parent
AZURITE = Path(
    os.environ.get("TIERFEED_AZURITE", ROOT / ".cache/azurite/node_modules/.bin/azurite-blob")
)

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


@pytest.fixture
def packed(tmp_path: Path) -> Callable[..., Path]:
    """Write a tree and pack it; returns the store directory."""

    def make(files: Tree, options: PackOptions = QUIET) -> Path:
        src, dst = tmp_path / "src", tmp_path / "store"
        write_tree(src, files)
        pack(src, dst, options)
        return dst

    return make


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


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """The GCS emulator (gcp-storage-emulator) in this process, in memory, on loopback."""
    import logging

    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service (Microsoft's Azure Storage emulator; `make test` installs it),
    in memory, on loopback."""
    if not AZURITE.exists():
        pytest.fail(f"{AZURITE}: Azurite is not installed; `make test` installs it")
    port = free_port()
    log = tmp_path_factory.mktemp("azurite") / "azurite.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port),
             "--inMemoryPersistence", "--skipApiVersionCheck", "--silent", "--loose"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _await_port(port, server, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # in memory: nothing to keep
        server.wait(10)


def _await_port(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"Azurite exited: {log.read_text(errors='replace')[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail(f"Azurite did not listen on {port} within 30 s")


@pytest.fixture(params=SCHEMES)
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Remote]:
    """A new, empty bucket of each kind of store in turn (s3, gs, az, http), behind a proxy
    of its own that counts requests and injects faults (``remote.proxy``)."""
    scheme = request.param
    endpoints = {
        "s3": "s3_endpoint", "gs": "gcs_endpoint", "az": "azurite_endpoint"
    }  # fmt: skip
    upstream = {scheme: request.getfixturevalue(endpoints[scheme])} if scheme in endpoints else {}
    proxies: list[S3Proxy] = []

    def proxy(upstream_url: str, **kwargs: Any) -> S3Proxy:
        proxies.append(S3Proxy(upstream_url, **kwargs).start())
        return proxies[-1]

    factory: Callable[..., Any] = proxy
    try:
        yield make_remote(scheme, f"b{os.getpid()}-{next(_buckets)}", factory, upstream,
                          tmp_path / "served")  # fmt: skip
    finally:
        for p in proxies:
            p.stop()
