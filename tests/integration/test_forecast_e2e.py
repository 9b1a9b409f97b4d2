"""Start-time forecasts on a real dev cluster (issue 32): a waiting job's forecast shows in `gpurm status`,
`gpurm jobs` (its START column, and `-o json`), the REST API (`forecast` on the job) and the web UI's job page and
jobs table; and the daemon's forecast agrees with the simulator's for the same state (one forecasting code path:
rm/forecast/, driven from the daemon's live core and from the simulator's).

The scenario: one server of 4 GPUs; the history's prior says every 4-GPU job of queue `default` runs 20 s (60 such
jobs). A (4 GPUs, `sleep 20`) runs; B (4 GPUs) waits. The forecast for B: it starts when A is expected to end, 20 s
after A started, at every quantile; the range is widened by `widen` (rm.yaml `forecast.widen`, 0.5 here).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.forecast.records import ForecastSettings
from gpurm.rm.sched.prior import load_prior
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.forecasting import SubmitForecasts
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import Trace, TraceJob
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

RUN_S = 20.0
WIDEN = 0.5


def prior_file(path: Path) -> Path:
    path.write_text("queue,gpus,duration_s\n" + "".join(f"default,4,{RUN_S:g}\n" for _ in range(60)))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    base = tmp_path_factory.mktemp("forecast")
    prior = prior_file(base / "prior.csv")
    c = DevCluster(base / "cluster", nodes=1, gpus_per_node=4, racks=1, broker=broker,
                   extra=["--rm-option", f"scheduler.history.prior={prior}", "--rm-option", "forecast.interval=1s",
                          "--rm-option", f"forecast.widen={WIDEN}"])
    yield c
    assert c.stop() == 0


def wait_forecast(c: DevCluster, job_id: str, timeout: float = 60.0) -> pb.Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = c.job(job_id)
        if job.HasField("forecast") and job.forecast.made_ms:
            return job
        time.sleep(0.2)
    raise TimeoutError(f"{job_id} has no forecast after {timeout}s:\n{c.log_text()[-3000:]}")


def http_get(c: DevCluster, path: str) -> str:
    req = urllib.request.Request(c.http_url + path, headers={"X-Gpurm-User": "alice"})
    with urllib.request.urlopen(req, timeout=15) as resp:
        return str(resp.read().decode())


def sim_forecast_wait(b_after_a_s: float, prior_csv: Path) -> float:
    """The simulator's forecast for B, submitted `b_after_a_s` after A started: its likely wait."""
    trace = Trace([TraceJob("A", 0.0, 4, RUN_S, "default", line=1),
                   TraceJob("B", b_after_a_s, 4, 1.0, "default", line=2)], None, "test")
    prior = load_prior(prior_csv)
    engine = Engine(trace, parse_cluster("1x1x4"), trace_tree(trace.queues()), SimOptions(history_prior=prior))
    hook = SubmitForecasts(engine, 2, ForecastSettings(widen=WIDEN))
    engine.after_arrivals = hook
    engine.run()
    (made,) = hook.made
    assert made.trace_id == "B" and made.likely_s is not None
    return made.likely_s


def test_a_waiting_job_shows_its_forecast_everywhere_and_it_agrees_with_the_simulator(cluster: DevCluster,
                                                                                      tmp_path: Path) -> None:
    a = cluster.submit("--gpus", "4", "--name", "first", "--", "sleep", f"{RUN_S:g}")
    a_job = cluster.wait_job(a, [pb.JOB_RUNNING], timeout=60)
    b = cluster.submit("--gpus", "4", "--name", "second", "--", "true")
    job = wait_forecast(cluster, b)
    f = job.forecast
    assert job.state in (pb.JOB_QUEUED, pb.JOB_ALLOCATING)
    a_start = a_job.start_ms / 1000
    made = f.made_ms / 1000
    likely = f.likely_ms / 1000
    # B starts when A is expected to end: 20 s after it started (its learner started a moment before the job
    # was seen RUNNING; the AM's start and the replay's settling take a moment more).
    assert abs(likely - (a_start + RUN_S)) < 3.0, (likely - a_start)
    assert f.earliest_ms <= f.likely_ms <= f.latest_ms
    assert abs((f.latest_ms - f.likely_ms) / 1000 - WIDEN * (likely - made)) < 1.5
    assert f.horizon_ms == int(ForecastSettings().horizon_s * 1000)

    # The CLI: a line in `gpurm status`, the START column of `gpurm jobs`, the object in -o json.
    status = cluster.gpurm("status", b)
    assert status.code == 0, status.err
    line = next(ln for ln in status.out.splitlines() if ln.startswith("starts:"))
    assert "likely in" in line and "forecast made" in line, line
    listing = cluster.gpurm("jobs")
    assert listing.code == 0, listing.err
    header, *rows = listing.out.splitlines()
    assert "START" in header.split()
    b_row = next(r for r in rows if r.startswith(b))
    assert "~" in b_row and "(" in b_row, b_row
    a_row = next(r for r in rows if r.startswith(a))
    start_col = header.index("START")
    assert a_row[start_col:start_col + 2].strip() in ("-", ""), a_row
    as_json = cluster.gpurm("status", b, "-o", "json")
    assert as_json.json()["forecast"]["likely_ms"] > 0

    # REST and the web UI.
    rest = json.loads(http_get(cluster, f"/api/v1/jobs/{b}"))
    assert rest["forecast"]["made_ms"] > 0 and rest["forecast"]["likely_ms"] >= rest["forecast"]["earliest_ms"]
    page = http_get(cluster, f"/jobs/{b}")
    assert "expected start" in page and "likely in" in page
    jobs_page = http_get(cluster, "/jobs")
    assert "<th>start</th>" in jobs_page.replace(' class="num"', "")

    # The simulator, from the same state (B submitted as long after A started as here), forecasts the same start.
    b_after_a = job.submit_ms / 1000 - a_start
    sim_likely_wait = sim_forecast_wait(b_after_a, prior_file(tmp_path / "prior.csv"))
    daemon_likely_wait = likely - job.submit_ms / 1000
    assert abs(sim_likely_wait - daemon_likely_wait) < 3.0, (sim_likely_wait, daemon_likely_wait)

    # Once B runs, it shows no forecast.
    cluster.wait_job(b, timeout=90)
    done = cluster.gpurm("status", b)
    assert "starts:" not in done.out
