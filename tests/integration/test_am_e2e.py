"""The Philly AM on a real dev cluster: packing, waiting, relaxing, retries, lost agents and AM restarts."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT, DevCluster, alive

SLEEP = ["--", "sh", "-c", "sleep 600"]
TOY = str(ROOT / "configs" / "jobs" / "toy_train.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    # Four 8-GPU servers in one rack; quick node expiry for the lost-agent test.
    c = DevCluster(tmp_path_factory.mktemp("am"), nodes=4, racks=1, broker=broker,
                   extra=["--heartbeat", "500ms", "--missed-beats", "8"])
    yield c
    c.stop()


def fragment(c: DevCluster) -> list[str]:
    """Three 5-GPU sleepers, one per server (best fit puts each on a fresh one): free 3, 3, 3, 8."""
    jobs = []
    for _ in range(3):
        j = c.submit("--gpus", "5", "--start-level", "node", *SLEEP)
        c.wait_job(j, states=[pb.JOB_RUNNING])
        jobs.append(j)
    frees = sorted(n.gpus_free for n in c.nodes())
    assert frees == [3, 3, 3, 8], frees
    return jobs


def kill_all(c: DevCluster, jobs: list[str]) -> None:
    for j in jobs:
        c.gpurm("kill", j)


def test_a_16_gpu_job_waits_while_fragmented_and_starts_packed_when_servers_free_up(cluster: DevCluster) -> None:
    c = cluster
    sleepers = fragment(c)
    big = c.submit("--gpus", "16", "--locality-timeout", "5m", "--", "python3", TOY, "--steps", "5")
    deadline = time.monotonic() + 15
    reason = ""
    while time.monotonic() < deadline and "packed" not in reason:
        reason = c.job(big).waiting_reason
        time.sleep(0.2)
    assert "waiting for 16 GPUs packed on 2 servers in one rack; level packed" in reason, reason
    assert "servers in rack" in reason and "hold" in reason
    assert c.job(big).state == pb.JOB_ALLOCATING
    kill_all(c, sleepers[:2])
    job = c.wait_job(big, timeout=60)
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    attempt = job.attempts[-1]
    assert attempt.level == "packed" and len(attempt.learners) == 2
    assert sorted(len(ln.gpu_indices) for ln in attempt.learners) == [8, 8]
    kill_all(c, sleepers[2:])


def test_a_job_that_cannot_pack_relaxes_to_rack_after_its_timeout(cluster: DevCluster) -> None:
    c = cluster
    sleepers = fragment(c)
    t0 = time.monotonic()
    big = c.submit("--gpus", "16", "--locality-timeout", "3s", "--backoff-base", "1s", "--backoff-max", "2s",
                   "--", "python3", TOY, "--steps", "5")
    job = c.wait_job(big, timeout=60)
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    assert time.monotonic() - t0 >= 3                       # it waited out the packed level first
    attempt = job.attempts[-1]
    assert attempt.level == "rack"
    assert sorted(len(ln.gpu_indices) for ln in attempt.learners) == [2, 3, 3, 8]   # 8 + 3 + 3 + 2
    kill_all(c, sleepers)


def test_exit_3_is_retried_to_the_cap_then_failed_with_each_cause(cluster: DevCluster) -> None:
    c = cluster
    j = c.submit("--gpus", "1", "--max-retries", "1", "--", "sh", "-c", "exit 3")
    job = c.wait_job(j, timeout=60)
    assert job.state == pb.JOB_FAILED and job.exit_code == 3
    assert [a.attempt for a in job.attempts] == [1, 2] and job.failures == 2
    assert all(a.counts_as_failure and "exited with code 3" in a.cause for a in job.attempts)
    assert "failed 2 times (max_retries 1)" in job.diagnostics
    assert "attempt 1:" in job.diagnostics and "attempt 2:" in job.diagnostics
    status = c.gpurm("status", j).out
    assert status.count("cause: rank 0 on") == 2


def test_the_same_exit_code_twice_quickly_is_a_user_error(cluster: DevCluster) -> None:
    j = cluster.submit("--gpus", "1", "--max-retries", "5", "--", "sh", "-c", "exit 4")
    job = cluster.wait_job(j, timeout=60)
    assert job.state == pb.JOB_FAILED and len(job.attempts) == 2 and "user error" in job.diagnostics


def learner_pids(c: DevCluster, job_id: str) -> dict[int, int]:
    return {ln.rank: ln.pid for ln in c.job(job_id).attempts[-1].learners}


def test_sigkill_of_an_agent_mid_run_moves_the_attempt_and_it_succeeds(cluster: DevCluster) -> None:
    c = cluster
    j = c.submit("--gpus", "8", "--start-level", "node", "--", "python3", TOY, "--steps", "60")
    c.wait_job(j, states=[pb.JOB_RUNNING])
    job = c.job(j)
    victim = job.attempts[-1].learners[0].node_id
    agent = c.agent_pid(victim)
    os.kill(agent, signal.SIGKILL)
    try:
        job = c.wait_job(j, timeout=90)
        assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
        first, last = job.attempts[0], job.attempts[-1]
        assert first.failure == pb.FAILURE_INFRA and first.counts_as_failure and "lost" in first.cause
        assert all(ln.node_id != victim for ln in last.learners)     # the lost server is avoided
    finally:
        # The dead agent's learner is an orphan on this one machine; stop it before the next test.
        for record in c.state_dir.glob(f"agents/{victim}/containers/*/record.json"):
            data = json.loads(record.read_text())
            if data.get("state") == "CONTAINER_RUNNING" and data.get("pgid"):
                try:
                    os.killpg(int(data["pgid"]), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_sigkill_of_the_am_and_the_job_succeeds_without_restarting_its_learners(cluster: DevCluster) -> None:
    c = cluster
    live = [n.node_id for n in c.nodes() if n.state == pb.NODE_RUNNING]
    assert len(live) >= 2
    j = c.submit("--gpus", "16", "--", "python3", TOY, "--steps", "80")
    c.wait_job(j, states=[pb.JOB_RUNNING])
    time.sleep(0.5)
    before = learner_pids(c, j)
    am_pid = next(int(json.loads(p.read_text())["pid"])
                  for p in c.state_dir.glob(f"agents/*/containers/{j}-am1/record.json"))
    os.kill(am_pid, signal.SIGKILL)
    job = c.wait_job(j, timeout=60)
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    assert job.am_attempt == 2 and len(job.attempts) == 1               # a new AM, not a new attempt
    assert {ln.rank: ln.pid for ln in job.attempts[0].learners} == before  # the same learner processes
    assert not alive(am_pid)
    assert "rank 1 done" in c.gpurm("logs", j, "--rank", "1").out


def test_the_am_follows_the_view_over_mqtt(cluster: DevCluster) -> None:
    sleepers = [cluster.submit("--gpus", "2", *SLEEP) for _ in range(2)]
    j = cluster.submit("--gpus", "4", "--", "sh", "-c", "sleep 6")
    # The view changes while its AM lives (the sleepers' GPUs come free): it hears of that over MQTT. (The
    # sleepers' own starts may all come before the AM subscribes on a loaded machine.)
    for running in (*sleepers, j):
        cluster.wait_job(running, states=[pb.JOB_RUNNING], timeout=60)
    kill_all(cluster, sleepers)
    assert cluster.wait_job(j).state == pb.JOB_SUCCEEDED
    am_log = cluster.gpurm("logs", j, "--am").out
    assert "polling the RM" not in am_log                               # MQTT was there: no fallback
    summary = next(line for line in am_log.splitlines() if "cluster view:" in line)
    deltas = int(summary.split(" deltas over MQTT")[0].rsplit(" ", 1)[1])
    assert deltas >= 1, summary


def test_without_mqtt_the_am_polls_the_rm_and_the_job_still_runs(tmp_path: Path, broker: TestBroker) -> None:
    # Hold the port bound without listening for the whole test: connects are refused at once, and no daemon of
    # the dev cluster can be handed the same port (a released port was once reused, and the AM hung on it).
    hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hold.bind(("127.0.0.1", 0))
    dead = dataclasses.replace(broker, url=f"mqtt://127.0.0.1:{hold.getsockname()[1]}")
    c = DevCluster(tmp_path / "c", nodes=2, racks=1, broker=dead)
    try:
        j = c.submit("--gpus", "16", "--", "python3", TOY, "--steps", "3")
        job = c.wait_job(j, timeout=60)
        assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
        am_log = c.gpurm("logs", j, "--am").out
        assert "polling the RM" in am_log and "0 deltas over MQTT" in am_log
        assert "rank 1 done" in c.gpurm("logs", j, "--rank", "1").out   # logs still come over gRPC
    finally:
        c.stop()
        hold.close()
