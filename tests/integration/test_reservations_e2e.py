"""No size starves, on a real dev cluster: a job that needs a whole server gets a reservation, and one-GPU jobs
that come later cannot take the GPUs that free there (rm/sched/reservations.py, the daemon's view and grants)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

SLEEP = ["--", "sh", "-c", "sleep 600"]


@pytest.fixture
def cluster(tmp_path: Path, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path / "c", nodes=2, gpus_per_node=4, racks=1, broker=broker,
                   extra=["--rm-option", "scheduler.reservations=1",
                          # at once, not only once a job starves (reserve_behind: unit-tested in test_behind.py)
                          "--rm-option", "scheduler.reserve_behind=0"])
    yield c
    c.stop()


def placement(c: DevCluster) -> dict[str, str]:
    """job id -> the server its GPUs are on."""
    return {a.job_id: n.node_id for n in c.nodes() for a in n.assignments}


def wait_for(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_gpus_freed_on_the_reserved_server_wait_for_the_whole_server_job(cluster: DevCluster) -> None:
    c = cluster
    smalls = [c.submit("--gpus", "1", *SLEEP) for _ in range(8)]
    for j in smalls:
        c.wait_job(j, states=[pb.JOB_RUNNING], timeout=60)
    big = c.submit("--gpus", "4", "--locality", "strict", *SLEEP)
    c.wait_job(big, states=[pb.JOB_ALLOCATING], timeout=30)
    late = [c.submit("--gpus", "1", *SLEEP) for _ in range(4)]
    for j in late:
        c.wait_job(j, states=[pb.JOB_ALLOCATING], timeout=30)
    where = placement(c)
    servers = sorted({where[j] for j in smalls})
    assert len(servers) == 2
    # Two GPUs come free on each server. The 4-GPU job fits on neither; it holds a reservation on one, so the
    # late one-GPU jobs get only the other server's two.
    c.gpurm("kill", "--no-wait", *[j for s in servers for j in [j for j in smalls if where[j] == s][:2]])
    wait_for("two late jobs to start", lambda: sum(c.job(j).state == pb.JOB_RUNNING for j in late) >= 2)
    time.sleep(3)                           # long enough for the late jobs' AMs to plan and ask again
    now_running = [j for j in late if c.job(j).state == pb.JOB_RUNNING]
    assert len(now_running) == 2, [c.gpurm("status", j).out for j in late]
    where = placement(c)
    taken = {where[j] for j in now_running}
    assert len(taken) == 1
    reserved = next(s for s in servers if s not in taken)
    # The rest of the reserved server frees: the 4-GPU job starts there, before the waiting one-GPU jobs.
    c.gpurm("kill", "--no-wait", *[j for j in smalls if where.get(j) == reserved])
    c.wait_job(big, states=[pb.JOB_RUNNING], timeout=60)
    assert placement(c)[big] == reserved
    assert sum(c.job(j).state == pb.JOB_RUNNING for j in late) == 2
