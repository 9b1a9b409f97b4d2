"""`placement: spread` through the real path: the CLI flag, the RM, the AM and the agents of a dev cluster (four
4-GPU servers in two racks). A spread job of 4 GPUs lands on 4 distinct servers in both racks, one learner each
with the usual torchrun variables; a pack job of the same size lands on one server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT, DevCluster

ENV = ["--", "sh", "-c", 'echo "rank $NODE_RANK of $NNODES, $NPROC_PER_NODE here, world $WORLD_SIZE"']


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("spread"), nodes=4, gpus_per_node=4, racks=2, broker=broker)
    yield c
    c.stop()


def test_spread_takes_four_servers_in_both_racks_and_pack_takes_one(cluster: DevCluster) -> None:
    c = cluster
    racks = {n.node_id: n.rack for n in c.nodes()}
    assert len(racks) == 4 and len(set(racks.values())) == 2
    spread = c.submit("--gpus", "4", "--placement", "spread", "--name", "replicas", *ENV)
    job = c.wait_job(spread, timeout=90)
    assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, job.waiting_reason)
    assert job.spec.placement == "spread"
    learners = job.attempts[-1].learners
    assert len(learners) == 4 and len({ln.node_id for ln in learners}) == 4
    assert all(len(ln.gpu_indices) == 1 for ln in learners)
    assert {racks[ln.node_id] for ln in learners} == set(racks.values())
    assert job.attempts[-1].level == "spread:1"
    for ln in learners:
        out = c.gpurm("logs", spread, "--rank", str(ln.rank)).out
        assert f"rank {ln.rank} of 4, 1 here, world 4" in out, out
    status = c.gpurm("status", spread).out
    assert "placement:   spread (one GPU per server" in status, status
    assert "level spread:1" in status, status
    assert " 4 spread " in c.gpurm("jobs").out

    pack = c.submit("--gpus", "4", "--name", "packed", *ENV)
    job = c.wait_job(pack, timeout=90)
    assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, job.waiting_reason)
    learners = job.attempts[-1].learners
    assert len(learners) == 1 and len(learners[0].gpu_indices) == 4
    assert job.spec.placement == "" and "placement:   pack" in c.gpurm("status", pack).out


def test_a_bad_placement_is_refused_naming_the_field(cluster: DevCluster) -> None:
    r = cluster.gpurm("submit", "--gpus", "1", "--placement", "wide", "--", "true")
    assert r.code != 0 and "--placement" in r.err
    job_file = cluster.state_dir / "bad-placement.yaml"
    job_file.write_text("gpus: 1\ncommand: 'true'\nplacement: scatter\n")
    r = cluster.gpurm("submit", str(job_file))
    assert r.code == 2 and "placement:" in r.err and "pack, spread" in r.err, r.err


def test_the_example_job_file_runs_spread(cluster: DevCluster) -> None:
    # configs/jobs/serve-spread-4gpu.yaml: toy_train.py on four servers, rendezvousing over MASTER_ADDR.
    job_id = cluster.submit(str(ROOT / "configs" / "jobs" / "serve-spread-4gpu.yaml"))
    job = cluster.wait_job(job_id, timeout=120)
    assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, job.waiting_reason)
    assert len({ln.node_id for ln in job.attempts[-1].learners}) == 4
