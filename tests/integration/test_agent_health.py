"""GPU and node health and GPU telemetry end to end: the real RM, the real agent (fake GPUs with injected
faults), a real broker and the real CLI.

- A GPU that falls off the bus under a running learner: the agent stops the learner, the attempt fails as an
  infrastructure failure, and the RM stops offering the GPU (`gpurm nodes` names it).
- Telemetry reaches `gpurm status JOB` (GPU USE per learner) and, through the node's heartbeat and the RM,
  `gpurm/telemetry/<node>` over MQTT (read with the reader login the RM hands out).
- An admin health script printing an ERROR line makes the node UNHEALTHY (offered nothing), and healthy again
  when it stops.
- With `gpus: {nvml: true}` on a machine without NVML the agent exits 2 with one clear line.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpurm.common import mqtt
from gpurm.common.mqtt import Credentials
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT
from tests.integration.rmproc import WAIT, AgentProcess, RMProcess, poll


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    proc = RMProcess(tmp_path_factory.mktemp("health-rm"), broker, heartbeat="1s")
    yield proc
    assert proc.close() == 0, proc.log_text()


def configure(agent: AgentProcess, **sections: Any) -> None:
    """Add sections (health, telemetry, gpus ...) to the agent.yaml AgentProcess wrote."""
    data = yaml.safe_load(agent.config.read_text())
    data.update(sections)
    agent.config.write_text(yaml.safe_dump(data))


def gpurm(rm: RMProcess, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args, "--rm", rm.address], cwd=ROOT,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def telemetry_message(info: pb.ClusterInfo, node_id: str) -> dict[str, Any]:
    reader = Credentials(info.mqtt_username, info.mqtt_password)
    async with mqtt.client(info.mqtt_url, reader) as client:
        await client.subscribe(f"gpurm/telemetry/{node_id}")
        async for message in client.messages:  # retained: the latest reading arrives at once
            payload = message.payload
            assert isinstance(payload, bytes)
            data: dict[str, Any] = json.loads(payload)
            if data["containers"]:
                return data
    raise AssertionError("no telemetry")


def test_gpu_off_the_bus_fails_the_learner_as_infra_and_is_no_longer_offered(
        rm: RMProcess, tmp_path: Path) -> None:
    node_id = f"hlth-{uuid.uuid4().hex[:6]}"
    faults = tmp_path / "faults"
    agent = AgentProcess(tmp_path, rm, node_id)
    configure(agent, gpus={"fake": 2, "fault_file": str(faults)}, health={"gpu_interval": "200ms"},
              telemetry={"interval": "300ms"})
    try:
        agent.start()
        job_id = rm.submit("sleep 300", gpus=1)
        learner = rm.learner(job_id)
        (gpu,) = learner.gpu_indices

        # Telemetry: the learner's GPU use in `gpurm status`, and the node's reading over MQTT.
        def shows_use() -> str | None:
            out = gpurm(rm, "status", job_id)
            return out if "util " in out else None

        status = poll(shows_use, WAIT,
                      lambda: f"no GPU use in `gpurm status {job_id}`:\n{gpurm(rm, 'status', job_id)}", every=0.2)
        assert "% avg, mem " in status
        info = rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
        data = asyncio.run(asyncio.wait_for(telemetry_message(info, node_id), WAIT))
        row = data["gpus"][gpu]
        assert row["container"] == learner.container_id
        assert 55 <= row["util_pct"] <= 95
        assert data["gpus"][1 - gpu]["util_pct"] == 0
        assert data["containers"][learner.container_id]["summary"].startswith("util ")

        # The GPU falls off the bus.
        faults.write_text(f"{gpu} lost\n")
        job = rm.wait_job(job_id, [pb.JOB_FAILED])
        attempt = job.attempts[-1]
        assert attempt.failure == pb.FAILURE_INFRA, attempt
        assert f"GPU {gpu} (GPU-" in attempt.cause and "fell off the bus" in attempt.cause, attempt.cause
        node = rm.wait_node(node_id, check=lambda n: not n.gpus[gpu].healthy)
        assert node.gpus[gpu].health_reason == "fell off the bus"
        assert node.gpus_free == 1
        free = next(n.free_gpus for n in rm.view().nodes if n.node_id == node_id)
        assert list(free) == [1 - gpu]
        assert f"unhealthy GPUs [{gpu}]" in gpurm(rm, "nodes")
        assert "fell off the bus" in agent.log_text()
        # The agent reported the learner's end as an infrastructure failure naming the GPU.
        record = json.loads((agent.state / "containers" / learner.container_id / "record.json").read_text())
        assert record["infra_failure"] is True
        assert f"GPU {gpu} (GPU-" in record["diagnostics"] and "fell off the bus" in record["diagnostics"]
        assert agent.terminate() == 0
    finally:
        agent.close()


def test_health_script_error_makes_the_node_unhealthy(rm: RMProcess, tmp_path: Path) -> None:
    node_id = f"hscr-{uuid.uuid4().hex[:6]}"
    flag = tmp_path / "broken"
    script = tmp_path / "health.sh"
    script.write_text(f"#!/bin/sh\necho checking\nif [ -f {flag} ]; then echo 'ERROR /scratch is full'; fi\n"
                      "exit 3\n")  # a non-zero exit without ERROR is healthy (YARN)
    script.chmod(0o755)
    agent = AgentProcess(tmp_path, rm, node_id)
    configure(agent, health={"script": str(script), "interval": "200ms", "timeout": "5s"})
    try:
        agent.start()
        flag.touch()
        node = rm.wait_node(node_id, pb.NODE_UNHEALTHY)
        assert node.health_report == "ERROR /scratch is full"
        assert node.gpus_free == 0
        assert next(n for n in rm.view().nodes if n.node_id == node_id).free_gpus == []
        listing = gpurm(rm, "nodes")
        line = next(x for x in listing.splitlines() if x.startswith(node_id))
        assert "UNHEALTHY" in line and "ERROR /scratch is full" in line
        flag.unlink()
        node = rm.wait_node(node_id, pb.NODE_RUNNING)
        assert (node.health_report, node.gpus_free) == ("", 2)
        assert agent.terminate() == 0
    finally:
        agent.close()


def nvml_present() -> bool:
    name = ctypes.util.find_library("nvidia-ml")
    if name is None:
        return False
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


@pytest.mark.skipif(nvml_present(), reason="this machine has NVML")
def test_no_nvml_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node_id": "no-nvml", "listen": "127.0.0.1:0", "rm": "127.0.0.1:1",
                                      "state_dir": str(tmp_path / "state"), "memory_mib": 1000,
                                      "gpus": {"nvml": True}, "node_secret": "ab" * 32}))
    done = subprocess.run([sys.executable, "-m", "gpurm.nodeagent", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    lines = [x for x in (done.stdout + done.stderr).splitlines() if x.strip()]
    assert len(lines) == 1, lines
    assert lines[0].endswith("agent no-nvml: no GPUs: NVML is not available (libnvidia-ml.so not found); "
                             "install the NVIDIA driver or set gpus: {fake: N} for a test node")
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "agent", "--discover"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("gpurm agent: error: no GPUs: NVML is not available (libnvidia-ml.so not found); "
                           "install the NVIDIA driver or set gpus: {fake: N} for a test node\n")
