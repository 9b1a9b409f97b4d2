"""A running job's AM calls Allocate as seldom as the RM asks (rm/sched/pacing.py): with `am.max_allocate_rate` at 0.2
calls a second, one running AM waits 5 s between calls instead of 4 x the 250 ms test interval. Real dev cluster,
real AM; the calls are counted by the RM's own gpurm_rpc_seconds histogram."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster


def allocate_calls(c: DevCluster) -> float:
    with urllib.request.urlopen(f"{c.http_url.rstrip('/')}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gpurm_rpc_seconds_count{") and 'method="Allocate"' in line)


def test_a_running_am_calls_as_seldom_as_the_rm_asks(tmp_path: Path, broker: TestBroker) -> None:
    c = DevCluster(tmp_path / "c", nodes=1, gpus_per_node=1, racks=1, broker=broker,
                   extra=("--rm-option", "am.max_allocate_rate=0.2"))
    try:
        job_id = c.submit("--gpus", "1", "--name", "paced", "--", "sleep", "60")
        c.wait_job(job_id, states=[pb.JOB_RUNNING], timeout=60)
        time.sleep(1.5)                     # the launch's last fast calls
        before = allocate_calls(c)
        time.sleep(6)
        calls = allocate_calls(c) - before
        # Paced: one call every 5 s (1 in 6 s, 2 at a boundary); unpaced it would be one a second (6).
        assert 1 <= calls <= 2, calls
        assert c.gpurm("kill", job_id).code == 0
        assert c.wait_job(job_id, timeout=30).state == pb.JOB_KILLED
    finally:
        c.stop()
