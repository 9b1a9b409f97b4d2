"""Robust containers with real processes: no orphan survives its container (with and without cgroups), jobs
run as their user (root only), rotated logs, and an agent SIGKILLed and restarted under running containers."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.identity import RunAsMode, RunAsPolicy
from gpurm.nodeagent.procgroup import pid_alive
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker, job_user_dir
from tests.integration.harness import ROOT, alive
from tests.integration.rmproc import AgentProcess, RMProcess, poll, wait_gone

LEARNER = pb.CONTAINER_LEARNER
WAIT = 15.0


async def read_pids(path: Path, count: int) -> list[int]:
    async def loop() -> list[int]:
        while True:
            lines = path.read_text().split() if path.exists() else []
            if len(lines) >= count:
                return [int(x) for x in lines[:count]]
            await asyncio.sleep(0.01)
    return await asyncio.wait_for(loop(), WAIT)


@pytest.fixture(params=["cgroup", "no-cgroup"])
async def sup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ContainerSupervisor]:
    s = ContainerSupervisor("node-r", tmp_path / "state", stop_grace_s=0.5, node_gpus=2, node_cpus=2,
                            node_memory_mib=2000)
    s.cgroup_root = "auto" if request.param == "cgroup" else "off"
    s.open()
    if request.param == "cgroup" and not s.cgroups.enabled:
        pytest.skip(f"no writable cgroup v2 here: {s.cgroups.warning}")
    try:
        yield s
    finally:
        await s.stop_all(0.5)
        await s.close()


# A learner with two descendants that outlive a polite stop: a grandchild ignoring TERM in the learner's group,
# and one that escaped into its own session (setsid), ignoring TERM as well.
ESCAPING = ("trap '' TERM; sleep 300 & echo $! >> {pids}; "
            "setsid sh -c 'trap \"\" TERM; echo $$ >> {pids}; exec sleep 300' & "
            "{tail}")


@pytest.mark.parametrize("ending", ["stopped", "leader-exits"])
async def test_no_orphan_survives_its_container(sup: ContainerSupervisor, tmp_path: Path, ending: str) -> None:
    pids = job_user_dir(tmp_path / "out") / "pids"
    tail = "wait" if ending == "stopped" else "sleep 0.3; exit 4"
    rec = await sup.start("c-orph", "job-1", LEARNER, ["/bin/sh", "-c", ESCAPING.format(pids=pids, tail=tail)],
                          {}, "", [0], 1, "alice")
    assert rec.state == pb.CONTAINER_RUNNING
    grandchild, escaped = await read_pids(pids, 2)
    assert os.getsid(escaped) == escaped != os.getsid(grandchild)   # really in a session of its own
    if sup.cgroups.enabled:
        assert {grandchild, escaped, rec.pid, rec.shim_pid} <= sup.processes("c-orph")
    if ending == "stopped":
        ended = await asyncio.wait_for(sup.stop("c-orph", 0.3, "test"), WAIT)
        assert ended.signal == signal.SIGKILL          # the command ignored TERM too
    else:
        ended = await asyncio.wait_for(sup.wait_ended("c-orph"), WAIT)
        assert ended.exit_code == 4 and ended.signal == 0
    for pid in (grandchild, escaped, rec.pid, rec.shim_pid):
        # Gone (os.kill(pid, 0) fails), or a zombie left to an init that does not reap: nothing runs.
        assert not pid_alive(pid), f"{pid} survived its container"
    if ended.cgroup:
        raise AssertionError(f"cgroup {ended.cgroup} left behind")
    assert not list((sup.cgroups.base or tmp_path / "none").glob("c-orph"))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs an agent running as root")
async def test_root_agent_runs_the_job_as_its_user(tmp_path: Path) -> None:
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    # mTLS: the job's user (from its token) is honoured; nobody's uid 65534 passes the checks.
    s = ContainerSupervisor("node-u", tmp_path / "state", run_as=RunAsPolicy(RunAsMode.USER, secure=True))
    try:
        rec = await s.start("c-user", "job-1", LEARNER, ["/bin/sh", "-c", "id -u; id -g; echo $HOME $USER"], {},
                            "/", [], 1, "nobody")
        rec = await asyncio.wait_for(s.wait_ended("c-user"), WAIT)
        assert (rec.state, rec.exit_code, rec.run_as) == (pb.CONTAINER_EXITED, 0, "nobody")
        out = s.read_log("c-user", 0, 4096).data.decode().split("\n")
        home = nobody.pw_dir if os.path.isdir(nobody.pw_dir) else str(s.containers_dir / "c-user" / "work")
        assert out[:3] == [str(nobody.pw_uid), str(nobody.pw_gid), f"{home} nobody"]
        bad = await s.start("c-nouser", "job-1", LEARNER, ["/bin/true"], {}, "", [], 1, "no-such-user-x")
        assert bad.state == pb.CONTAINER_FAILED_TO_START and bad.infra_failure
        assert "user 'no-such-user-x' does not exist on this node" in bad.diagnostics
        assert "does not exist on this node" in s.read_log("c-nouser", 0, 4096).data.decode()
    finally:
        await s.stop_all(0.5)
        await s.close()


async def test_output_is_rotated_by_size(tmp_path: Path) -> None:
    s = ContainerSupervisor("node-l", tmp_path / "state", log_max_size=64 * 1024, log_keep=2)
    script = "i=0; while [ $i -lt 4000 ]; do echo line-$i-0123456789012345678901234567890123456789; i=$((i+1)); done"
    try:
        await s.start("c-big", "job-1", LEARNER, ["/bin/sh", "-c", script], {}, "", [], 1, "u")
        rec = await asyncio.wait_for(s.wait_ended("c-big"), WAIT)
        assert rec.exit_code == 0
        cdir = s.container_dir("c-big")
        assert (cdir / "output.log.1").exists() and (cdir / "output.log.2").exists()
        assert not (cdir / "output.log.3").exists()
        assert all(p.stat().st_size < 64 * 1024 + 65536 for p in cdir.glob("output.log*"))
        tail = s.read_log("c-big", -200, 200)
        assert tail.size > 3 * 64 * 1024 and tail.data.endswith(b"line-3999-0123456789012345678901234567890123456789\n")
    finally:
        await s.close()


# ---------------------------------------------------------------- against the real RM


@pytest.fixture
def rm(tmp_path: Path, broker: TestBroker) -> Iterator[RMProcess]:
    proc = RMProcess(tmp_path / "rm", broker, heartbeat="30s")
    yield proc
    assert proc.close() == 0, proc.log_text()


def gated(gate: Path, code: int) -> str:
    return f"while [ ! -e {gate} ]; do sleep 0.05; done; exit {code}"


def test_agent_sigkill_and_restart_adopts_running_containers(rm: RMProcess, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path / "agent", rm, f"adp-{uuid.uuid4().hex[:6]}")
    try:
        agent.start()
        gate_down, gate_up = tmp_path / "down", tmp_path / "up"
        ends_down = rm.submit(gated(gate_down, 7))   # ends while no agent runs
        ends_up = rm.submit(gated(gate_up, 9))       # ends after the new agent adopted it
        down, up = rm.learner(ends_down), rm.learner(ends_up)
        ams = [p for job in (ends_down, ends_up) for p in agent.processes(GPURM_CONTAINER_ID=f"{job}-am1")]
        assert len(ams) == 2 and agent.proc is not None
        agent.proc.kill()                                  # SIGKILL: no shutdown, nothing stopped
        agent.proc.wait()
        assert all(alive(p) for p in [down.pid, up.pid, *ams]), "the containers died with their agent"
        gate_down.touch()
        wait_gone([down.pid])
        agent.start()                                      # same state dir: adopts
        # The one that ended while the agent was down: its exit code, from its launcher's exit.json.
        job = rm.wait_job(ends_down)
        assert job.state == pb.JOB_FAILED and job.exit_code == 7, job.diagnostics
        # The one still running was adopted: same process, the RM still sees it running ...
        assert alive(up.pid)
        (learner,) = rm.job(ends_up).attempts[-1].learners
        assert (learner.pid, learner.state) == (up.pid, pb.CONTAINER_RUNNING)
        assert "adopted" in agent.log_text()
        # ... and its later end reaches the RM through the new agent process.
        gate_up.touch()
        job = rm.wait_job(ends_up)
        assert job.state == pb.JOB_FAILED and job.exit_code == 9, job.diagnostics
        rm.wait_node(agent.node_id, check=lambda n: n.gpus_free == 2)
    finally:
        agent.close()


def test_gpurm_logs_shows_the_tail_of_a_rotated_log(rm: RMProcess, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path / "agent", rm, f"rot-{uuid.uuid4().hex[:6]}",
                         containers={"log_max_size": "32KiB", "log_keep": 1})
    try:
        agent.start()
        job_id = rm.submit("i=0; while [ $i -lt 3000 ]; do echo out-$i-abcdefghijabcdefghijabcdefghij; "
                           "i=$((i+1)); done")
        job = rm.wait_job(job_id)
        assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
        (learner,) = job.attempts[-1].learners
        cdir = agent.state / "containers" / learner.container_id
        assert (cdir / "output.log.1").exists() and not (cdir / "output.log.2").exists()
        done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "logs", job_id, "--rm", rm.address],
                              cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[-1] == "out-2999-abcdefghijabcdefghijabcdefghij"
        assert 32 * 1024 <= len(done.stdout) < 3 * 32 * 1024 + 65536    # what is kept, not all 114 KB
        numbers = [int(line.split("-")[1]) for line in lines if line.startswith("out-")]
        assert numbers == list(range(numbers[0], 3000))                 # contiguous up to the end
    finally:
        agent.close()


def test_cgroup_mode_is_reported_once_at_startup(rm: RMProcess, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path / "agent", rm, f"cgm-{uuid.uuid4().hex[:6]}",
                         containers={"cgroup_root": str(tmp_path / "not-a-cgroup")})
    try:
        agent.start()
        text = agent.log_text()
        assert text.count("is not a cgroup v2 hierarchy") == 1
        poll(lambda: rm.nodes()[agent.node_id].state == pb.NODE_RUNNING, WAIT, "node not running")
    finally:
        agent.close()
