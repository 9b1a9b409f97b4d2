"""The golden check's second half: a cluster's life driven through the RM core's public calls (what rm/server/service.py
and rm/server/daemon.py call), on an injected clock, written as an event log and compared line by line with
tests/data/golden/core-scenario.jsonl.

The scenario: three nodes in two racks and two queues; jobs of 1, 8 and 16 GPUs submitted; AMs launched,
registered and granted; learners reported running; a job finishing, one failing and retrying, one killed; a node
going silent and lost; a drain; an RM restart (restore from the store) in the middle. Each step logs the effects
the core emitted, the stop orders it queued, and every job's and container's state.

    GPURM_GOLDEN_UPDATE=1 .venv/bin/python -m pytest tests/unit/test_golden_core.py   # re-record on purpose
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import JobState, Learner
from gpurm.queues.config import parse_queues
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.core import AttemptUpdate, ContainerReport, NodeRegistration, RMCore, RMSettings
from gpurm.rm.storage.store import MemoryStore

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "core-scenario.jsonl"
QUEUES = """
queues:
  research: {weight: 2}
  prod: {weight: 1, min_gpus: 8}
"""
SETTINGS = RMSettings(heartbeat_interval_s=1.0, missed_beats=3)


def plain(value: Any) -> Any:
    """A JSON-able form of an effect or record (enums by name)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {type(value).__name__: plain(asdict(value))}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "name") and hasattr(value, "value"):
        return value.name
    return value


class Scenario:
    def __init__(self) -> None:
        self.core = RMCore(SETTINGS, parse_queues(QUEUES, "queues.yaml"))
        self.log: list[str] = []
        self.sessions: dict[str, str] = {}

    def step(self, what: str, result: Any = None) -> None:
        core = self.core
        stops = {n: [plain(o) for o in core.take_stops(n, self.now)] for n in core.nodes_with_stops()}
        entry = {
            "step": what, "t": self.now, "result": plain(result),
            "effects": [plain(e) for e in core.take_outbox()], "stops": stops,
            "jobs": {j.job_id: [j.state.name, j.am_attempt, len(j.attempts), j.waiting_reason]
                     for j in sorted(core.jobs.values(), key=lambda j: j.job_id)},
            "containers": {c.container_id: [c.node_id, c.phase.name, list(c.gpu_indices)]
                           for c in sorted(core.containers.values(), key=lambda c: c.container_id)},
            "nodes": {n.node_id: [n.state.name, n.free_indices()]
                      for n in sorted(core.cluster.nodes.values(), key=lambda n: n.node_id)},
        }
        self.log.append(json.dumps(entry, sort_keys=True, default=str))

    now = 0.0

    def register(self, node: str, rack: str, gpus: int = 8) -> None:
        self.sessions[node] = f"s-{node}-{len(self.log)}"
        reg = NodeRegistration(node_id=node, host="127.0.0.1", port=9000, rack=rack, ib_domain=rack,
                               gpus=[GpuRecord(index=i) for i in range(gpus)], containers=[])
        self.step(f"register {node}", self.core.register_node(reg, self.sessions[node], self.now))

    def beat(self, node: str, reports: list[ContainerReport]) -> None:
        self.step(f"heartbeat {node}", self.core.node_heartbeat(node, self.sessions[node], reports, self.now))

    def am_up(self, job_id: str) -> None:
        """The job's AM container reports running and the AM registers."""
        job = self.core.jobs[job_id]
        am = self.core.containers[job.am_container]
        self.beat(am.node_id, [ContainerReport(am.container_id, "RUNNING", pid=1000)])
        self.step(f"register AM {job_id}", [c.container_id for c in self.core.register_am(job_id, job.am_attempt,
                                                                                           self.now)[1]])

    def allocate(self, job_id: str, response_id: int, asks: list[Ask], releases: list[str] | None = None,
                 attempts: list[AttemptUpdate] | None = None) -> list[str]:
        job = self.core.jobs[job_id]
        result = self.core.allocate(job_id, job.am_attempt, response_id, asks, releases or [], attempts or [],
                                    self.now, schedule=True)
        grants = [g.container_id for g in result.grants]
        self.step(f"allocate {job_id} #{response_id}", {"grants": grants, "completed": [
            c.container_id for c in result.completed], "kill": result.kill_requested,
            "preempt": list(result.preempt_ids)})
        return grants

    def running(self, job_id: str, number: int, grants: list[str]) -> None:
        """The learners of `grants` report running; the AM reports the attempt RUNNING."""
        by_node: dict[str, list[ContainerReport]] = {}
        for i, cid in enumerate(grants):
            c = self.core.containers[cid]
            by_node.setdefault(c.node_id, []).append(ContainerReport(cid, "RUNNING", pid=2000 + i))
        for node, reports in sorted(by_node.items()):
            self.beat(node, reports)
        learners = [Learner(rank=i, container_id=cid, node_id=self.core.containers[cid].node_id,
                            gpu_indices=list(self.core.containers[cid].gpu_indices))
                    for i, cid in enumerate(grants)]
        self.allocate(job_id, 100 + number, [], attempts=[AttemptUpdate(number, JobState.RUNNING, learners,
                                                                         start_time=self.now)])

    def ended(self, cids: list[str], code: int) -> None:
        by_node: dict[str, list[ContainerReport]] = {}
        for cid in cids:
            by_node.setdefault(self.core.containers[cid].node_id, []).append(
                ContainerReport(cid, "EXITED", exit_code=code))
        for node, reports in sorted(by_node.items()):
            self.beat(node, reports)

    def restart(self) -> None:
        store = MemoryStore()
        core = self.core
        store.save(core.jobs.values(), core.containers.values(), core.cluster.nodes.values(), core.meta())
        snap = store.load()
        self.core = RMCore(SETTINGS, parse_queues(QUEUES, "queues.yaml"))
        self.core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, now=self.now)
        self.step("RM restart")


def play() -> list[str]:
    s = Scenario()
    s.register("n1", "r1")
    s.register("n2", "r1")
    s.register("n3", "r2")
    s.now = 1.0
    a = s.core.submit(JobSpec(gpus=8, command=["train"], queue="research"), "alice", s.now).job_id
    s.step(f"submit {a}")
    b = s.core.submit(JobSpec(gpus=16, command=["train"], queue="research"), "bob", s.now).job_id
    s.step(f"submit {b}")
    c = s.core.submit(JobSpec(gpus=1, command=["hello"], queue="prod", max_retries=1), "carol", s.now).job_id
    s.step(f"submit {c}")
    s.now = 2.0
    for job in (a, b, c):
        s.am_up(job)
    s.now = 3.0
    ga = s.allocate(a, 1, [Ask(gpus=8)])
    gb = s.allocate(b, 1, [Ask(gpus=8, count=2, rack="r1")])
    gc = s.allocate(c, 1, [Ask(gpus=1)])
    s.now = 4.0
    s.running(a, 1, ga)
    s.running(b, 1, gb)
    s.running(c, 1, gc)
    s.now = 10.0
    s.ended(gc, 3)                                   # carol's learner fails: her AM retries
    s.allocate(c, 2, [], attempts=[AttemptUpdate(1, JobState.FAILED, [], exit_code=3, counts_as_failure=True,
                                                 end_time=s.now)])
    gc2 = s.allocate(c, 3, [Ask(gpus=1)])
    s.running(c, 2, gc2)
    s.now = 20.0
    s.restart()
    for node in ("n1", "n2", "n3"):
        s.sessions[node] += "-again"
        reports = [ContainerReport(x.container_id, "RUNNING", pid=3000) for x in s.core.containers.values()
                   if x.node_id == node and x.phase.live]
        reg = NodeRegistration(node_id=node, host="127.0.0.1", port=9000, rack="r2" if node == "n3" else "r1",
                               ib_domain="r2" if node == "n3" else "r1",
                               gpus=[GpuRecord(index=i) for i in range(8)], containers=reports)
        s.step(f"re-register {node}", s.core.register_node(reg, s.sessions[node], s.now))
    s.now = 21.0
    s.step(f"kill {b}", s.core.kill(b, "bob", "enough", s.now).state.name)
    s.ended(gb, -15)
    s.now = 22.0
    s.ended(ga, 0)
    s.step(f"finish {a}", s.core.finish_am(a, s.core.jobs[a].am_attempt, JobState.SUCCEEDED, "ok", 0, [], s.now)
           .state.name)
    d = s.core.submit(JobSpec(gpus=4, command=["x"], queue="prod"), "dave", s.now).job_id
    s.step(f"submit {d}")
    s.step("drain n1", s.core.drain("n1", False, s.now).state.name)
    for t in (23.0, 24.0, 25.0, 26.0, 30.0):          # n2 and n3 beat; n1 falls silent and is lost
        s.now = t
        for node in ("n2", "n3"):
            s.beat(node, [])
        s.core.tick(s.now)
        s.step(f"tick {t:g}")
    return s.log


def test_the_core_scenario_log_is_unchanged() -> None:
    log = play()
    if os.environ.get("GPURM_GOLDEN_UPDATE"):
        GOLDEN.write_text("\n".join(log) + "\n")
    want = GOLDEN.read_text().splitlines()
    for i, (w, g) in enumerate(zip(want, log, strict=False)):
        assert w == g, f"step {i} differs:\n  recorded {w}\n  now      {g}"
    assert len(log) == len(want)
