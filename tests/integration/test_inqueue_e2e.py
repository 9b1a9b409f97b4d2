"""In-queue preemption in the daemon (Tiresias' las), on a real dev cluster: the same core path the simulator runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

QUEUES = """
defaults:
  preemption_grace: {grace}
queues:
  research: {{policy: las}}
"""
# One 4-GPU server; a 4-GPU job drops to las level 1 after 8 GPU-seconds (2 s) and may be preempted after 2 s.
# The AMs' default allocate interval (500 ms, 2 s while running), which the graces below are chosen around.
RM_OPTIONS = ["--rm-option", "preemption.in_queue_min_run=2s", "--rm-option", "preemption.las_thresholds=[8s]",
              "--rm-option", "am.allocate_interval=500ms"]


# 3 s: above the running AM's 2 s allocate interval, it hears of it before the kill. 1 s: the kill may come first,
# and the AM gets the notice and the ends in one reply: it must still read a preemption, not the job's failure.
@pytest.fixture(params=["3s", "1s"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, broker: TestBroker) -> Iterator[DevCluster]:
    qfile = tmp_path / "queues.yaml"
    qfile.write_text(QUEUES.format(grace=request.param))
    c = DevCluster(tmp_path / "c", nodes=1, gpus_per_node=4, racks=1, broker=broker,
                   extra=["--queues", str(qfile), *RM_OPTIONS])
    yield c
    c.stop()


def test_las_preempts_a_long_job_for_a_new_one_and_the_long_one_resumes(cluster: DevCluster) -> None:
    c = cluster
    long = c.submit("--gpus", "4", "--queue", "research", "--", "sh", "-c", "sleep 600")
    c.wait_job(long, states=[pb.JOB_RUNNING], timeout=30)
    time.sleep(3)                      # 12 GPU-seconds: level 1, and past the minimum run
    assert c.job(long).preemptions == 0
    short = c.submit("--gpus", "4", "--queue", "research", "--", "sh", "-c", "sleep 3")
    # The newcomer (level 0) outranks the long job (level 1) in its own queue: the long job is preempted ...
    c.wait_job(short, states=[pb.JOB_RUNNING, pb.JOB_SUCCEEDED], timeout=30)
    # The preempted attempt is counted when the long job's AM reports its end, which may come after the newcomer
    # starts on the freed GPUs: wait for that report.
    deadline = time.monotonic() + 30
    while (job := c.job(long)).preemptions == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    # Once: the GPUs it freed wait for the newcomer, though its own AM, polling fast while it stops, asks for them
    # again first (it used to win them back and be preempted again, over and over while the newcomer waited).
    assert job.preemptions == 1 and job.failures == 0, job
    assert job.attempts[0].failure == pb.FAILURE_PREEMPTED and not job.attempts[0].counts_as_failure
    assert "preempted" in c.gpurm("status", long).out
    # ... the newcomer runs to its end, and the long job resumes (same id, a new attempt) on the freed GPUs.
    assert c.wait_job(short, timeout=30).state == pb.JOB_SUCCEEDED
    resumed = c.wait_job(long, states=[pb.JOB_RUNNING], timeout=30)
    assert len(resumed.attempts) == resumed.preemptions + 1 and resumed.failures == 0
    assert all(a.failure == pb.FAILURE_PREEMPTED for a in resumed.attempts[:-1])
    c.gpurm("kill", long, "--no-wait")
