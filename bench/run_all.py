"""`make bench`: run every benchmark of this repository and print their JSON results.

Benchmarks are never part of the tests; their figures go into docs/BENCHMARKS.md next to
the exact command that produced them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

RUNS: list[list[str]] = [
    ["format_bench.py", "pack", "--files", "10000", "--runs", "3"],
    ["format_bench.py", "index", "--samples", "1000000"],
    ["plans.py", "cost"],
    ["plans.py", "quality"],
    ["tiers.py"],
    ["mount_bench.py", "--images", "6000", "--latency", "heavy-tail"],
    ["guard_bench.py", "--samples", "20000", "--epochs", "2", "--workers", "2"],
    ["dist_bench.py", "--runs", "1", "--epochs", "3", "--step-ms", "30"],
    ["accuracy.py"],
]


def main() -> int:
    """Run each benchmark that exists; returns non-zero if one fails."""
    failed = 0
    for args in RUNS:
        script = HERE / args[0]
        if not script.exists():
            continue
        print(f"== {' '.join(args)}", flush=True)
        failed |= subprocess.run([sys.executable, str(script), *args[1:]]).returncode
    return failed


if __name__ == "__main__":
    sys.exit(main())
