"""Shared GPUs through the real path: the CLI (`--gpus 0.5`, a job file with `gpu_share: 2`), the RM, the AMs and the
agent of a dev cluster with one 2-GPU server. Two half-GPU jobs run side by side on one GPU, each told its share
and memory limit; while they run, the whole-GPU job waits for a whole GPU (never the shared one), the queue counts
the two halves as one GPU, and `gpurm nodes` shows who shares what."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

# Writes its environment, then runs until the test drops the `go` file (so both shares provably run at once).
SHARE_CMD = ('echo "share=$GPURM_GPU_SHARE mem=$GPURM_GPU_MEMORY_MIB gpus=$CUDA_VISIBLE_DEVICES"; '
             'touch {dir}/started-$GPURM_CONTAINER_ID; while [ ! -e {dir}/go ]; do sleep 0.2; done')


def wait_for(test: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("shared"), nodes=1, gpus_per_node=2, racks=1, broker=broker)
    yield c
    c.stop()


def test_two_half_gpu_jobs_share_one_gpu_and_whole_gpu_jobs_keep_off_it(cluster: DevCluster,
                                                                          tmp_path: Path) -> None:
    c = cluster
    tmp_path.chmod(0o777)      # the learners run as an unprivileged user
    cmd = SHARE_CMD.format(dir=tmp_path)
    half = c.submit("--gpus", "0.5", "--name", "half", "--", "sh", "-c", cmd)
    job_file = tmp_path / "other-half.yaml"
    job_file.write_text(f"name: other-half\ngpu_share: 2\ncommand: '{cmd}'\n")
    other = c.submit(str(job_file))
    wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2, timeout=90, what="both shares running")
    jobs = [c.job(half), c.job(other)]
    assert [j.spec.gpu_share_milli for j in jobs] == [500, 500]
    (gpu_a,), (gpu_b,) = (j.attempts[-1].learners[0].gpu_indices for j in jobs)
    assert gpu_a == gpu_b                                  # one GPU, two jobs

    # A 2-GPU job cannot have the shared GPU: it waits while the shares run.
    whole = c.submit("--gpus", "2", "--name", "whole", "--", "true")
    nodes = c.gpurm("nodes").out
    assert f"shared GPU {gpu_a}: 1 (2 jobs)" in nodes, nodes
    queues = c.gpurm("queues", "-o", "json").json()["queues"]
    default = next(q for q in queues if q["path"] == "root.default")
    assert default["used"] == 1.0, default          # two halves count as one GPU
    assert " 0.5 " in c.gpurm("jobs").out
    assert c.job(whole).state in (pb.JOB_QUEUED, pb.JOB_ALLOCATING)

    (tmp_path / "go").touch()
    for job_id in (half, other):
        job = c.wait_job(job_id, timeout=60)
        assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, job.waiting_reason)
        log = c.gpurm("logs", job_id).out
        assert f"share=0.5 mem=40779 gpus={gpu_a}" in log, log
    job = c.wait_job(whole, timeout=90)
    assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, job.waiting_reason)
    assert sorted(job.attempts[-1].learners[0].gpu_indices) == [0, 1]


def test_bad_shares_are_refused_naming_the_field(cluster: DevCluster) -> None:
    r = cluster.gpurm("submit", "--gpus", "1.5", "--", "true")
    assert r.code == 2 and "--gpus:" in r.err and "between 0 and 1" in r.err, r.err
    job_file = cluster.state_dir / "bad-share.yaml"
    job_file.write_text("gpus: 4\ngpu_share: 2\ncommand: 'true'\n")
    r = cluster.gpurm("submit", str(job_file))
    assert r.code == 2 and "gpu_share:" in r.err, r.err
