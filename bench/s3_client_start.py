"""What making an S3 client costs a DataLoader worker: parsing botocore's service models.

Makes an aiobotocore S3 client (no request is sent) in this process with a fresh session,
then in a forked child (as a DataLoader worker is) with a fresh session of its own, once
parsing the models again and once with the models' loader its parent parsed with (what
`tierfeed.storage.fsspec_connection` gives a worker). Prints CPU and wall seconds of each.

Usage (any environment with aiobotocore):
    python bench/s3_client_start.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from typing import Any


def make_client(loader: Any = None) -> tuple[float, float]:
    """CPU and wall seconds of a fresh session's first S3 client (``loader``: its models')."""
    from aiobotocore.session import AioSession

    async def make() -> None:
        async with session.create_client("s3", endpoint_url="http://127.0.0.1:9"):
            pass

    cpu, wall = time.process_time(), time.perf_counter()
    session = AioSession()
    if loader is not None:
        session.register_component("data_loader", loader)
    asyncio.run(make())
    return time.process_time() - cpu, time.perf_counter() - wall


def child(loader: Any, out: Any) -> None:
    out.put(("forked child, its own parse", *make_client()))
    out.put(("forked child, the parent's parsed models", *make_client(loader)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    for key, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        os.environ.setdefault(key, value)
    from aiobotocore.session import AioSession

    loader = AioSession().get_component("data_loader")
    cpu, wall = make_client(loader)  # parses the models into ``loader``
    print(f"this process, first client: {cpu:.3f} CPU s, {wall:.3f} s")
    fork = multiprocessing.get_context("fork")
    for _ in range(a.repeat):
        out = fork.Queue()
        proc = fork.Process(target=child, args=(loader, out))
        proc.start()
        for _ in range(2):
            what, cpu, wall = out.get(timeout=60)
            print(f"{what}: {cpu:.3f} CPU s, {wall:.3f} s")
        proc.join(timeout=60)


if __name__ == "__main__":
    main()
