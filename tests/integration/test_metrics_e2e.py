"""Prometheus metrics through the real path: the RM serves /metrics on its HTTP server, a dev cluster's agents serve
their exporters on ports they report to the RM (`gpurm nodes -o json` shows them), and a real Prometheus server
scrapes them all and answers queries: per-GPU utilisation under DCGM's name labelled with the job on that GPU, the
RM's GPUs by state, its jobs and its RPC latencies."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster
from tests.integration.prom import Prometheus


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("metrics"), nodes=2, gpus_per_node=2, racks=1, broker=broker)
    yield c
    c.stop()


def test_prometheus_scrapes_the_agents_gpu_metrics_with_the_job_on_each_gpu(cluster: DevCluster,
                                                                            tmp_path: Path) -> None:
    c = cluster
    nodes = c.gpurm("nodes", "-o", "json").json()
    targets = [f"{n['host']}:{n['metrics_port']}" for n in nodes]
    assert len(targets) == 2 and all(n["metrics_port"] > 0 for n in nodes), nodes
    with urllib.request.urlopen(f"http://{targets[0]}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "DCGM_FI_DEV_GPU_UTIL{" in text and 'gpu="0"' in text and "gpurm_gpu_healthy" in text

    job_id = c.submit("--gpus", "2", "--name", "busy", "--", "sleep", "30")
    c.wait_job(job_id, states=[pb.JOB_RUNNING], timeout=60)
    rm_target = c.http_url.removeprefix("http://").rstrip("/")
    with urllib.request.urlopen(f"{c.http_url.rstrip('/')}/metrics", timeout=5) as r:
        rm_text = r.read().decode()
    assert 'gpurm_gpus{state="used"} 2.0' in rm_text and "gpurm_rpc_seconds_bucket" in rm_text, rm_text[:2000]
    prom = Prometheus(tmp_path / "prom", {"gpurm-agents": targets, "gpurm-rm": [rm_target]})
    try:
        result = prom.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{gpurm_job="{job_id}"}}', timeout=40,
                               until=lambda r: len(r) == 2)    # both GPUs of the job, on one server
        assert all(55 <= float(r["value"][1]) <= 95 for r in result), result   # the fake GPUs' busy range
        assert {r["metric"]["modelName"] for r in result} == {"H100-80GB"}
        job_node = c.job(job_id).attempts[-1].learners[0].node_id
        assert {r["metric"]["gpurm_node"] for r in result} == {job_node}     # the node id, not just its host
        prom.wait_for("sum(gpurm_gpu_healthy)", until=lambda r: bool(r) and float(r[0]["value"][1]) == 4.0)
        (free,) = prom.wait_for('gpurm_gpus{state="free"}')
        assert float(free["value"][1]) == 2.0 and free["metric"]["job"] == "gpurm-rm"
        running = prom.wait_for('gpurm_jobs{state="RUNNING",queue="root.default"}')
        assert float(running[0]["value"][1]) == 1.0
        assert prom.wait_for('sum(gpurm_rpc_seconds_count{method="Allocate"})')
    finally:
        prom.stop()
        c.gpurm("kill", job_id)
