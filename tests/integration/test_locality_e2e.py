"""The job's locality setting and user errors through the real path: the CLI, the RM, the AM and the agents of
a dev cluster (two 8-GPU servers in one rack)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

SLEEP = ["--", "sh", "-c", "sleep 600"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("locality"), nodes=2, gpus_per_node=8, racks=1, broker=broker)
    yield c
    c.stop()


def waiting_for(c: DevCluster, job_id: str, text: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    reason = ""
    while time.monotonic() < deadline:
        reason = c.job(job_id).waiting_reason
        if text in reason:
            return reason
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never waited with {text!r}; last: {reason!r}")


def kill_all(c: DevCluster, jobs: list[str]) -> None:
    for j in jobs:
        c.gpurm("kill", j)
    for j in jobs:
        c.wait_job(j)


def test_start_level_node_waits_for_one_server_while_rack_and_any_start_at_once(cluster: DevCluster) -> None:
    c = cluster
    # Free 4 on one server and 2 on the other: 6 GPUs fit the rack, never one server.
    sleepers = [c.submit("--gpus", "4", "--start-level", "node", *SLEEP)]
    c.wait_job(sleepers[0], states=[pb.JOB_RUNNING])
    sleepers.append(c.submit("--gpus", "6", "--start-level", "node", *SLEEP))
    c.wait_job(sleepers[1], states=[pb.JOB_RUNNING])
    assert sorted(n.gpus_free for n in c.nodes()) == [2, 4]
    node = c.submit("--gpus", "6", "--start-level", "node", "--locality-timeout", "5m", *SLEEP)
    reason = waiting_for(c, node, "level node")
    assert reason.startswith("waiting for 6 GPUs on one server; level node"), reason
    assert c.job(node).state == pb.JOB_ALLOCATING and c.job(node).attempts[-1].level == "node"
    assert "locality:    prefer (from node; relaxes after 5m per level)" in c.gpurm("status", node).out
    kill_all(c, [node])
    rack = c.submit("--gpus", "6", "--start-level", "rack", "--locality-timeout", "5m", *SLEEP)
    job = c.wait_job(rack, states=[pb.JOB_RUNNING], timeout=30)
    assert job.attempts[-1].level == "rack" and len(job.attempts[-1].learners) == 2
    kill_all(c, [rack])
    anywhere = c.submit("--gpus", "6", "--locality", "any", "--start-level", "node", "--locality-timeout", "5m",
                        *SLEEP)
    job = c.wait_job(anywhere, states=[pb.JOB_RUNNING], timeout=30)
    assert job.attempts[-1].level == "any" and job.spec.locality.mode == "any"
    assert "locality:    any (does not wait for locality)" in c.gpurm("status", anywhere).out
    kill_all(c, [anywhere, *sleepers])


def test_a_start_level_the_cluster_cannot_give_is_skipped_and_the_status_says_why(cluster: DevCluster) -> None:
    c = cluster
    sleeper = c.submit("--gpus", "1", *SLEEP)          # one GPU busy: 16 GPUs can never be free at once
    c.wait_job(sleeper, states=[pb.JOB_RUNNING])
    big = c.submit("--gpus", "16", "--start-level", "node", "--locality", "strict", "--locality-timeout", "5m",
                   *SLEEP)
    reason = waiting_for(c, big, "skipped node")
    assert "level packed" in reason and "skipped node (no server has 16 GPUs)" in reason, reason
    assert "locality strict" in reason
    status = c.gpurm("status", big).out
    assert "skipped node (no server has 16 GPUs)" in status
    assert "locality:    strict (from node;" in status
    kill_all(c, [big, sleeper])


@pytest.mark.parametrize(("args", "diagnostic"), [
    (["--", "gpurm-no-such-command-xyz", "--flag"], "'gpurm-no-such-command-xyz': command not found"),
    (["--workdir", "/nonexistent/gpurm-workdir", "--", "true"], "workdir /nonexistent/gpurm-workdir does not exist"),
    (["--", "sh", "-c", "gpurm-no-such-command-xyz"], "the shell could not find the command"),
])
def test_a_user_error_fails_after_exactly_one_attempt_with_its_diagnostic(
        cluster: DevCluster, args: list[str], diagnostic: str) -> None:
    c = cluster
    j = c.submit("--gpus", "1", "--max-retries", "3", *args)
    job = c.wait_job(j, timeout=60)
    assert job.state == pb.JOB_FAILED, job.diagnostics
    assert len(job.attempts) == 1 and job.failures == 1
    assert job.attempts[0].failure == pb.FAILURE_USER
    assert diagnostic in job.attempts[0].cause and diagnostic in job.diagnostics
    assert "not retried" in job.diagnostics
    status = c.gpurm("status", j).out
    assert diagnostic in status and "attempt 1: FAILED (user)" in status and "attempt 2" not in status


def test_a_command_that_fails_by_itself_is_still_retried(cluster: DevCluster) -> None:
    j = cluster.submit("--gpus", "1", "--max-retries", "1", "--", "sh", "-c", "sleep 0.1; exit 3")
    job = cluster.wait_job(j, timeout=60)
    assert job.state == pb.JOB_FAILED and len(job.attempts) == 2 and job.exit_code == 3
