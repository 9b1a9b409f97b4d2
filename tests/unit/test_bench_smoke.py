"""The pure benchmarks still run (tiny sizes): a benchmark that broke silently would report nothing."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import PHILLY

ROOT = PHILLY.parents[2]


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / script), *args], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_scheduler_core_runs() -> None:
    out = run("scheduler_core.py", "--queues", "20", "--jobs", "200", "--nodes", "50", "--repeat", "1")
    assert "scheduling pass" in out and "raw limits" in out


def test_sim_speed_runs() -> None:
    out = run("sim_speed.py", "--jobs", "300", "--policy", "fifo")
    assert "== fifo:" in out and "bare heap loop" in out


def test_sorted_index_runs() -> None:
    out = run("sorted_index.py", "--sizes", "10,100", "--events", "200")
    assert "SortedList" in out and "ratio" in out and "raw limit" in out


def test_tiresias_workload_runs() -> None:
    out = run("tiresias_workload.py", "--jobs", "60", "--loads", "1.5", "--seeds", "0", "--policy", "fifo",
              "--policy", "las")
    assert "load 1.5, seed 0: 60 jobs on 1x15x4" in out and "floor" in out and "1,510s" in out


def test_rightsize_evaluates_the_recorded_fixture_offline() -> None:
    fixtures = sorted(str(p) for p in (ROOT / "tests" / "data" / "rightsize").glob("*.jsonl"))
    out = run("rightsize.py", "--series", *fixtures)
    assert f"{len(fixtures)} recorded series" in out
    for policy in ("peak", "adaptive", "phase", "request"):
        assert f"\n{policy} " in out


def test_retention_runs() -> None:
    out = run("retention.py", "--jobs", "300")
    assert "no retention:" in out and "with retention:" in out and "300 jobs retired" in out and "raw limits" in out
