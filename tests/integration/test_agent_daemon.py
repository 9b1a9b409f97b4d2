"""The agent daemon as a real process: start-up, agent.json, a shutdown that leaves no container behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml

from gpurm.nodeagent.procgroup import pid_alive
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pb_grpc
from gpurm.rm.tokens import sign_container
from tests.integration.test_agent_tracker import KEY, FakeRM, serve_rm

WAIT = 15.0


def agent_cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "gpurm.nodeagent", "--config", str(config)]


async def wait_file(path: Path, proc: asyncio.subprocess.Process) -> dict[str, object]:
    async def poll() -> dict[str, object]:
        while not path.exists():
            assert proc.returncode is None, f"the agent exited with {proc.returncode}"
            await asyncio.sleep(0.02)
        data: dict[str, object] = json.loads(path.read_text())
        return data
    return await asyncio.wait_for(poll(), WAIT)


@pytest.fixture
async def rm() -> AsyncIterator[tuple[FakeRM, int]]:
    fake = FakeRM(interval_ms=60_000)
    server, port = await serve_rm(fake)
    try:
        yield fake, port
    finally:
        await server.stop(None)


class AgentProcess:
    """`python -m gpurm.nodeagent` with a config pointing at the in-test RM."""

    def __init__(self, tmp_path: Path, rm_port: int, **containers: object) -> None:
        self.tmp_path = tmp_path
        self.state = tmp_path / "state"
        self.config = tmp_path / "agent.yaml"
        self.config.write_text(yaml.safe_dump({
            "node_id": "node-d", "listen": "127.0.0.1:0", "rm": f"127.0.0.1:{rm_port}",
            "state_dir": str(self.state), "gpus": {"fake": 2}, "containers": containers}))
        self.log_path = tmp_path / "agent.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self, fake: FakeRM) -> None:
        with self.log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(*agent_cmd(self.config), stdout=log,
                                                             stderr=subprocess.STDOUT)
        info = await wait_file(self.state / "agent.json", self.proc)
        assert info["node_id"] == "node-d" and info["pid"] == self.proc.pid
        self.port = int(str(info["port"]))
        await fake.wait_for(lambda: bool(fake.registrations), WAIT)
        assert fake.registrations[0].agent_port == self.port

    async def start_container(self, cid: str, script: str) -> pb.ContainerStatus:
        payload = pb.ContainerTokenPayload(
            container_id=cid, job_id="job-d", node_id="node-d", gpu_indices=[1], kind=pb.CONTAINER_LEARNER,
            expiry_ms=int(time.time() * 1000) + 60_000)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = pb_grpc.ContainerManagerStub(channel)
            reply = await stub.StartContainer(pb.StartContainerRequest(
                token=sign_container(payload, KEY), launch=pb.LaunchContext(argv=["/bin/sh", "-c", script])),
                timeout=WAIT)
        status: pb.ContainerStatus = reply.status
        return status

    async def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), WAIT)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def read_pids(path: Path, count: int) -> list[int]:
    async def poll() -> list[int]:
        while len(path.read_text().split() if path.exists() else []) < count:
            await asyncio.sleep(0.01)
        return [int(p) for p in path.read_text().split()[:count]]
    return await asyncio.wait_for(poll(), WAIT)


async def test_shutdown_stops_every_container_and_reports_it(rm: tuple[FakeRM, int], tmp_path: Path) -> None:
    fake, rm_port = rm
    agent = AgentProcess(tmp_path, rm_port, stop_grace="300ms")
    try:
        await agent.start(fake)
        # A container whose whole process group ignores SIGTERM: only the SIGKILL after the grace ends it.
        pids = tmp_path / "pids"
        script = f"trap '' TERM; echo $$ > {pids}; sleep 300 & echo $! >> {pids}; wait"
        status = await agent.start_container("c-d", script)
        assert status.state == pb.CONTAINER_RUNNING
        leader, child = await read_pids(pids, 2)
        assert await agent.terminate() == 0
        assert not pid_alive(leader) and not pid_alive(child)
        final = fake.statuses("c-d")[-1]  # the last beat carried the final status
        assert final.state == pb.CONTAINER_EXITED and final.stopped and final.signal == signal.SIGKILL
        assert not (agent.state / "agent.json").exists()
        record = json.loads((agent.state / "containers" / "c-d" / "record.json").read_text())
        assert record["state"] == "CONTAINER_EXITED"
    finally:
        await agent.kill()
    text = agent.log_path.read_text()
    assert "agent node-d serving ContainerManager on 127.0.0.1:" in text and ", 2 GPUs" in text


async def test_keep_on_shutdown_leaves_containers_running(rm: tuple[FakeRM, int], tmp_path: Path) -> None:
    fake, rm_port = rm
    agent = AgentProcess(tmp_path, rm_port, keep_on_shutdown=True)
    pids = tmp_path / "pids"
    try:
        await agent.start(fake)
        await agent.start_container("c-keep", f"echo $$ > {pids}; exec sleep 300")
        (pid,) = await read_pids(pids, 1)
        assert await agent.terminate() == 0
        assert pid_alive(pid)
        record = json.loads((agent.state / "containers" / "c-keep" / "record.json").read_text())
        assert record["state"] == "CONTAINER_RUNNING" and record["pgid"] == pid  # for a later adoption
    finally:
        await agent.kill()
        if pids.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pids.read_text().split()[0]), signal.SIGKILL)


def test_missing_gpus_fails_with_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s")}))
    done = subprocess.run(agent_cmd(config), capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpus: no GPU provider configured" in lines[0]


def test_busy_listen_port_exits_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        # Even a socket that allows port sharing must not be joined: the agent binds exclusively.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s"),
                                          "listen": f"127.0.0.1:{busy}", "gpus": {"fake": 1}}))
        done = subprocess.run(agent_cmd(config), capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{busy}" in done.stderr
