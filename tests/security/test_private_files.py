"""Private data stays private (issue 13): the agent's state and each container's files, their modes and owners,
and a job's user who plants symlinks in its own container dir gets nothing out of the agent (root).

Real daemons: an RM and an agent (as root: jobs then run as nobody) over real gRPC on loopback.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.rmproc import AgentProcess, RMProcess, poll

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as another user only under a root agent")

WAIT = 30.0


@dataclass
class Node:
    rm: RMProcess
    agent: AgentProcess


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[Node]:
    base = tmp_path_factory.mktemp("private")
    rm = RMProcess(base / "rm", broker, heartbeat="500ms")
    agent = AgentProcess(base / "agent", rm, f"priv-{uuid.uuid4().hex[:6]}")
    try:
        agent.start()
        yield Node(rm, agent)
    finally:
        agent.close()
        rm.close()


def mode_owner(path: Path) -> tuple[int, str]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), pwd.getpwuid(st.st_uid).pw_name


def run(node: Node, script: str) -> tuple[str, Path]:
    cid = f"pf-{uuid.uuid4().hex[:8]}"
    node.agent.start_container(cid, "job-pf", script)
    cdir = node.agent.state / "containers" / cid

    def ended() -> bool | None:
        reply = node.agent.manager.GetContainerStatus(
            pb.ContainerStatusRequest(tokens=[node.agent.token(cid, "job-pf")]), timeout=10)
        return reply.statuses[0].state == pb.CONTAINER_EXITED or None

    poll(ended, WAIT, f"container {cid} did not end")
    return cid, cdir


def test_state_and_container_files_are_private(node: Node) -> None:
    cid, cdir = run(node, "echo secret-output; pwd; echo data > mine")
    state = node.agent.state
    assert mode_owner(state) == (0o711, "root")                 # traversable, never listable
    assert mode_owner(state / "agent.json") == (0o600, "root")
    assert mode_owner(state / "containers") == (0o711, "root")
    assert mode_owner(cdir) == (0o700, "nobody")                 # the job's user's, nobody else's
    assert mode_owner(cdir / "work") == (0o700, "nobody")
    assert mode_owner(cdir / "output.log") == (0o600, "nobody")
    assert mode_owner(cdir / "output.log.index") == (0o600, "nobody")
    assert mode_owner(cdir / "exit.json") == (0o600, "nobody")
    assert mode_owner(cdir / "record.json") == (0o600, "root")  # the agent's own, written by root
    assert mode_owner(cdir / "launcher.log") == (0o600, "root")
    assert not (cdir / "launch.json").exists()                   # the env (tokens) never lies in the dir
    # The default working directory is the container's work/, owned by the job's user.
    assert mode_owner(cdir / "work" / "mine")[1] == "nobody"
    # The agent (root) still reads the log for ReadLog.
    log = node.agent.manager.ReadLog(pb.ReadLogRequest(
        container_id=cid, max_bytes=4096, token=node.agent.token(cid, "job-pf", purpose=pb.TOKEN_READ_LOG)), timeout=10)
    assert log.data.decode().split("\n")[:2] == ["secret-output", str(cdir / "work")]


def test_another_user_cannot_read_a_jobs_output(node: Node) -> None:
    _, cdir = run(node, "echo only-mine")
    for path in (cdir / "output.log", cdir / "work"):
        # Another unprivileged account (daemon) tries to read it: refused by the dir (0700) and the file (0600).
        other = subprocess.run(["cat", str(path)] if path.name == "output.log" else ["ls", str(path)],
                               user="daemon", group="daemon", extra_groups=[], capture_output=True, text=True,
                               timeout=10, check=False)
        assert other.returncode != 0 and "Permission denied" in other.stderr, other
        assert "only-mine" not in other.stdout


def test_symlinks_a_job_plants_in_its_dir_are_never_followed_by_the_agent(node: Node, tmp_path: Path) -> None:
    target = tmp_path / "root-only"
    target.write_text("root's secret\n")
    os.chmod(target, 0o600)
    written = tmp_path / "must-stay"
    written.write_text("untouched\n")
    os.chmod(written, 0o644)
    # The job (as nobody) swaps its log for a link to a root-only file, and plants a link where the agent
    # writes its record's temp file, then exits: the agent reads the log and rewrites the record afterwards.
    script = (f"cd ..; rm -f output.log; ln -s {target} output.log; ln -s {written} .record.json.tmp; "
              f"echo x > /dev/null")
    cid, cdir = run(node, script)
    assert os.path.islink(cdir / "output.log")
    log = node.agent.manager.ReadLog(pb.ReadLogRequest(
        container_id=cid, max_bytes=4096, token=node.agent.token(cid, "job-pf", purpose=pb.TOKEN_READ_LOG)), timeout=10)
    assert b"secret" not in log.data
    assert written.read_text() == "untouched\n"
    assert mode_owner(cdir / "record.json") == (0o600, "root")
    assert not os.path.islink(cdir / "record.json")
