"""The agent's RM connection (registration, heartbeat deltas, stop orders, RM restarts) against the real RM.

Every test runs real processes on loopback: `gpurm rm` (SQLite state dir, real token key, the session's MQTT
broker), the agent daemon with fake GPUs, the AMs the RM launches through the agent, and their learners. The
RM's heartbeat interval is 30 s, so anything that reaches the RM within a few seconds went out because something
changed, not because a timer fired.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import alive
from tests.integration.rmproc import USER, AgentProcess, RMProcess, poll, wait_gone

INTERVAL_S = 30.0   # the RM's heartbeat interval in this module
PROMPT_S = 12.0     # "at once": well within one interval, with room for a slow machine


def node_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    proc = RMProcess(tmp_path_factory.mktemp("tracker-rm"), broker, heartbeat=f"{INTERVAL_S:g}s")
    yield proc
    assert proc.close() == 0, proc.log_text()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, rm: RMProcess) -> Iterator[AgentProcess]:
    a = AgentProcess(tmp_path_factory.mktemp("tracker-agent"), rm, node_name("trk"),
                     gpus={"fake": 4, "nvlink_islands": 2}, rack="rack-7", ib_domain="ib-7b")
    a.start()
    yield a
    a.close()


def test_registration_puts_the_node_its_topology_and_gpus_in_the_rm(rm: RMProcess, agent: AgentProcess) -> None:
    node = rm.nodes()[agent.node_id]
    assert node.state == pb.NODE_RUNNING
    assert (node.host, node.agent_port) == ("127.0.0.1", agent.port)
    assert (node.rack, node.ib_domain) == ("rack-7", "ib-7b")
    assert (node.cpus, node.memory_mib, node.gpus_total) == (8, 64000, 4)
    assert node.agent_version
    assert [g.index for g in node.gpus] == [0, 1, 2, 3]
    assert {g.model for g in node.gpus} == {"H100-80GB"} and all(g.healthy for g in node.gpus)
    assert len({g.uuid for g in node.gpus}) == 4
    # Two NVLink islands of consecutive GPUs, as the AMs see them in the cluster view.
    (view,) = [n for n in rm.view().nodes if n.node_id == agent.node_id]
    assert [list(i.gpus) for i in view.islands] == [[0, 1], [2, 3]]
    assert (view.rack, view.ib_domain, view.gpus_total, view.gpus_healthy) == ("rack-7", "ib-7b", 4, 4)


def test_a_learner_exit_reaches_the_rm_at_once(rm: RMProcess, agent: AgentProcess) -> None:
    # The RM launches a real AM on the agent, the AM a real learner. Only the agent can tell the RM that the
    # learner exited, and only a beat sent on that change can do it in time: the timer would take 30 s.
    t0 = time.monotonic()
    job_id = rm.submit("exit 5", max_retries=0)
    job = rm.wait_job(job_id, timeout=PROMPT_S)
    elapsed = time.monotonic() - t0
    assert job.state == pb.JOB_FAILED and job.exit_code == 5, job.diagnostics
    (learner,) = job.attempts[-1].learners
    assert learner.node_id == agent.node_id and learner.exit_code == 5
    assert elapsed < PROMPT_S < INTERVAL_S
    # The AM's own exit after it finished is a change too: the RM sees the job hold nothing within moments.
    rm.wait_job(job_id, timeout=PROMPT_S, check=lambda j: j.live_containers == 0)
    assert agent.processes(GPURM_JOB_ID=job_id) == []


def test_the_rm_stops_a_container_it_does_not_know(rm: RMProcess, agent: AgentProcess) -> None:
    # Started with a token the RM's real key signed, for a job the RM never heard of (as if left over from
    # before an RM restart): the RM answers the beat that reports it with a stop order.
    status = agent.start_container("stray-c1", "job-stray", "exec sleep 300", gpu_indices=[3])
    assert status.state == pb.CONTAINER_RUNNING and status.pid > 0
    wait_gone([status.pid], PROMPT_S)
    ended = poll(lambda: next((s for s in agent.manager.GetContainerStatus(
        pb.ContainerStatusRequest(tokens=[agent.token("stray-c1", "job-stray", [3])]), timeout=10).statuses
        if s.state == pb.CONTAINER_EXITED), None), PROMPT_S, "stray-c1 is not reported EXITED by its agent")
    assert ended.stopped and ended.signal == signal.SIGTERM
    assert "the RM does not know this container" in ended.diagnostics
    # It never became the RM's business: no GPU of the node is held.
    assert rm.nodes()[agent.node_id].gpus_free == 4


def test_a_kill_is_pushed_to_the_agent_without_waiting_for_a_beat(rm: RMProcess, agent: AgentProcess) -> None:
    job_id = rm.submit("exec sleep 300", max_retries=0)
    learner = rm.learner(job_id)
    pids = agent.processes(GPURM_JOB_ID=job_id)
    assert learner.pid in pids and len(pids) == 2          # the AM and its learner
    t0 = time.monotonic()
    rm.kill_job(job_id)
    # The stop orders go down the open heartbeat stream now, and the ends come back on change.
    wait_gone(pids, PROMPT_S)
    job = rm.wait_job(job_id, [pb.JOB_KILLED], timeout=PROMPT_S, check=lambda j: j.live_containers == 0)
    assert time.monotonic() - t0 < PROMPT_S
    (ended,) = job.attempts[-1].learners
    assert ended.signal == signal.SIGTERM
    assert rm.nodes()[agent.node_id].gpus_free == 4
    # The RM's own order stopped it (its AM, told of the kill on its next Allocate, would have come later).
    record = json.loads((agent.state / "containers" / learner.container_id / "record.json").read_text())
    assert record["stopped"] and record["stop_reason"] == f"killed by {USER}: test cleanup"


def test_a_node_the_rm_declared_lost_registers_again_when_told(tmp_path: Path, broker: TestBroker) -> None:
    # A short expiry: a frozen agent (SIGSTOP) misses its beats and the RM marks the node LOST; its first beat
    # after SIGCONT carries a session the RM has dropped, the RM answers REREGISTER, the agent registers again.
    rm = RMProcess(tmp_path / "rm", broker, heartbeat="300ms", missed_beats=12)   # the shortest the fence allows
    agent = AgentProcess(tmp_path / "agent", rm, node_name("lst"))
    try:
        agent.start()
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            lost = rm.wait_node(agent.node_id, pb.NODE_LOST, timeout=PROMPT_S)
            assert lost.gpus_free == 0 and "missed 12 heartbeats" in lost.health_report
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        node = rm.wait_node(agent.node_id, timeout=PROMPT_S)
        assert (node.agent_port, node.gpus_free) == (agent.port, 2)
        assert "the RM asked this agent to register again" in agent.log_text()
    finally:
        agent.close()
        assert rm.close() == 0, rm.log_text()


def test_an_agent_follows_the_interval_the_rm_names_and_still_reports_an_exit_at_once(tmp_path: Path,
                                                                                     broker: TestBroker) -> None:
    # rm.yaml asks for a beat every 300 ms, but at most 0.1 beats a second from the whole fleet: for one server the
    # RM names 10.3 s, for two 20 s (max_interval), each with the lease scaled to it (rm/state/heartbeats.py). The
    # first agent, registered alone, learns of 20 s from a heartbeat reply once the second registers, and beats
    # every 20 s from then on; a learner's exit still reaches the RM at once.
    rm = RMProcess(tmp_path / "rm", broker, heartbeat="300ms", missed_beats=20,
                   heartbeat_more={"max_rate": 0.1, "max_interval": "20s"})
    first = AgentProcess(tmp_path / "first", rm, node_name("pace"))
    second = AgentProcess(tmp_path / "second", rm, node_name("pace"))
    try:
        first.start()
        second.start()
        poll(lambda: "the RM names a heartbeat interval of 20s" in first.log_text(), 25.0,
             lambda: f"the first agent never followed a 20 s interval:\n{first.log_text()[-2000:]}")
        time.sleep(0.5)
        seen = {rm.nodes()[first.node_id].last_heartbeat_ms}
        began = time.monotonic()
        while time.monotonic() - began < 6.0:  # at 300 ms that would be some 20 beats
            seen.add(rm.nodes()[first.node_id].last_heartbeat_ms)
            time.sleep(0.1)
        assert len(seen) <= 2, f"{len(seen) - 1} beats in 6 s: the agent does not follow the 20 s interval"

        # The fence's lease grew with the interval, 3.2 s at 300 ms (6 s expiry - 2 s grace - 0.8 s margin) x 66.7,
        # and lease.json (which a restarted agent arms its fence from) carries it.
        def lease_s() -> float:
            path = first.state / "lease.json"
            return float(json.loads(path.read_text())["lease_s"]) if path.exists() else 0.0

        poll(lambda: lease_s() == pytest.approx(3.2 * 20 / 0.3, abs=0.01), 25.0,
             lambda: f"lease.json says {lease_s()}s")
        t0 = time.monotonic()
        job_id = rm.submit("exit 5", max_retries=0)
        job = rm.wait_job(job_id, timeout=PROMPT_S)
        assert job.state == pb.JOB_FAILED and job.exit_code == 5, job.diagnostics
        assert time.monotonic() - t0 < PROMPT_S < 20.0
        nodes = rm.nodes()
        assert nodes[first.node_id].state == nodes[second.node_id].state == pb.NODE_RUNNING
    finally:
        first.close()
        second.close()
        assert rm.close() == 0, rm.log_text()


# ---------------------------------------------------------------- an RM that crashes and comes back


@pytest.fixture
def crashing_rm(tmp_path: Path, broker: TestBroker) -> Iterator[RMProcess]:
    proc = RMProcess(tmp_path / "rm", broker, heartbeat=f"{INTERVAL_S:g}s")
    yield proc
    assert proc.close() == 0, proc.log_text()


@pytest.fixture
def crash_agent(tmp_path: Path, crashing_rm: RMProcess) -> Iterator[AgentProcess]:
    a = AgentProcess(tmp_path / "agent", crashing_rm, node_name("rst"))
    a.start()
    yield a
    a.close()


def gated(gate: Path, code: int) -> str:
    """A learner that exits `code` once the test creates `gate`: it ends exactly when the test says."""
    return f"while [ ! -e {gate} ]; do sleep 0.05; done; exit {code}"


def test_an_rm_restart_loses_nothing_the_agent_knows(crashing_rm: RMProcess, crash_agent: AgentProcess,
                                                     tmp_path: Path) -> None:
    rm, agent = crashing_rm, crash_agent
    kept_id = rm.submit("exec sleep 600", max_retries=0)
    kept = rm.learner(kept_id)
    gate = tmp_path / "go"
    ends_id = rm.submit(gated(gate, 7), max_retries=0)
    ends = rm.learner(ends_id)
    assert (kept.node_id, ends.node_id) == (agent.node_id, agent.node_id)

    rm.kill()                       # SIGKILL: no goodbye to anyone
    gate.touch()
    wait_gone([ends.pid])           # the agent saw the exit; the RM it must tell is gone
    rm.start()                      # same port, same state dir

    # The agent registers again and reports the exit it saw while the RM was down: the new RM records it
    # and frees that GPU. Only the agent could tell it: the RM was not running when the learner ended.
    def ended_learner() -> pb.Learner | None:
        # (Right after the restart the AM's attempt report may not have reached the new RM yet: no learners.)
        learners = rm.job(ends_id).attempts[-1].learners
        return learners[0] if len(learners) == 1 and learners[0].state == pb.CONTAINER_EXITED else None

    ln = poll(ended_learner, PROMPT_S, lambda: f"the new RM has {rm.job(ends_id)}")
    assert ln.exit_code == 7 and ln.pid == ends.pid
    # Its AM (which rode out the restart) learns of it from the new RM and ends the job with the exit code.
    job = rm.wait_job(ends_id, timeout=PROMPT_S)
    assert job.state == pb.JOB_FAILED and job.exit_code == 7, job.diagnostics
    node = rm.wait_node(agent.node_id, check=lambda n: n.gpus_free == 1)
    assert node.agent_port == agent.port
    # The long learner ran on, untouched, and the new RM still knows it runs and holds its GPU.
    assert alive(kept.pid)
    assert [(a.gpu_index, a.job_id) for a in node.assignments] == [(kept.gpu_indices[0], kept_id)]
    job = rm.job(kept_id)
    assert job.state == pb.JOB_RUNNING
    assert [(x.pid, x.state) for x in job.attempts[-1].learners] == [(kept.pid, pb.CONTAINER_RUNNING)]
    # ... and can still stop it: the stream to the agent works again.
    rm.kill_job(kept_id)
    wait_gone([kept.pid], PROMPT_S)


def test_an_exit_reported_before_the_am_is_back_still_ends_the_job(crashing_rm: RMProcess, crash_agent: AgentProcess,
                                                         tmp_path: Path) -> None:
    rm, agent = crashing_rm, crash_agent
    gate = tmp_path / "go"
    job_id = rm.submit(gated(gate, 7), max_retries=0)
    learner = rm.learner(job_id)
    (am,) = agent.processes(GPURM_CONTAINER_ID=f"{job_id}-am1")
    # The AM reaches the new RM only after the agent has registered again and reported the exit: one order
    # the race between the two can take, made certain here (a frozen AM). The new RM has no state for the AM
    # when the end arrives, yet must hand it over at the AM's first Allocate.
    os.kill(am, signal.SIGSTOP)
    try:
        rm.kill()
        gate.touch()
        wait_gone([learner.pid])
        rm.start()
        rm.wait_node(agent.node_id, check=lambda n: n.gpus_free == 2)   # the agent reported the exit
    finally:
        os.kill(am, signal.SIGCONT)
    job = rm.wait_job(job_id, timeout=PROMPT_S)
    assert job.state == pb.JOB_FAILED and job.exit_code == 7, job.diagnostics
