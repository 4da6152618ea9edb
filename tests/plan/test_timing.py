"""The time model of `tierfeed simulate` (`tierfeed.plan.timing`): its parts, its bounds and its
advice, on figures given by hand (the calibration and the measured runs: bench/simulate_time.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.errors import ConfigError
from tierfeed.plan.timing import (
    Costs,
    EpochTime,
    Job,
    Node,
    Origin,
    epoch_times,
    fed_nodes,
    least_cache,
)

pytestmark = pytest.mark.timeout(60)

NFS = Origin.parse("nfs")
COSTS = Costs(
    start_s=0.3,
    start_cores=1.0,
    warm_start_s=0.02,
    cpu_per_sample_s=5e-5,
    cpu_per_byte_s=2e-9,
    rank_rate=30000.0,
)
JOB = Job(samples=20000, store_bytes=2_100_000_000, chunks=33, epochs=3)
NODE = Node(cores=2, ram_bytes=24 * 2**30)
SMALL = Node(cores=2, ram_bytes=2**30)  # a page cache far smaller than the store


def test_origin_specs_read_the_latency_presets_and_the_extras() -> None:
    assert NFS.latency_s == pytest.approx(0.001) and NFS.total_bps == pytest.approx(400e6)
    assert NFS.stream_bps == 0 and NFS.heads
    s3 = Origin.parse("median_ms=20,stream_mbps=25,streams=32,heads=0")
    assert (s3.latency_s, s3.stream_bps, s3.streams, s3.heads) == (0.02, 25e6, 32, False)
    assert s3.total_bps == 0  # no total: the connections are the limit
    stalls = Origin.parse("stalls")
    assert stalls.tail_prob == pytest.approx(1e-4) and stalls.stall_s == pytest.approx(2.0)
    # Beside a calibration, a spec changes what it names; a preset replaces it all.
    probed = Origin(latency_s=0.003, stream_bps=90e6, total_bps=300e6, heads=False)
    tailed = Origin.parse("tail_prob=1e-4,stall_ms=2000", probed)
    assert tailed == replace(probed, tail_prob=1e-4, stall_s=2.0)
    assert Origin.parse("nfs", probed) == NFS
    for bad in ("fast", "streams=0", "stream_mbps=lots", "median_ms=-1"):
        with pytest.raises(ConfigError):
            Origin.parse(bad)


def test_a_piece_is_a_tenth_of_a_second_of_a_request_within_the_tuners_bounds() -> None:
    assert Origin(stream_bps=25e6).piece() == 2_500_000
    assert Origin(stream_bps=1e6).piece() == 512 * 1024
    assert Origin(stream_bps=1e9).piece() == Origin().piece() == 16 * 2**20


def test_the_cold_epoch_reads_the_store_once_and_the_warm_ones_none_of_it() -> None:
    cold, warm, _ = epoch_times(NFS, NODE, COSTS, JOB)
    assert cold.origin_bytes == pytest.approx(JOB.store_bytes)
    assert warm.origin_bytes == 0 and warm.parts["origin"] == 0
    assert cold.seconds > warm.seconds
    # 2.1 GB at the origin's 400 MB/s total: the origin bounds the cold epoch, and the model
    # consuming as fast as it is served waits for it.
    assert cold.bound == "origin" and cold.io_bound
    assert cold.parts["origin"] == pytest.approx(JOB.store_bytes / 400e6, rel=0.01)
    # The copies begin once the index is read, while the workers start.
    assert cold.seconds == pytest.approx(2 * NFS.request_s(4096) + cold.parts["origin"])
    assert warm.bound == "cpu" and not warm.io_bound
    assert warm.first_batch_s == COSTS.warm_start_s


def test_a_slow_model_is_the_bound_and_nothing_waits() -> None:
    slow = replace(JOB, step_s=1.0)
    cold, warm, _ = epoch_times(NFS, NODE, COSTS, slow)
    assert cold.bound == warm.bound == "model" and not cold.io_bound
    assert warm.parts["model"] == math.ceil(20000 / 64) * 1.0


def test_the_first_batch_reads_its_samples_from_posix_and_waits_for_pieces_from_a_bucket() -> None:
    s3 = Origin.parse("median_ms=20,stream_mbps=25,streams=16,heads=0")
    heads = replace(s3, heads=True)
    job = Job(samples=3000, store_bytes=210_000_000, chunks=4)
    by_pieces = epoch_times(s3, NODE, COSTS, job)[0].first_batch_s
    by_heads = epoch_times(heads, NODE, COSTS, job)[0].first_batch_s
    assert by_heads < by_pieces  # 64 samples touch ~64 pieces of 2.5 MB over 16 connections
    assert by_heads == pytest.approx(
        COSTS.start_s + 2 * s3.request_s(4096) + 4 * s3.request_s(70000)
    )


def test_ranks_that_start_together_on_too_few_cores_start_slower() -> None:
    one = epoch_times(NFS, NODE, COSTS, JOB)[0].first_batch_s
    four = epoch_times(NFS, replace(NODE, ranks=4), COSTS, JOB)[0].first_batch_s
    assert four - one == pytest.approx(COSTS.start_s * (4 * 1.0 / 2 - 1))


def test_a_cold_epochs_cpu_counts_its_start_and_a_warm_one_does_not() -> None:
    """Where the CPU bounds a cold epoch, the start's CPU (every rank's workers starting on
    the node's cores) is not overlapped with the copies (docs/BENCHMARKS.md, issue 49)."""
    costs = replace(COSTS, rank_rate=0.0)
    for ranks in (1, 4):
        node = replace(NODE, ranks=ranks)
        cold, warm = epoch_times(NFS, node, costs, JOB)[:2]
        start_cpu = ranks * costs.start_cores * costs.start_s * max(1.0, ranks * 1.0 / 2)
        copied = JOB.store_bytes * costs.cpu_per_byte_s
        work = JOB.samples * costs.cpu_per_sample_s
        assert cold.parts["cpu"] == pytest.approx((work + copied + start_cpu) / 2)
        assert warm.parts["cpu"] == pytest.approx(work / 2)


def test_a_cache_smaller_than_the_store_reads_the_rest_every_epoch_sample_by_sample() -> None:
    half = replace(SMALL, cache_bytes=JOB.store_bytes // 2)
    cold, warm, _ = epoch_times(NFS, half, COSTS, JOB)
    assert warm.origin_bytes == pytest.approx(JOB.store_bytes / 2, rel=1e-6)
    assert cold.origin_bytes == pytest.approx(JOB.store_bytes, rel=1e-6)
    # From a bucket the same; from a POSIX origin on a node whose page cache holds the rest,
    # a later epoch reads it there.
    bucket = replace(NFS, heads=False)
    assert epoch_times(bucket, replace(NODE, cache_bytes=JOB.store_bytes // 2), COSTS, JOB)[
        1
    ].origin_bytes == pytest.approx(JOB.store_bytes / 2, rel=1e-6)
    roomy = replace(NODE, cache_bytes=JOB.store_bytes // 2)
    assert epoch_times(NFS, roomy, COSTS, JOB)[1].origin_bytes == 0


def test_the_least_cache_is_where_warm_epochs_stop_waiting() -> None:
    job = replace(JOB, step_s=0.01)  # 313 batches a rank: ~3 s of model time an epoch
    cache = least_cache(NFS, SMALL, COSTS, job)
    assert cache is not None and 0 < cache < JOB.store_bytes
    at = epoch_times(NFS, replace(SMALL, cache_bytes=int(cache)), COSTS, job)[1]
    below = epoch_times(NFS, replace(SMALL, cache_bytes=int(cache) // 2), COSTS, job)[1]
    assert not at.io_bound and below.io_bound
    assert below.seconds > at.seconds
    # A model slower than the origin needs no cache at all; a model faster than the local
    # disk cannot be fed by any.
    assert least_cache(NFS, SMALL, COSTS, replace(JOB, step_s=10.0)) == 0
    assert least_cache(NFS, NODE, COSTS, job) == 0  # the page cache holds the whole store
    ram = Node(cores=64, ram_bytes=2**30, disk_bps=1e6)
    fast = Costs(cpu_per_sample_s=1e-7)
    assert least_cache(NFS, ram, fast, JOB) is None


def test_more_nodes_over_one_origin_total_end_up_waiting_without_a_cache() -> None:
    job = replace(JOB, step_s=0.05)
    node = replace(SMALL, cache_bytes=0)
    nodes = fed_nodes(NFS, node, COSTS, job, [1, 2, 4, 8, 16, 32, 64])
    waiting = [n for n, e in nodes.items() if e.io_bound]
    assert waiting and waiting == sorted(waiting) and waiting[-1] == 64
    assert not nodes[1].io_bound  # one node's model is slower than the origin's total
    # A local plan's partition fits every node's cache from some count on.
    local = replace(job, plan="local")
    small = replace(SMALL, cache_bytes=JOB.store_bytes // 8)
    fed = [
        n
        for n, e in fed_nodes(NFS, small, COSTS, local, [1, 2, 4, 8, 16]).items()
        if not e.io_bound
    ]
    assert 8 in fed and 16 in fed


def test_a_partial_plan_exchanges_over_the_link() -> None:
    job = replace(JOB, nodes=4, plan="partial", q=0.5)
    node = replace(NODE, nic_bps=100e6)
    cold, warm, _ = epoch_times(NFS, node, COSTS, job)
    assert cold.parts["exchange"] == 0
    assert warm.parts["exchange"] == pytest.approx(0.5 * JOB.store_bytes / 4 / 100e6)


def test_epoch_times_are_plain_values() -> None:
    e = epoch_times(NFS, NODE, COSTS, JOB)[0]
    assert EpochTime(**e.to_dict()) == e


def test_a_job_without_samples_or_with_an_unknown_plan_is_refused() -> None:
    with pytest.raises(ConfigError):
        Job(samples=0, store_bytes=1, chunks=1)
    with pytest.raises(ConfigError):
        Job(samples=1, store_bytes=1, chunks=1, plan="chunkwise")


@settings(max_examples=200, deadline=None)
@given(
    samples=st.integers(1, 10**7),
    mean=st.integers(1000, 10**6),
    chunks=st.integers(1, 5000),
    nodes=st.integers(1, 512),
    step=st.floats(0, 2),
    cache=st.one_of(st.none(), st.integers(0, 10**13)),
    plan=st.sampled_from(["global", "local", "partial"]),
)
def test_an_epoch_is_its_longest_part_after_its_start(
    samples: int, mean: int, chunks: int, nodes: int, step: float, cache: int | None, plan: str
) -> None:
    job = Job(samples, samples * mean, min(chunks, samples), nodes, plan, 0.3, 2, 64, step)
    node = replace(NODE, cache_bytes=cache, nic_bps=1e9)
    for e in epoch_times(NFS, node, COSTS, job):
        if e.epoch:
            assert e.seconds == pytest.approx(COSTS.warm_start_s + max(e.parts.values()))
        else:
            index = 2 * NFS.request_s(4096)
            assert e.seconds == pytest.approx(max(e.first_batch_s, index + max(e.parts.values())))
        assert all(v >= 0 for v in e.parts.values())
        assert 0 < e.first_batch_s <= e.seconds
        assert 0 <= e.origin_bytes <= job.store_bytes * (1 + 1e-9)
        assert e.io_bound == (e.bound in ("origin", "exchange", "local") and e.parts[e.bound] > 0)
    bigger = replace(node, cache_bytes=None)
    assert epoch_times(NFS, bigger, COSTS, job)[1].origin_bytes <= epoch_times(
        NFS, node, COSTS, job
    )[1].origin_bytes * (1 + 1e-9)
