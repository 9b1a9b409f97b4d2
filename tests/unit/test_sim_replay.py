"""The first 2,000 jobs of the Philly trace through `gpurm sim`'s whole pipeline, with sanity checks."""

from __future__ import annotations

import csv
import gc
import json
import math
from pathlib import Path

import pytest

from gpurm.queues.tree import Policy
from gpurm.sim.run import SimRequest, run
from tests.conftest import philly_data


@pytest.fixture(scope="module")
def head_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = philly_data("jobs-2017-10-02_to_10-15.csv")
    out = tmp_path_factory.mktemp("trace") / "head.csv"
    with src.open() as f:
        lines = [next(f) for _ in range(2001)]       # header + 2,000 jobs
    out.write_text("".join(lines))
    return out


@pytest.mark.parametrize("policy", [Policy.FIFO, Policy.LAS])
def test_replay_of_2000_philly_jobs(head_trace: Path, tmp_path: Path, policy: Policy) -> None:
    out = tmp_path / "out"
    outcome = run(SimRequest(trace=head_trace, fmt="philly-csv", cluster="8x8x8", out=out, policy=policy,
                             plots=policy is Policy.FIFO))
    s = json.loads((out / "summary.json").read_text())
    assert s == json.loads(json.dumps(outcome.summary))
    assert s["jobs"] == 2000 and s["finished"] == 2000 and s["unfinished"] == 0
    assert s["states"]["SUCCEEDED"] == 2000
    assert s["gpus"] == 512
    assert 0 < s["gpu_utilization"] <= 1
    assert 0 <= s["locality"] <= 1
    assert s["load_factor"] > 0 and s["makespan_s"] > 0
    assert s["p50_jct_s"] <= s["p99_jct_s"] and s["avg_queue_s"] >= 0
    shares = [q["gpu_time_share"] for q in s["per_queue"].values()]
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-9)
    assert sum(q["jobs"] for q in s["per_queue"].values()) == 2000
    assert set(s["queue_by_size"]) == {"1", "2-4", "5-8", ">8"}
    # Every job ran at least its trace duration, and no GPU-time appeared from nowhere.
    with (out / "jobs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2000
    for r in rows:
        assert float(r["finish_s"]) - float(r["start_s"]) >= float(r["duration_s"]) - 1e-6
    served = sum(float(r["gpu_seconds_served"]) for r in rows)
    offered = sum(float(r["duration_s"]) * int(r["gpus"]) for r in rows)
    assert served >= offered - 1e-3 * offered
    if policy is Policy.FIFO:
        assert s["preemptions"] == sum(q["preemptions"] for q in s["per_queue"].values())
        for name in ("jct_cdf.png", "queue_delay_by_size.png", "utilization.png", "queue_shares.png"):
            assert (out / name).stat().st_size > 1000


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path, enabled: bool) -> None:
    # run() turns the collector off for the whole run (replay, summary, files): it must hand it back as it was.
    trace = Path(__file__).resolve().parents[1] / "data" / "sim" / "philly_small.csv"
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        outcome = run(SimRequest(trace, "philly-csv", "1x2x8", tmp_path, plots=False))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert outcome.summary["finished"] == 5
