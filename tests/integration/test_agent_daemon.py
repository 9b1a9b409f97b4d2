"""The agent daemon as a real process against the real RM: start-up, agent.json, and a shutdown that leaves no
container behind (or, with `keep_on_shutdown`, every container running) and tells the RM what it stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker, job_user_dir
from tests.integration.harness import alive
from tests.integration.rmproc import TERMINAL, WAIT, AgentProcess, RMProcess, poll, wait_gone


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    # A 30 s heartbeat: what the RM learns at shutdown comes from the agent's last report, not a timer.
    proc = RMProcess(tmp_path_factory.mktemp("daemon-rm"), broker, heartbeat="30s")
    yield proc
    assert proc.close() == 0, proc.log_text()


def agent_cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "gpurm.nodeagent", "--config", str(config)]


def describe(pids: list[int]) -> str:
    """Each pid with its command line, for an assertion message."""
    lines = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            cmd, ppid = "(gone)", "?"
        lines.append(f"{pid} (parent {ppid}): {cmd}")
    return "\n".join(lines)


def container_of(pid: int) -> str:
    """The GPURM_CONTAINER_ID in a process's environment ("" when gone or absent)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    found = [v for k, _, v in (e.partition(b"=") for e in env) if k == b"GPURM_CONTAINER_ID"]
    return found[0].decode() if found else ""


def read_pids(path: Path, count: int) -> list[int]:
    def ready() -> list[int] | None:
        words = path.read_text().split() if path.exists() else []
        return [int(w) for w in words[:count]] if len(words) >= count else None
    return poll(ready, WAIT, f"{path} never held {count} pids")


def test_shutdown_stops_every_container_and_the_rm_sees_them_end(rm: RMProcess, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, rm, f"dmn-{uuid.uuid4().hex[:6]}", containers={"stop_grace": "300ms"})
    try:
        agent.start()
        # A learner whose whole process group ignores SIGTERM: only the SIGKILL after the grace ends it.
        pids = job_user_dir(tmp_path / "out") / "pids"   # the job runs as nobody when the agent is root
        job_id = rm.submit(f"trap '' TERM; echo $$ > {pids}; sleep 300 & echo $! >> {pids}; wait")
        learner = rm.learner(job_id)
        leader, child = read_pids(pids, 2)
        assert leader == learner.pid
        (am,) = agent.processes(GPURM_CONTAINER_ID=f"{job_id}-am1")
        assert agent.terminate() == 0
        assert [p for p in (leader, child, am) if alive(p)] == []
        # The agent reported the ends before it exited (its last beat waited for the RM's ack): the RM knows
        # already, with no timer involved and no need to wait here.
        job = rm.job(job_id)
        (ended,) = job.attempts[-1].learners
        assert (ended.state, ended.signal) == (pb.CONTAINER_EXITED, signal.SIGKILL), ended
        # ... and its AM's end: the RM has moved on from that AM (another AM attempt, or the job's end).
        assert job.am_attempt > 1 or job.state in TERMINAL, job
        assert learner.gpu_indices[0] not in [a.gpu_index for a in rm.nodes()[agent.node_id].assignments]
        assert not (agent.state / "agent.json").exists()
        record = json.loads((agent.state / "containers" / ended.container_id / "record.json").read_text())
        assert record["state"] == "CONTAINER_EXITED" and record["stopped"]
    finally:
        agent.close()
        rm.kill_job(job_id)     # else its next AM attempt lands on the next test's agent
    text = agent.log_text()
    assert f"agent {agent.node_id} serving ContainerManager on 127.0.0.1:" in text and ", 2 GPUs" in text


def test_keep_on_shutdown_leaves_containers_running(rm: RMProcess, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, rm, f"dmn-{uuid.uuid4().hex[:6]}", containers={"keep_on_shutdown": True})
    try:
        agent.start()
        job_id = rm.submit("exec sleep 300")
        learner = rm.learner(job_id)
        # The learner and the job's AM, and nothing else of this job's (an earlier test's job may run here).
        running = [p for p in agent.processes() if container_of(p).startswith(f"{job_id}-")]
        assert learner.pid in running and len(running) == 2, describe(agent.processes())
        assert agent.terminate() == 0
        assert [p for p in running if not alive(p)] == []
        record = json.loads((agent.state / "containers" / learner.container_id / "record.json").read_text())
        # What a later agent process needs to adopt it: the command, and its launcher (session leader, with
        # its start time against pid reuse).
        assert record["state"] == "CONTAINER_RUNNING" and record["pid"] == learner.pid
        assert record["pgid"] == record["shim_pid"] > 0 and record["shim_start"] > 0
        # Nothing was reported as ended: the RM still counts the job as running on its GPU.
        job = rm.job(job_id)
        assert job.state == pb.JOB_RUNNING and job.attempts[-1].learners[0].state == pb.CONTAINER_RUNNING
    finally:
        agent.close()          # kills what the agent left running
    wait_gone(running)


def test_missing_gpus_fails_with_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s"), "node_secret": "ab" * 32}))
    done = subprocess.run(agent_cmd(config), capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpus: no GPU provider configured" in lines[0]


def test_busy_listen_port_exits_2_with_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        # Even a socket that allows port sharing must not be joined: the agent binds exclusively.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s"),
                                          "listen": f"127.0.0.1:{busy}", "gpus": {"fake": 1},
                                          "node_secret": "ab" * 32}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}  # gRPC's default logging
        done = subprocess.run(agent_cmd(config), capture_output=True, text=True, timeout=WAIT, check=False,
                              env=env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines     # nothing from gRPC core, no traceback: the agent's own line
    assert f"agent n: cannot listen on 127.0.0.1:{busy}: address already in use" in lines[0]
    assert not (tmp_path / "s" / "agent.json").exists()


def test_an_agent_without_a_credential_exits_2_saying_what_to_set(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s"), "gpus": {"fake": 1}}))
    done = subprocess.run(agent_cmd(config), capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 2
    assert "no credential" in done.stderr and "node_secret_file" in done.stderr and "gpurm admin node-secret" \
        in done.stderr, done.stderr
    secret = tmp_path / "node.secret"
    secret.write_text("ab" * 32)
    secret.chmod(0o644)
    config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s"), "gpus": {"fake": 1},
                                      "node_secret_file": str(secret)}))
    done = subprocess.run(agent_cmd(config), capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 2 and "readable by others: chmod 600" in done.stderr, done.stderr


def test_an_agent_told_to_give_up_on_the_rm_exits_3(tmp_path: Path) -> None:
    # rm_retry.give_up_after: once the RM has been unreachable that long the agent exits 3 for its service manager
    # to restart it (by default it never gives up). Nobody listens on the RM's port here.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s"), "listen": "127.0.0.1:0",
                                      "rm": f"127.0.0.1:{dead}", "gpus": {"fake": 1}, "node_secret": "ab" * 32,
                                      "rm_retry": {"base": "100ms", "max": "500ms", "give_up_after": "2s"}}))
    done = subprocess.run(agent_cmd(config), capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 3, done.stderr
    assert f"the RM at 127.0.0.1:{dead} has been unreachable for" in done.stderr
    assert "exiting, containers left running" in done.stderr, done.stderr
