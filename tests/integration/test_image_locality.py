"""Image locality with real pulls: two agents with image stores of their own (containers.engine_args), a local
registry (Debian's docker-registry) to pull from. A server that holds a job's image reports it (registration,
heartbeat deltas); the job's AM prefers it over an equally good server without; and the start time with and
without a pull is measured (printed: run with -s)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.common.jobspec import image_key
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.containers_fixture import (
    LocalRegistry,
    build_image,
    local_registry,
    needs_podman,
    needs_registry,
    podman,
)
from tests.integration.harness import DevCluster

pytestmark = [needs_podman, needs_registry]
RUNROOT = f"/tmp/gpurm-{uuid.uuid4().hex[:8]}-"      # podman: a runroot of at most 50 characters
ENGINE_ARGS = f'["--root", "{{state_dir}}/engine", "--runroot", "{RUNROOT}{{node_id}}"]'


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[tuple[DevCluster, LocalRegistry]]:
    work = tmp_path_factory.mktemp("loc")
    with local_registry(work) as reg:
        before = os.environ.get("CONTAINERS_REGISTRIES_CONF")
        os.environ["CONTAINERS_REGISTRIES_CONF"] = str(reg.registries_conf)   # the agents pull over plain HTTP
        try:
            c = DevCluster(work / "cluster", nodes=2, gpus_per_node=1, racks=1, broker=broker,
                           extra=["--agent-option", "containers.engine=podman", "--agent-option",
                                  f"containers.engine_args={ENGINE_ARGS}", "--agent-option",
                                  "containers.image_refresh=1s"])
        finally:
            if before is None:
                del os.environ["CONTAINERS_REGISTRIES_CONF"]
            else:
                os.environ["CONTAINERS_REGISTRIES_CONF"] = before
        try:
            yield c, reg
        finally:
            assert c.stop() == 0
            for node in ("node-1", "node-2"):
                store = store_args(c, node)
                podman(*store, "rm", "-af", check=False)
                podman(*store, "rmi", "-af", check=False)
                shutil.rmtree(f"{RUNROOT}{node}", ignore_errors=True)


def store_args(c: DevCluster, node: str) -> list[str]:
    return ["--root", str(c.state_dir / "agents" / node / "engine"), "--runroot", f"{RUNROOT}{node}"]


def wait_images(c: DevCluster, node: str, image: str, timeout: float = 30) -> None:
    key = image_key(image)
    deadline = time.monotonic() + timeout
    while key not in next(n for n in c.nodes() if n.node_id == node).images:
        assert time.monotonic() < deadline, f"{node} never reported {key}"
        time.sleep(0.2)


def run_job(c: DevCluster, image: str) -> pb.Job:
    job_id = c.submit("--gpus", "1", "--image", image, "--", "sh", "-c", "cat /secret-*.txt")
    job = c.wait_job(job_id, timeout=90)
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    return job


PAYLOAD_MIB = 48      # incompressible bytes in each image, so a pull costs what a small framework image's would


def test_an_image_job_prefers_the_server_holding_its_image_and_starts_without_a_pull(
        setup: tuple[DevCluster, LocalRegistry], tmp_path: Path) -> None:
    c, reg = setup
    made = [build_image(tmp_path, {f"/secret-{x}.txt": f"only in image {x}\n",
                                   "/payload.bin": os.urandom(PAYLOAD_MIB << 20)}) for x in "ab"]
    ref_a = reg.push(made[0], "gpurm/a:1")
    ref_b = reg.push(made[1], "gpurm/b:1")
    for tag in made:
        podman("rmi", "-f", tag, check=False)
    # node-2 alone holds image a (node-1 would win the tie between two idle servers by name, or by the AM's salt)
    done = podman(*store_args(c, "node-2"), "pull", "--tls-verify=false", ref_a, check=False)
    assert done.returncode == 0, done.stderr
    wait_images(c, "node-2", ref_a)
    held = [run_job(c, ref_a) for _ in range(3)]
    assert {j.attempts[-1].learners[0].node_id for j in held} == {"node-2"}
    # Image b is nowhere: the chosen server pulls it from the registry, then reports it.
    pulled = run_job(c, ref_b)
    node = pulled.attempts[-1].learners[0].node_id
    wait_images(c, node, ref_b)
    assert "only in image b" in c.gpurm("logs", pulled.job_id).out
    with_image = sorted(j.start_ms - j.submit_ms for j in held)
    without = pulled.start_ms - pulled.submit_ms
    print(f"\nimage job start (submit -> running), {PAYLOAD_MIB} MiB images, this shared 2-core machine: image held "
          f"{with_image} ms, pulled from a loopback registry {without} ms")
    assert all(ms > 0 for ms in [*with_image, without])
