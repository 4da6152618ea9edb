"""The `hostile` marker selects every hostile test: all of tests/hostile (its conftest marks
them) and the damaged or crafted input tested beside the code it attacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

# Hostile tests outside tests/hostile, marked where they stand: a tar slip, a symlink loop, a
# truncated index, a path leaving its source, damaged shards of another format, parts a merge
# refuses, a damaged store under the calibration probe, an index write that fails.
MARKED_ELSEWHERE = [
    "tests/format/test_shards.py::test_tar_slip_names_are_refused[/etc/passwd-absolute]",
    "tests/format/test_shards.py::test_nul_in_a_pax_name_is_refused",
    "tests/format/test_bad_input.py::test_symlink_loop_is_refused",
    "tests/format/test_bad_input.py::test_truncated_index",
    "tests/format/test_bad_input.py::test_file_list_cannot_leave_the_source",
    "tests/format/test_convert_peers.py::test_the_command_names_a_truncated_shard",
    "tests/format/test_convert_peers.py::test_a_shard_name_may_not_leave_the_dataset",
    "tests/format/test_pack_parts.py::test_a_damaged_chunk_is_refused",
    "tests/format/test_pack_parts.py::test_overlapping_parts_are_refused",
    "tests/format/test_index_parts.py::test_a_shard_changed_after_its_part_is_refused",
    "tests/format/test_merge_quick.py::test_a_chunk_altered_in_place_with_its_mtime_put_back",
    "tests/format/test_pathsort.py::test_a_broken_path_order_is_named",
    "tests/test_publish.py::test_an_index_whose_checks_or_writes_fail_leaves_nothing",
    "tests/distributed/test_simulate_time.py::test_a_probe_of_a_damaged_store_fails_in_one_line",
    "tests/distributed/test_simulate_time.py::test_a_probe_past_its_bound_is_stopped_with_what_it_started",
]


def collected(*args: str) -> tuple[list[str], str]:
    """The node ids ``pytest --collect-only -q`` lists with ``args``, and its last line."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode in (0, 5), run.stdout + run.stderr  # 5: every test deselected
    lines = run.stdout.strip().splitlines()
    return [line for line in lines if "::" in line], lines[-1]


@pytest.mark.slow
def test_every_test_in_tests_hostile_is_marked() -> None:
    unmarked, summary = collected("-m", "not hostile", "tests/hostile")
    assert unmarked == []
    assert summary.startswith("no tests collected (") and "deselected" in summary, summary


@pytest.mark.slow
def test_hostile_tests_elsewhere_are_marked() -> None:
    files = sorted({node.split("::")[0] for node in MARKED_ELSEWHERE})
    hostile, _ = collected("-m", "hostile", *files)
    assert [node for node in MARKED_ELSEWHERE if node not in hostile] == []
    plain, _ = collected("-m", "not hostile", *files)
    # The positive tests of those files stay out of the selection.
    assert "tests/format/test_shards.py::test_webdataset_shards_indexed_in_place" in plain
