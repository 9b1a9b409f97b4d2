"""The agent's RM connection against a stand-in ResourceTracker served over real gRPC on loopback.

`FakeRM` records what the agent sends and lets a test push responses (stop orders, re-register); the other
agent tests import it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpurm.nodeagent.config import AgentConfig, load_agent_config
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.fakegpu import FakeGpuProvider
from gpurm.nodeagent.procgroup import pid_alive
from gpurm.nodeagent.tracker import Registration, Tracker
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pb_grpc
from gpurm.rm.tokens import TokenKey

NODE = "node-a"
WAIT = 10.0
KEY = TokenKey(3, b"s" * 32)


class FakeRM(pb_grpc.ResourceTrackerServicer):
    def __init__(self, key: TokenKey = KEY, *, interval_ms: int = 60_000, mqtt_url: str = "") -> None:
        self.key = key
        self.interval_ms = interval_ms
        self.mqtt_url = mqtt_url
        self.ack = True
        self.stop_containers: list[str] = []
        self.registrations: list[pb.RegisterNodeRequest] = []
        self.beats: list[pb.NodeHeartbeat] = []
        self._streams: list[asyncio.Queue[pb.HeartbeatResponse | None]] = []
        self._changed = asyncio.Condition()

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Any) -> pb.RegisterNodeResponse:
        self.registrations.append(request)
        await self._notify()
        return pb.RegisterNodeResponse(
            session=f"s{len(self.registrations)}", heartbeat_interval_ms=self.interval_ms,
            token_key=self.key.secret, token_key_id=self.key.key_id, mqtt_url=self.mqtt_url,
            stop_containers=self.stop_containers)

    async def Heartbeat(self, request_iterator: Any, context: Any) -> AsyncIterator[pb.HeartbeatResponse]:
        queue: asyncio.Queue[pb.HeartbeatResponse | None] = asyncio.Queue()
        self._streams.append(queue)

        async def pump() -> None:
            try:
                async for beat in request_iterator:
                    self.beats.append(beat)
                    await self._notify()
                    await queue.put(pb.HeartbeatResponse(ack_seq=beat.seq if self.ack else 0,
                                                         action=pb.HEARTBEAT_OK))
            finally:
                await queue.put(None)

        task = asyncio.create_task(pump())
        try:
            while (response := await queue.get()) is not None:
                yield response
        finally:
            task.cancel()
            self._streams.remove(queue)

    async def push(self, response: pb.HeartbeatResponse) -> None:
        """Send a response on every open heartbeat stream, unprompted."""
        for queue in self._streams:
            await queue.put(response)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    def statuses(self, cid: str) -> list[pb.ContainerStatus]:
        """Every status of `cid` that reached this RM, registrations and beats in order of arrival."""
        out = [s for r in self.registrations for s in r.containers if s.container_id == cid]
        return out + [s for b in self.beats for s in b.containers if s.container_id == cid]

    def reported_ended(self, cid: str) -> bool:
        return any(s.state == pb.CONTAINER_EXITED for s in self.statuses(cid))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


async def serve_rm(rm: FakeRM, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_ResourceTrackerServicer_to_server(rm, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


async def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


def agent_config(tmp_path: Path, rm_port: int) -> AgentConfig:
    return load_agent_config(None, {
        "node_id": NODE, "rm": f"127.0.0.1:{rm_port}", "rack": "r1", "ib_domain": "ib1", "cpus": 8,
        "memory_mib": 64000, "listen": "127.0.0.1:0", "state_dir": str(tmp_path / "state"),
        "gpus": {"fake": 2}, "containers": {"stop_grace": "2s"}}, environ={})


class Harness:
    def __init__(self, tmp_path: Path, rm: FakeRM, server: grpc.aio.Server, port: int) -> None:
        self.rm, self.server, self.port = rm, server, port
        self.cfg = agent_config(tmp_path, port)
        self.sup = ContainerSupervisor(NODE, self.cfg.state_dir, stop_grace_s=2.0)
        self.gpus = FakeGpuProvider(2, "H100-80GB", 81559, 1, NODE).discover()
        self.regs: list[Registration] = []
        self.tracker = Tracker(self.cfg, self.sup, self.gpus, agent_port=12345,
                               on_registered=self.regs.append)
        self.task: asyncio.Task[None] | None = None

    def run(self) -> None:
        self.task = asyncio.create_task(self.tracker.run())

    async def start(self, cid: str, *argv: str, gpus: tuple[int, ...] = ()) -> int:
        rec = await self.sup.start(cid, "job-1", pb.CONTAINER_LEARNER, list(argv or ("sleep", "300")), {}, "",
                                   list(gpus), 1, "alice")
        return rec.pid


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    rm = FakeRM()
    server, port = await serve_rm(rm)
    h = Harness(tmp_path, rm, server, port)
    try:
        yield h
    finally:
        if h.task is not None:
            h.task.cancel()
            await asyncio.gather(h.task, return_exceptions=True)
        await h.tracker.close()
        await h.sup.stop_all(0.5)
        await h.sup.close()
        await h.server.stop(None)


async def test_registration_reports_the_node_and_its_containers(harness: Harness) -> None:
    pid = await harness.start("c-early", gpus=(1,))
    harness.run()
    await harness.rm.wait_for(lambda: len(harness.rm.registrations) == 1)
    req = harness.rm.registrations[0]
    assert (req.node_id, req.host, req.agent_port) == (NODE, "127.0.0.1", 12345)
    assert (req.rack, req.ib_domain) == ("r1", "ib1")
    assert (req.cpus, req.memory_mib, req.healthy, req.agent_version) == (8, 64000, True, "0.1.0")
    assert len(req.agent_instance) == 32
    assert [g.index for g in req.gpus] == [0, 1]
    assert req.gpus[0].links[0].level == pb.LINK_NVLINK
    assert [(s.container_id, s.state, s.pid, list(s.gpu_indices)) for s in req.containers] == [
        ("c-early", pb.CONTAINER_RUNNING, pid, [1])]
    await wait_until(lambda: bool(harness.regs))
    assert harness.regs[0].token_key == KEY and harness.regs[0].session == "s1"
    await harness.rm.wait_for(lambda: bool(harness.rm.beats))
    first = harness.rm.beats[0]
    assert (first.node_id, first.session, first.healthy) == (NODE, "s1", True)


async def test_changes_go_out_at_once_and_are_forgotten_after_ack(harness: Harness) -> None:
    harness.run()  # the heartbeat interval is 60 s: only an immediate beat can report in time
    await harness.rm.wait_for(lambda: bool(harness.rm.beats))
    await harness.start("c-quick", "/bin/sh", "-c", "exit 4")
    await harness.rm.wait_for(lambda: harness.rm.reported_ended("c-quick"))
    ended = [s for s in harness.rm.statuses("c-quick") if s.state == pb.CONTAINER_EXITED][-1]
    assert ended.exit_code == 4 and ended.node_id == NODE
    await wait_until(lambda: harness.sup.record("c-quick") is None)
    assert harness.tracker.pending == []
    seqs = [b.seq for b in harness.rm.beats]
    assert seqs == sorted(set(seqs))


async def test_unacknowledged_changes_are_resent_until_acked(harness: Harness) -> None:
    harness.rm.ack = False
    harness.rm.interval_ms = 50
    harness.run()
    await harness.rm.wait_for(lambda: bool(harness.rm.beats))  # registered before the container exists
    await harness.start("c-unacked", "/bin/true")
    await harness.rm.wait_for(lambda: sum(s.state == pb.CONTAINER_EXITED
                                          for s in harness.rm.statuses("c-unacked")) >= 3)
    assert harness.tracker.pending == ["c-unacked"]
    assert harness.sup.record("c-unacked") is not None  # not forgotten while the RM owes an ack
    harness.rm.ack = True
    await wait_until(lambda: harness.sup.record("c-unacked") is None)


async def test_stop_orders(harness: Harness) -> None:
    doomed = await harness.start("c-doomed")
    harness.rm.stop_containers = ["c-doomed"]  # "I do not know this one"
    harness.run()
    ordered = await harness.start("c-ordered", gpus=(0,))
    await harness.rm.wait_for(lambda: harness.rm.reported_ended("c-doomed"))
    assert not pid_alive(doomed)
    await harness.rm.push(pb.HeartbeatResponse(stop=[pb.StopOrder(container_id="c-ordered", grace_ms=500,
                                                                  reason="preempted")]))
    await harness.rm.wait_for(lambda: harness.rm.reported_ended("c-ordered"))
    final = harness.rm.statuses("c-ordered")[-1]
    assert final.stopped and final.signal == 15 and "preempted" in final.diagnostics
    assert not pid_alive(ordered)


async def test_reregister_when_asked(harness: Harness) -> None:
    harness.run()
    await harness.start("c-live")
    await harness.rm.wait_for(lambda: bool(harness.rm.beats))  # the stream is open
    await harness.rm.push(pb.HeartbeatResponse(action=pb.HEARTBEAT_REREGISTER))
    await harness.rm.wait_for(lambda: len(harness.rm.registrations) == 2)
    assert [s.container_id for s in harness.rm.registrations[1].containers] == ["c-live"]
    await harness.rm.wait_for(lambda: any(b.session == "s2" for b in harness.rm.beats))
    assert harness.rm.registrations[0].agent_instance == harness.rm.registrations[1].agent_instance


async def test_survives_an_rm_restart(harness: Harness) -> None:
    harness.run()
    kept = await harness.start("c-kept", gpus=(0,))
    ends = await harness.start("c-ends", gpus=(1,))
    await harness.rm.wait_for(lambda: bool(harness.rm.beats))  # registered, and the stream is open
    await wait_until(lambda: harness.tracker.pending == [])
    await harness.server.stop(None)  # the RM goes away ...
    await wait_until(lambda: not harness.tracker.registered.is_set())
    await harness.sup.stop("c-ends", 1.0, "ended while the RM was down")
    assert not pid_alive(ends)
    assert harness.tracker.pending == ["c-ends"]
    rm2 = FakeRM()
    harness.server, _ = await serve_rm(rm2, harness.port)  # ... and comes back on its address
    harness.rm = rm2
    await rm2.wait_for(lambda: len(rm2.registrations) >= 1)
    reported = {s.container_id: s for s in rm2.registrations[0].containers}
    assert reported["c-kept"].state == pb.CONTAINER_RUNNING and reported["c-kept"].pid == kept
    assert reported["c-ends"].state == pb.CONTAINER_EXITED and reported["c-ends"].stopped
    assert pid_alive(kept)
    await wait_until(lambda: harness.sup.record("c-ends") is None)  # the registration acknowledged it
    await rm2.wait_for(lambda: bool(rm2.beats))


async def test_flush_waits_for_the_ack(harness: Harness) -> None:
    harness.run()
    await harness.rm.wait_for(lambda: bool(harness.rm.beats))
    await harness.start("c-flush")
    await harness.sup.stop("c-flush", 1.0)
    assert await harness.tracker.flush(WAIT)
    assert harness.rm.statuses("c-flush")[-1].state == pb.CONTAINER_EXITED
