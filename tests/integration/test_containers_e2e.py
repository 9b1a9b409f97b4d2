"""Image jobs through the CLI on a real dev cluster whose agents run podman: the job in its image, logs, a
missing image failing once without retry, kill, and `gpurm nodes` showing how each server passes GPUs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from gpurm.common.jobspec import image_key
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.containers_fixture import engine_containers, images, needs_podman
from tests.integration.harness import DevCluster

pytestmark = needs_podman
__all__ = ["images"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("ctr"), nodes=2, gpus_per_node=2, racks=1, broker=broker,
                   extra=["--agent-option", "containers.engine=podman"])
    yield c
    assert c.stop() == 0


def test_nodes_show_the_engine_and_gpu_passing(cluster: DevCluster) -> None:
    assert {(n.container_engine, n.gpu_passing) for n in cluster.nodes()} == {("podman", "env")}
    out = cluster.gpurm("nodes").out
    assert "IMAGES" in out.splitlines()[0] and out.count("podman/env") == 2, out
    agent_log = (cluster.state_dir / "agents" / "node-1" / "agent.log").read_text()
    assert "container engine: podman" in agent_log


def test_an_image_job_runs_in_its_image_with_its_logs(cluster: DevCluster, images: dict[str, str]) -> None:
    job_id = cluster.submit("--gpus", "2", "--image", images["a"], "--shm-size", "64m", "--", "sh", "-c",
                            "cat /secret-a.txt; id -u; echo world=$WORLD_SIZE master=$MASTER_ADDR; pwd")
    job = cluster.wait_job(job_id, timeout=90)
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    assert job.spec.image == images["a"] and job.spec.shm_size_mib == 64
    status = cluster.gpurm("status", job_id).out
    assert f"{images['a']}; /dev/shm 64 MiB" in status and "/gpurm/work (in its image)" in status, status
    ran_on = job.attempts[-1].learners[0].node_id      # reports the image it now holds (its list refreshed)
    deadline = time.monotonic() + 20
    while not any(n["node_id"] == ran_on and image_key(images["a"]) in n["images"]
                  for n in json.loads(cluster.gpurm("nodes", "-o", "json").out)):
        assert time.monotonic() < deadline, cluster.gpurm("nodes", "-o", "json").out
        time.sleep(0.2)
    out = cluster.gpurm("logs", job_id).out
    assert "only in image a" in out and "world=2 " in out and "/gpurm/work" in out, out
    assert "\n0\n" not in f"\n{out}"                      # never root inside
    assert "master=127.0.0.1" in out or "master=localhost" in out, out


def test_a_missing_image_fails_the_job_once_without_retry(cluster: DevCluster) -> None:
    job_id = cluster.submit("--gpus", "1", "--max-retries", "3", "--image", "localhost/gpurm-missing:1", "--",
                            "true")
    seen: set[str] = set()          # the pull shows while it lasts (podman tries a registry three times)
    deadline = time.monotonic() + 90
    while (job := cluster.job(job_id)).state not in (pb.JOB_FAILED, pb.JOB_SUCCEEDED, pb.JOB_KILLED):
        seen.add(job.waiting_reason)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert any("pulling image localhost/gpurm-missing:1" in w for w in seen), seen
    assert job.state == pb.JOB_FAILED, job.diagnostics
    assert len(job.attempts) == 1, [a.diagnostics for a in job.attempts]
    assert "localhost/gpurm-missing:1" in job.diagnostics and "could not be pulled" in job.diagnostics
    status = cluster.gpurm("status", job_id).out
    assert "could not be pulled" in status


def test_kill_stops_the_container(cluster: DevCluster, images: dict[str, str]) -> None:
    job_id = cluster.submit("--gpus", "1", "--image", images["b"], "--", "sh", "-c",
                            "echo started; while true; do sleep 0.2; done")
    cluster.wait_job(job_id, states=[pb.JOB_RUNNING], timeout=60)
    deadline = time.monotonic() + 20           # RUNNING from the launcher's start; the engine creates it right after
    while "started" not in cluster.gpurm("logs", job_id).out:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert engine_containers(f"gpurm.job={job_id}")
    result = cluster.gpurm("kill", job_id)
    assert result.code == 0, result.err
    job = cluster.wait_job(job_id, timeout=60)
    assert job.state == pb.JOB_KILLED
    assert not engine_containers(f"gpurm.job={job_id}")


def test_a_bad_mount_is_refused_at_submit(cluster: DevCluster) -> None:
    result = cluster.gpurm("submit", "--gpus", "1", "--image", "x:1", "--mount", "/etc:/etc", "--", "true")
    assert result.code == 2 and "mounts[0].target" in result.err, result.err
    result = cluster.gpurm("submit", "--gpus", "1", "--mount", "/data", "--", "true")
    assert result.code == 2 and "only for jobs with an image" in result.err, result.err


def test_an_image_job_waits_where_no_server_runs_images(tmp_path_factory: pytest.TempPathFactory,
                                                        broker: TestBroker) -> None:
    plain = DevCluster(tmp_path_factory.mktemp("plain"), nodes=1, gpus_per_node=1, racks=1, broker=broker,
                       extra=["--agent-option", "containers.engine=none"])
    try:
        assert [n.container_engine for n in plain.nodes()] == [""]
        assert "IMAGES" in (out := plain.gpurm("nodes").out) and " - " in out, out
        job_id = plain.submit("--gpus", "1", "--image", "localhost/anything:1", "--", "true")
        deadline = time.monotonic() + 60
        while "container engine" not in (job := plain.job(job_id)).waiting_reason:
            assert time.monotonic() < deadline, job.waiting_reason
            time.sleep(0.2)
        assert job.state in (pb.JOB_QUEUED, pb.JOB_ALLOCATING) and not job.attempts[-1].learners
        assert "no running server has a container engine" in plain.gpurm("status", job_id).out
        assert plain.gpurm("kill", job_id).code == 0
    finally:
        assert plain.stop() == 0


PREEMPT_QUEUES = """
defaults:
  fair_share_preemption_timeout: 3s
  min_share_preemption_timeout: off
  preemption_grace: 5s
queues:
  team-a: {}
  team-b: {}
"""
NOTICE = 'trap "echo got the notice; exit 0" TERM; echo up; while true; do sleep 0.2; done'


def test_preemption_notice_reaches_the_container(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker,
                                                 images: dict[str, str]) -> None:
    work = tmp_path_factory.mktemp("preempt")
    qfile = work / "queues.yaml"
    qfile.write_text(PREEMPT_QUEUES)
    c = DevCluster(work / "c", nodes=1, gpus_per_node=4, racks=1, broker=broker,
                   extra=["--queues", str(qfile), "--agent-option", "containers.engine=podman"])
    try:
        a_jobs = [c.submit("--gpus", "2", "--queue", "team-a", "--image", images["a"], "--", "sh", "-c", NOTICE)
                  for _ in range(2)]
        for j in a_jobs:
            c.wait_job(j, states=[pb.JOB_RUNNING], timeout=60)
        newest = max(a_jobs, key=lambda j: c.job(j).start_ms)
        b = c.submit("--gpus", "2", "--queue", "team-b", "--", "sh", "-c", "sleep 600")
        c.wait_job(b, states=[pb.JOB_RUNNING], timeout=60)
        job = c.job(newest)
        assert job.preemptions >= 1 and job.failures == 0, job
        assert "got the notice" in c.gpurm("logs", newest, "--attempt", "1").out   # SIGTERM reached its process
        first = job.attempts[0].learners[0].container_id
        assert first and not engine_containers(f"gpurm.container={first}")     # the preempted container is gone
        for j in (*a_jobs, b):
            c.gpurm("kill", j, "--no-wait")
    finally:
        assert c.stop() == 0
