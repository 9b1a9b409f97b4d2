"""Finding 1 of issue 13: no job runs as root or as a system user, whoever asks and whatever the token says.

Real daemons: an RM and an agent started as root (the attack needs a root agent), over real gRPC on loopback.
Each learner writes `id -u` into a world-writable folder, so that a process that did run as root or as a system
account would leave its file there: the test asserts no such file is ever written.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpurm.common import tls
from gpurm.common.callers import USER_KEY
from gpurm.common.tls import load_tls
from gpurm.nodeagent.identity import DEFAULT_BANNED_USERS, DEFAULT_MIN_UID, RunAs
from gpurm.nodeagent.launch import launch_spec, read_handshake, spawn_shim
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from tests.conftest import TestBroker
from tests.integration.rmproc import AgentProcess, RMProcess, poll
from tests.integration.test_tls import CA

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attack needs an agent running as root")

NODE = "never-root-1"
WAIT = 30.0


def system_account() -> str | None:
    """A local account below min_uid that is not banned by default (so min_uid alone must stop it)."""
    for entry in pwd.getpwall():
        if 0 < entry.pw_uid < DEFAULT_MIN_UID and entry.pw_name not in DEFAULT_BANNED_USERS:
            return entry.pw_name
    return None


def drop_box(path: Path) -> Path:
    """A folder anyone may write (sticky, like /tmp): a learner that ran as any uid could leave its file."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o1777)
    return path


def uid_script(box: Path, name: str) -> str:
    return f"id -u > {box / name}"


# ---------------------------------------------------------------- mTLS: the token's user is honoured, and checked

@dataclass
class Secure:
    rm: RMProcess
    agent: AgentProcess
    ca: CA


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[Secure]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl binary")
    base = tmp_path_factory.mktemp("never-root")
    ca = CA(base / "pki", "never-root-ca")
    admin = ca.issue("admin")
    rm = RMProcess(base / "rm", broker, heartbeat="500ms", client_tls=load_tls(admin), tls=ca.issue("rm"),
                   admins=["admin"])
    am = ca.issue("am:cluster", stem="am-cert")
    # No local_user: with mTLS the agent runs each job as the user its token names.
    agent = AgentProcess(base / "agent", rm, NODE, tls=ca.issue(f"node:{NODE}"),
                         am_tls={"cert": am["cert"], "key": am["key"]})
    try:
        agent.start()
        yield Secure(rm, agent, ca)
    finally:
        agent.close()
        rm.close()


def refused_users() -> list[tuple[str, str]]:
    users = [("root", "is root"), ("daemon", "containers.banned_users")]
    low = system_account()
    if low is not None:
        users.append((low, f"below containers.min_uid {DEFAULT_MIN_UID}"))
    return users


@pytest.mark.parametrize(("user", "why"), refused_users())
def test_a_token_naming_root_or_a_system_user_gets_a_failed_container(secure: Secure, tmp_path: Path, user: str,
                                                                       why: str) -> None:
    box = drop_box(tmp_path / "box")
    cid = f"nr-{uuid.uuid4().hex[:8]}"
    status = secure.agent.start_container(cid, "job-nr", uid_script(box, "uid"), user=user)
    assert status.state == pb.CONTAINER_FAILED_TO_START, status
    # The job's failure, not the node's: an AM fails the job with this message instead of retrying elsewhere.
    assert not status.infra_failure
    assert f"user {user!r}" in status.diagnostics and why in status.diagnostics, status.diagnostics
    assert "uid >=" in status.diagnostics or "banned_users" in status.diagnostics
    time.sleep(0.5)   # a process that had been started would have written its uid by now
    assert not (box / "uid").exists(), f"a process ran as {user}: uid {(box / 'uid').read_text().strip()}"
    assert f"user {user!r}" in secure.agent.log_text()


def test_a_job_submitted_with_roots_certificate_fails_with_the_diagnostic(secure: Secure, tmp_path: Path) -> None:
    """The whole path: a user whose certificate says root submits; the RM asks the agent for an AM as root, the
    agent refuses, and the job fails at once saying why (no AM, no learner ever ran; no retry can help)."""
    box = drop_box(tmp_path / "box")
    with tls.channel(secure.rm.address, load_tls(secure.ca.issue("root"))) as channel:
        spec = pb.JobSpec(name="as-root", gpus=1, command=["/bin/sh", "-c", uid_script(box, "uid")])
        reply = pbg.ClientStub(channel).SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                                  timeout=10)
    job = secure.rm.wait_job(reply.job_id, timeout=60)
    assert (job.user, job.state) == ("root", pb.JOB_FAILED)
    assert "user 'root' (uid 0) is root" in job.diagnostics, job.diagnostics
    assert job.diagnostics.startswith("its AM could not start"), job.diagnostics
    assert not (box / "uid").exists()
    assert not list((secure.agent.state / "containers").glob(f"{reply.job_id}-*/work/*"))


def test_an_am_container_is_checked_as_well(secure: Secure, tmp_path: Path) -> None:
    cid = f"nr-am-{uuid.uuid4().hex[:8]}"
    status = secure.agent.start_container(cid, "job-nr-am", "", user="root",
                                          kind=pb.CONTAINER_AM)
    assert status.state == pb.CONTAINER_FAILED_TO_START and not status.infra_failure
    assert "user 'root'" in status.diagnostics and "is root" in status.diagnostics


def test_an_am_gets_its_own_certificate_as_files_of_its_user(secure: Secure) -> None:
    """With mTLS the AM runs as the job's user and must not read the node's key: the agent copies am_tls into
    the AM's container dir, 0600 and owned by that user, and points GPURM_TLS_* at the copies."""
    cid = f"nr-amtls-{uuid.uuid4().hex[:8]}"
    status = secure.agent.start_container(cid, "job-amtls", "", user="nobody",
                                          kind=pb.CONTAINER_AM)
    assert status.state != pb.CONTAINER_FAILED_TO_START, status.diagnostics
    tdir = secure.agent.state / "containers" / cid / "tls"
    nobody = pwd.getpwnam("nobody").pw_uid
    st = os.lstat(tdir)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, nobody)
    config = yaml.safe_load(secure.agent.config.read_text())
    node_key, am_key = Path(config["tls"]["key"]), Path(config["am_tls"]["key"])
    for name in ("ca.pem", "cert.pem", "key.pem"):
        st = os.lstat(tdir / name)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, nobody), name
    assert (tdir / "key.pem").read_bytes() == am_key.read_bytes() != node_key.read_bytes()  # not the node's
    record = (secure.agent.state / "containers" / cid / "record.json").read_text()
    assert '"run_as": "nobody"' in record


def test_an_allowed_user_does_run_as_itself(secure: Secure, tmp_path: Path) -> None:
    """The control: the same path with an account that passes the checks runs, as that account."""
    box = drop_box(tmp_path / "box")
    cid = f"nr-ok-{uuid.uuid4().hex[:8]}"
    status = secure.agent.start_container(cid, "job-nr-ok", uid_script(box, "uid"), user="nobody")
    assert status.state in (pb.CONTAINER_RUNNING, pb.CONTAINER_EXITED), status
    written = poll(lambda: ((box / "uid").exists() and (box / "uid").read_text().strip()) or None, WAIT,
                   lambda: f"the learner never wrote its uid (start: {status}); the agent's log ends:\n"
                           f"{secure.agent.log_text()[-4000:]}")
    assert written == str(pwd.getpwnam("nobody").pw_uid)


# ---------------------------------------------------------------- insecure mode: the claim is ignored

@dataclass
class Insecure:
    rm: RMProcess
    agent: AgentProcess


@pytest.fixture(scope="module")
def insecure(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[Insecure]:
    base = tmp_path_factory.mktemp("claims")
    rm = RMProcess(base / "rm", broker, heartbeat="500ms")
    agent = AgentProcess(base / "agent", rm, "claims-1")   # no tls: insecure mode, local_user defaults to nobody
    try:
        agent.start()
        yield Insecure(rm, agent)
    finally:
        agent.close()
        rm.close()


@pytest.mark.parametrize("claimed", ["alice", "root", "daemon"])
def test_insecure_mode_runs_a_claimed_user_as_the_local_user(insecure: Insecure, tmp_path: Path,
                                                             claimed: str) -> None:
    box = drop_box(tmp_path / "box")
    spec = pb.JobSpec(name="claims", gpus=1, command=["/bin/sh", "-c", f"id -u > {box}/uid; id -un > {box}/name"])
    reply = insecure.rm.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                         metadata=((USER_KEY, claimed),), timeout=10)
    job = insecure.rm.wait_job(reply.job_id, timeout=WAIT)
    assert job.user == claimed                       # the RM records the claim ...
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    nobody = pwd.getpwnam("nobody")
    # ... but the learner ran as the agent's local user, never as the claimed one
    assert (box / "uid").read_text().strip() == str(nobody.pw_uid)
    assert (box / "name").read_text().strip() == "nobody"
    # and so did the job's AM (the agent's record of each container says whom it ran as)
    records = [r for r in (insecure.agent.state / "containers").glob(f"{reply.job_id}-*/record.json")]
    assert records
    for record in records:
        assert '"run_as": "nobody"' in record.read_text()
    assert "insecure mode" in insecure.agent.log_text()


def test_an_agent_configured_to_run_jobs_as_root_starts_nothing(tmp_path: Path, broker: TestBroker) -> None:
    rm = RMProcess(tmp_path / "rm", broker, heartbeat="500ms")
    agent = AgentProcess(tmp_path / "agent", rm, "as-root-1", containers={"local_user": "root"})
    try:
        agent.start()
        box = drop_box(tmp_path / "box")
        status = agent.start_container("c-root", "job-r", uid_script(box, "uid"))
        assert status.state == pb.CONTAINER_FAILED_TO_START and not status.infra_failure
        assert "containers.local_user: user 'root' (uid 0) is root" in status.diagnostics
        assert not (box / "uid").exists()
    finally:
        agent.close()
        rm.close()


def test_an_agent_running_as_a_system_account_starts_nothing(tmp_path: Path, broker: TestBroker) -> None:
    """An agent that is not root can only run jobs as itself: as a system account (daemon), it says so once at
    start-up and refuses every container with the diagnostic."""
    daemon = pwd.getpwnam("daemon")
    rm = RMProcess(tmp_path / "rm", broker, heartbeat="500ms")
    agent = AgentProcess(tmp_path / "agent", rm, "as-daemon-1", run_as_user="daemon",
                         containers={"cgroup_root": "off"})
    agent.state.mkdir(parents=True)
    os.chown(agent.state, daemon.pw_uid, daemon.pw_gid)
    os.chown(agent.log_path.parent, daemon.pw_uid, daemon.pw_gid)
    try:
        agent.start()
        assert "the agent runs as daemon, not root" in agent.log_text()
        assert "no container will start" in agent.log_text()
        box = drop_box(tmp_path / "box")
        status = agent.start_container("c-daemon", "job-d", uid_script(box, "uid"))
        assert status.state == pb.CONTAINER_FAILED_TO_START and not status.infra_failure
        assert "the agent runs as daemon, not root" in status.diagnostics
        assert "user 'daemon' (uid 1)" in status.diagnostics
        time.sleep(0.5)
        assert not (box / "uid").exists()
    finally:
        agent.close()
        rm.close()


@pytest.mark.parametrize("uid", [0, None], ids=["uid-0", "no-switch-as-root"])
def test_the_launcher_refuses_root_on_its_own(tmp_path: Path, uid: int | None) -> None:
    """The second check: handed a spec that would run the command as root (the agent's check bypassed), the
    container's launcher answers with the refusal and never starts the command."""
    box = drop_box(tmp_path / "box")
    cdir = tmp_path / "c-shim"
    cdir.mkdir()
    who = RunAs(user="root", uid=uid, gid=0 if uid is not None else None, groups=() if uid is not None else None)
    spec = launch_spec(argv=["/bin/sh", "-c", uid_script(box, "uid")], env={"PATH": os.defpath}, cwd=cdir,
                       run_as=who, cgroup=None, log_max_size=0, log_keep=1)
    proc, fd = spawn_shim(cdir, os.environ, spec)
    answer = read_handshake(fd, 30.0)
    assert proc.wait(30) == 126
    assert answer.pid == 0 and "refused: the launcher never runs a command as root" in answer.error, answer
    assert not (box / "uid").exists()
    assert not (cdir / "output.log").exists()
