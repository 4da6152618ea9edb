"""`tierfeed simulate` with time: the table and its JSON, the bytes as without time, a real
calibration probe of a store on disk (`python -m tierfeed.torch.calibrate`), and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.ranks import make_store

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).parents[2]


def tierfeed(*args: object, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run(
        [sys.executable, "-m", "tierfeed", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


SYNTHETIC = ("simulate", "--samples", "20000", "--sample-bytes", "100KB", "--ranks", "4")


def test_time_is_printed_beside_the_bytes_which_stay_as_they_were() -> None:
    timed = tierfeed(*SYNTHETIC, "--origin", "nfs", "--step-ms", "20", "--cores", "8")
    assert timed.returncode == 0, timed.stderr
    lines = timed.stdout.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("epoch  seconds")))
    cold, warm = lines[head + 1].split(), lines[head + 2].split()
    assert float(cold[1]) > float(warm[1]) > 0
    assert lines[-2].startswith("cache per node for warm epochs that do not wait: ")
    assert lines[-1].startswith("node counts at which the model does not wait: ")
    plain = tierfeed(*SYNTHETIC, "--json")
    with_time = tierfeed(*SYNTHETIC, "--json", "--origin", "nfs", "--step-ms", "20")
    both = json.loads(with_time.stdout)
    measured = ("plan_seconds_max", "plan_peak_bytes")  # the plan's own time and memory
    bytes_only = [{k: v for k, v in r.items() if k not in measured} for r in both["traffic"]]
    assert bytes_only == [
        {k: v for k, v in r.items() if k not in measured} for r in json.loads(plain.stdout)
    ]
    epochs = both["time"]["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    assert set(epochs[0]["parts"]) == {"origin", "exchange", "local", "cpu", "model"}
    assert epochs[0]["origin_bytes"] > 0 == epochs[1]["origin_bytes"]


def test_a_calibration_probes_a_real_store_and_is_saved_for_later(tmp_path: Path) -> None:
    store = make_store(tmp_path, 600, chunk_size=64 * 1024)
    saved = tmp_path / "calibration.json"
    probe = ("simulate", store, "--ranks", "2", "--ranks-per-node", "2", "--workers", "1")
    done = tierfeed(*probe, "--calibrate", "--save-calibration", saved, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(saved.read_text())
    origin, costs, measured = found["origin"], found["costs"], found["probe"]
    assert origin["heads"] is True and origin["latency_s"] > 0 and origin["total_bps"] > 0
    assert costs["start_s"] >= 0 and costs["cpu_per_sample_s"] > 0 and costs["rank_rate"] > 0
    assert measured["samples"] == 600  # every sample: the store is smaller than the probe
    assert measured["cold_s"] > 0 and measured["warm_s"] > 0
    # The ranks begin each epoch together: a warm epoch's steady part (from the first rank's
    # first batch) lies inside it, not across another rank's cold end.
    assert 0 < measured["warm_steady_s"] <= measured["warm_s"]
    timed = json.loads(done.stdout)["time"]
    assert timed["costs"] == costs
    again = tierfeed(*probe, "--calibration", saved, "--json")
    assert json.loads(again.stdout)["time"] == timed  # the same figures, the same times


@pytest.mark.hostile
def test_what_simulate_cannot_time_is_said_in_one_line(tmp_path: Path) -> None:
    cases = [
        (("--calibrate",), "probes a STORE"),
        (("--origin", "fast"), "fast"),
        (("--calibration", tmp_path / "none.json"), "none.json"),
        (("--origin", "nfs", "--cores", "0"), "--cores"),
        (("--origin", "nfs", "--ranks-per-node", "3"), "does not divide"),
        (("--origin", "nfs", "--ranks-per-node", "0"), "does not divide"),
    ]
    (tmp_path / "bad.json").write_text('{"origin": {"speed": 1}, "costs": {}}')
    cases.append((("--calibration", tmp_path / "bad.json"), "not a saved calibration"))
    for extra, named in cases:
        done = tierfeed(*SYNTHETIC, *extra, timeout=60)
        err = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(err) == 1, done.stderr
        assert err[0].startswith("tierfeed simulate: error: ") and named in err[0], err


@pytest.mark.hostile
def test_a_probe_of_a_damaged_store_fails_in_one_line(tmp_path: Path) -> None:
    store = make_store(tmp_path, 200, chunk_size=16 * 1024)
    first = sorted((store / "chunks").glob("*.tar"))[0]
    first.write_bytes(first.read_bytes()[:100])  # cut short: the origin gives less than asked
    done = tierfeed("simulate", store, "--ranks", "1", "--calibrate")
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1 and err[-1].startswith("tierfeed simulate: error: "), done.stderr
    assert "calibration probe failed" in err[-1]


@pytest.mark.hostile
def test_a_probe_past_its_bound_is_stopped_with_what_it_started(tmp_path: Path) -> None:
    """A probe that hangs (an origin that never answers) ends at its bound, and so do the
    rank processes it started: none is left running once the command has said why."""
    from tierfeed.distributed.simulate_time import run_probe
    from tierfeed.errors import ConfigError

    pid_file = tmp_path / "child.pid"
    hang = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(600)"
    )
    with pytest.raises(ConfigError, match="did not end in 3 s"):
        run_probe([sys.executable, "-c", hang], 3)
    child = int(pid_file.read_text())
    for _ in range(100):  # reaped by init: gone within moments
        if not Path(f"/proc/{child}").exists() or "Z" in _state(child):
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in _state(child)
    assert run_probe([sys.executable, "-c", "print('{}')"], 30).strip() == "{}"
    with pytest.raises(ConfigError, match="the calibration probe failed: broken"):
        run_probe([sys.executable, "-c", "import sys; sys.exit('broken')"], 30)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_the_probes_ranks_end_each_epoch_before_any_begins_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from tierfeed.errors import ConfigError
    from tierfeed.torch import loaderprobe

    ended = []

    def rank(r: int, delay: float) -> None:
        time.sleep(delay)
        loaderprobe._all_done(tmp_path, 0, r, 2)
        ended.append((r, time.monotonic()))

    started = time.monotonic()
    late = threading.Thread(target=rank, args=(1, 0.3))
    late.start()
    rank(0, 0.0)  # waits for rank 1's mark
    late.join(10)
    assert ended[0][1] - started >= 0.3 and len(ended) == 2
    monkeypatch.setattr(loaderprobe, "READY_S", 0.05)
    with pytest.raises(ConfigError, match="did not all end epoch 1"):
        loaderprobe._all_done(tmp_path, 1, 0, 2)  # rank 1 never ends it: the wait is bounded
