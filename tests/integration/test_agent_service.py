"""ContainerManager over real gRPC on loopback: tokens, GPU checks, stop, logs, ports."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpurm.common.tokens import TokenKey, sign_container
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.fakegpu import FakeGpuProvider
from gpurm.nodeagent.ports import PortReserver
from gpurm.nodeagent.procgroup import pid_alive
from gpurm.nodeagent.service import ContainerManagerServicer
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pb_grpc

NODE = "node-a"
WAIT = 10.0


@dataclass
class Agent:
    stub: Any
    servicer: ContainerManagerServicer
    supervisor: ContainerSupervisor
    key: TokenKey


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    supervisor = ContainerSupervisor(NODE, tmp_path / "state", stop_grace_s=5.0)
    gpus = FakeGpuProvider(4, "H100-80GB", 81559, 1, NODE).discover()
    key = TokenKey(7, b"k" * 32)
    servicer = ContainerManagerServicer(supervisor, gpus, stop_grace_s=5.0, ports=PortReserver("127.0.0.1"))
    servicer.token_key = key  # as if the RM's registration reply had handed it over
    server = grpc.aio.server()
    servicer.add_to_server(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Agent(pb_grpc.ContainerManagerStub(channel), servicer, supervisor, key)
    finally:
        await channel.close()
        await supervisor.stop_all(0.5)
        await server.stop(None)
        await supervisor.close()


def token(key: TokenKey, cid: str, gpus: list[int], *, node: str = NODE, expiry_ms: int | None = None,
          kind: int = pb.CONTAINER_LEARNER, purpose: int = pb.TOKEN_CONTAINER) -> pb.ContainerToken:
    payload = pb.ContainerTokenPayload(
        container_id=cid, job_id="job-1", node_id=node, gpu_indices=gpus, kind=kind, user="alice",
        expiry_ms=int(time.time() * 1000) + 60_000 if expiry_ms is None else expiry_ms, attempt=1, purpose=purpose)
    return sign_container(payload, key)


def launch(*argv: str) -> pb.LaunchContext:
    return pb.LaunchContext(argv=list(argv))


async def start(a: Agent, cid: str, gpus: list[int], *argv: str) -> pb.ContainerStatus:
    reply = await a.stub.StartContainer(pb.StartContainerRequest(token=token(a.key, cid, gpus),
                                                                 launch=launch(*(argv or ("sleep", "300")))))
    return reply.status


async def expect(code: grpc.StatusCode, call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


async def test_start_with_valid_token(agent: Agent) -> None:
    status = await start(agent, "c1", [0, 1])
    assert status.state == pb.CONTAINER_RUNNING
    assert (status.container_id, status.job_id, status.node_id) == ("c1", "job-1", NODE)
    assert list(status.gpu_indices) == [0, 1]
    assert pid_alive(status.pid)
    again = await start(agent, "c1", [0, 1])  # a retried start is the same container
    assert again.pid == status.pid


@pytest.mark.parametrize("case", ["forged", "wrong-node", "expired", "other-key-id", "missing"])
async def test_bad_tokens_are_refused_and_start_nothing(agent: Agent, case: str) -> None:
    if case == "forged":
        tok = token(TokenKey(agent.key.key_id, b"x" * 32), "c-bad", [0])
        reason = "bad token signature"
    elif case == "wrong-node":
        tok = token(agent.key, "c-bad", [0], node="node-b")
        reason = "token is for node node-b"
    elif case == "expired":
        tok = token(agent.key, "c-bad", [0], expiry_ms=int(time.time() * 1000) - 1)
        reason = "token expired"
    elif case == "other-key-id":
        tok = token(TokenKey(99, agent.key.secret), "c-bad", [0])
        reason = "unknown key 99"
    else:
        tok = pb.ContainerToken()
        reason = "missing container token"
    details = await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.StartContainer(
        pb.StartContainerRequest(token=tok, launch=launch("sleep", "300"))))
    assert reason in details
    assert agent.supervisor.records() == []
    assert not (agent.supervisor.containers_dir / "c-bad").exists()


async def test_forged_payload_with_a_real_signature(agent: Agent) -> None:
    good = token(agent.key, "c-x", [0])
    payload = pb.ContainerTokenPayload.FromString(good.payload)
    payload.gpu_indices.append(1)  # widen the grant, keep the old signature
    forged = pb.ContainerToken(payload=payload.SerializeToString(), signature=good.signature,
                               key_id=good.key_id)
    await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.StartContainer(
        pb.StartContainerRequest(token=forged, launch=launch("sleep", "300"))))
    assert agent.supervisor.records() == []


async def test_before_registration_starts_are_unavailable(agent: Agent) -> None:
    agent.servicer.token_key = None
    details = await expect(grpc.StatusCode.UNAVAILABLE, agent.stub.StartContainer(
        pb.StartContainerRequest(token=token(agent.key, "c1", [0]), launch=launch("true"))))
    assert details == "agent has not registered with the RM yet"


async def test_gpu_checks(agent: Agent) -> None:
    details = await expect(grpc.StatusCode.INVALID_ARGUMENT, agent.stub.StartContainer(
        pb.StartContainerRequest(token=token(agent.key, "c-big", [3, 4]), launch=launch("true"))))
    assert "[4]" in details and "0-3" in details
    await start(agent, "c-a", [2])
    details = await expect(grpc.StatusCode.FAILED_PRECONDITION, agent.stub.StartContainer(
        pb.StartContainerRequest(token=token(agent.key, "c-b", [1, 2]), launch=launch("true"))))
    assert "GPU 2 is held by live container c-a" in details
    await expect(grpc.StatusCode.INVALID_ARGUMENT, agent.stub.StartContainer(
        pb.StartContainerRequest(token=token(agent.key, "c-c", [0]), launch=launch())))


async def test_failed_start_is_a_status_not_an_error(agent: Agent) -> None:
    status = await start(agent, "c-nf", [0], "no-such-command-xyz")
    assert status.state == pb.CONTAINER_FAILED_TO_START
    assert "command not found" in status.diagnostics


async def test_stop_needs_the_containers_own_token(agent: Agent) -> None:
    victim = await start(agent, "c-victim", [0])
    await start(agent, "c-attacker", [1])
    details = await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.StopContainer(
        pb.StopContainerRequest(container_id="c-victim", token=token(agent.key, "c-attacker", [1]))))
    assert "c-attacker" in details
    assert pid_alive(victim.pid)
    await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.StopContainer(
        pb.StopContainerRequest(container_id="c-victim",
                                token=token(TokenKey(7, b"y" * 32), "c-victim", [0]))))
    assert pid_alive(victim.pid)
    # an expired token (the RM renews live ones) or a read-log token stops nothing
    for bad in (token(agent.key, "c-victim", [0], expiry_ms=1),
                token(agent.key, "c-victim", [0], purpose=pb.TOKEN_READ_LOG)):
        await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.StopContainer(
            pb.StopContainerRequest(container_id="c-victim", token=bad)))
    assert pid_alive(victim.pid)
    reply = await asyncio.wait_for(agent.stub.StopContainer(pb.StopContainerRequest(
        container_id="c-victim", token=token(agent.key, "c-victim", [0]), grace_ms=2000,
        reason="test")), WAIT)
    assert reply.status.state == pb.CONTAINER_EXITED and reply.status.stopped
    assert not pid_alive(victim.pid)
    await expect(grpc.StatusCode.NOT_FOUND, agent.stub.StopContainer(
        pb.StopContainerRequest(container_id="c-none", token=token(agent.key, "c-none", [0]))))


async def test_container_status(agent: Agent) -> None:
    await start(agent, "c1", [0])
    await start(agent, "c2", [1])
    # Only the containers whose tokens come with the call are reported: no token, no answer.
    await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.GetContainerStatus(pb.ContainerStatusRequest()))
    await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.GetContainerStatus(
        pb.ContainerStatusRequest(container_ids=["c1"])))
    some = await agent.stub.GetContainerStatus(pb.ContainerStatusRequest(
        container_ids=["c1"], tokens=[token(agent.key, "c2", [1]), token(agent.key, "c9", [2])]))
    assert [(s.container_id, s.state) for s in some.statuses] == [("c2", pb.CONTAINER_RUNNING),
                                                                  ("c9", pb.CONTAINER_LOST)]


async def test_read_log(agent: Agent) -> None:
    await start(agent, "c-log", [], "/bin/sh", "-c", "echo hello; echo world >&2")
    await asyncio.wait_for(agent.supervisor.wait_ended("c-log"), WAIT)
    read = token(agent.key, "c-log", [], purpose=pb.TOKEN_READ_LOG)
    reply = await agent.stub.ReadLog(pb.ReadLogRequest(container_id="c-log", token=read))
    assert (reply.data, reply.next_offset, reply.size) == (b"hello\nworld\n", 12, 12)
    assert reply.container_done
    part = await agent.stub.ReadLog(pb.ReadLogRequest(container_id="c-log", offset=6, max_bytes=3, token=read))
    assert (part.data, part.next_offset) == (b"wor", 9)
    for cid in ("c-none", "../../etc"):
        await expect(grpc.StatusCode.NOT_FOUND, agent.stub.ReadLog(pb.ReadLogRequest(
            container_id=cid, token=token(agent.key, cid, [], purpose=pb.TOKEN_READ_LOG))))
    # Without a token, with a container token (wrong purpose), or with another container's: refused.
    for bad in (pb.ContainerToken(), token(agent.key, "c-log", []),
                token(agent.key, "c-other", [], purpose=pb.TOKEN_READ_LOG)):
        await expect(grpc.StatusCode.PERMISSION_DENIED,
                     agent.stub.ReadLog(pb.ReadLogRequest(container_id="c-log", token=bad)))


async def test_read_log_caps_at_one_mib(agent: Agent) -> None:
    await start(agent, "c-big", [], "/bin/sh", "-c", "head -c 1500000 /dev/zero")
    await asyncio.wait_for(agent.supervisor.wait_ended("c-big"), WAIT)
    read = token(agent.key, "c-big", [], purpose=pb.TOKEN_READ_LOG)
    reply = await agent.stub.ReadLog(pb.ReadLogRequest(container_id="c-big", max_bytes=10_000_000, token=read))
    assert len(reply.data) == 1 << 20 and reply.size == 1_500_000
    default = await agent.stub.ReadLog(pb.ReadLogRequest(container_id="c-big", token=read))
    assert len(default.data) == 64 * 1024


async def test_reserve_port_gives_distinct_usable_ports(agent: Agent) -> None:
    await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.ReservePort(pb.ReservePortRequest(job_id="job-1")))
    await expect(grpc.StatusCode.PERMISSION_DENIED, agent.stub.ReservePort(pb.ReservePortRequest(
        job_id="job-2", token=token(agent.key, "c1", []))))
    ports = [(await agent.stub.ReservePort(pb.ReservePortRequest(job_id="job-1", token=token(agent.key, "c1", []))
              )).port for _ in range(20)]
    assert len(set(ports)) == 20
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
