"""Holding a shared GPU's jobs to their memory share (nodeagent/sharing.py). Pure."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from gpurm.nodeagent.config import load_agent_config
from gpurm.nodeagent.monitor import AgentMonitor
from gpurm.nodeagent.records import ContainerRecord
from gpurm.nodeagent.sharing import GpuMemoryGuard
from gpurm.proto import gpurm_pb2 as pb


def test_a_job_that_keeps_more_than_its_share_is_stopped_and_a_spike_is_forgiven() -> None:
    guard = GpuMemoryGuard()
    assert guard.observe("c1", 21_000, 20_000) == ""          # within the 5% margin
    assert guard.observe("c1", 30_000, 20_000) == ""          # one sample above: a spike
    assert guard.observe("c1", 19_000, 20_000) == ""          # back under: the count starts again
    assert guard.observe("c1", 30_000, 20_000) == ""
    why = guard.observe("c1", 31_000, 20_000)
    assert "used 31000 MiB of GPU memory" in why and "share of 20000 MiB" in why and "2 samples" in why
    assert guard.over == {}


def test_no_limit_means_no_verdict_and_ended_containers_are_forgotten() -> None:
    guard = GpuMemoryGuard()
    assert guard.observe("c1", 10**6, 0) == ""
    guard.observe("c2", 30_000, 20_000)
    guard.forget({"c3"})
    assert guard.over == {}


class Provider:
    """A GPU that tells each process's memory (as NVML does): GPU 0 holds pids 10 and 11 (one container), 20."""

    def __init__(self) -> None:
        self.used = {0: {10: 15_000, 11: 10_000, 20: 5_000}}

    def process_memory(self, indices: Sequence[int]) -> dict[int, dict[int, int]]:
        return {i: self.used.get(i, {}) for i in indices}


class Supervisor:
    def __init__(self) -> None:
        self.stopped: list[tuple[str, str]] = []

    def processes(self, cid: str) -> set[int]:
        return {"greedy": {10, 11}, "modest": {20}}[cid]

    async def stop(self, cid: str, grace_s: float, reason: str) -> None:
        self.stopped.append((cid, reason))


def record(cid: str) -> ContainerRecord:
    return ContainerRecord(container_id=cid, job_id=f"job-{cid}", kind=pb.CONTAINER_LEARNER,
                           state=pb.CONTAINER_RUNNING, gpu_indices=[0], share_milli=250, gpu_memory_mib=20_000)


async def test_the_agent_stops_the_container_that_keeps_more_than_its_share() -> None:
    sup = Supervisor()
    cfg = load_agent_config(None, {"gpus": {"fake": 1}}, environ={})
    m = AgentMonitor(cfg, cast(Any, Provider()), [], cast(Any, sup))
    greedy, modest = record("greedy"), record("modest")
    for _ in range(2):                                 # 25,000 MiB over two pids against a 20,000 MiB share
        await m._guard_shares([greedy, modest])
    await asyncio.sleep(0)                             # the stop task runs
    assert [cid for cid, _ in sup.stopped] == ["greedy"]
    assert greedy.user_error and "used 25000 MiB" in greedy.diagnostics and not modest.diagnostics
