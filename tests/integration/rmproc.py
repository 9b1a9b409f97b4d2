"""Real daemons for the agent's integration tests: `gpurm rm` and `python -m gpurm.nodeagent` as child processes.

Nothing here stands in for a part: `RMProcess` runs the real RM (its own state dir, SQLite store and token key,
a real MQTT broker) on a free loopback port and talks to it over its real gRPC services; `AgentProcess` runs the
real agent (fake GPUs: the one allowed fake) against it. Waits are polls with a deadline.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import pwd
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import yaml

from gpurm.common import tls
from gpurm.common.callers import USER_KEY
from gpurm.common.tls import TLSConfig
from gpurm.common.tokens import ClusterKeys, TokenKey, am_token, join_proof, sign_container, write_secret_file
from gpurm.nodeagent.cgroups import agent_cgroup_name
from gpurm.nodeagent.procgroup import MARKER_ENV
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.server import paging
from tests.conftest import TestBroker, free_port
from tests.integration.harness import ROOT, alive, processes_with_env

T = TypeVar("T")
TERMINAL = (pb.JOB_SUCCEEDED, pb.JOB_FAILED, pb.JOB_KILLED)
USER = getpass.getuser()
WAIT = 20.0


def poll(what: Callable[[], T | None], timeout: float, describe: Callable[[], str] | str,
         every: float = 0.05) -> T:
    """`what()` once it returns something other than None or False, else TimeoutError saying what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            text = describe() if callable(describe) else describe
            raise TimeoutError(f"after {timeout:g}s: {text}")
        time.sleep(every)


def wait_gone(pids: Iterable[int], timeout: float = WAIT) -> None:
    pids = list(pids)
    poll(lambda: not any(alive(p) for p in pids), timeout,
         lambda: f"processes still alive: {[p for p in pids if alive(p)]}")


def kill_group(pid: int) -> None:
    """SIGKILL a container's process group (its launcher leads the container's own session and group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        pgid = os.getpgid(pid)
        if pgid not in (os.getpgid(0), 0, 1):
            os.killpg(pgid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def remove_cgroups(state_dir: Path) -> None:
    """rmdir the cgroups of the containers an agent left behind (once their processes are gone)."""
    for record in state_dir.glob("containers/*/record.json"):
        with contextlib.suppress(OSError, ValueError):
            path = json.loads(record.read_text()).get("cgroup")
            if path:
                for _ in range(50):  # the killed processes leave the cgroup a moment after the signal
                    try:
                        Path(path).rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.02)
                with contextlib.suppress(OSError):
                    Path(path).parent.rmdir()   # the agent's own level, once its last container's is gone


class RMProcess:
    """`python -m gpurm.cli.main rm --config FILE` on a free loopback port; `restart()` keeps port and state."""

    def __init__(self, workdir: Path, broker: TestBroker, *, heartbeat: str = "30s", missed_beats: int | None = None,
                 client_tls: TLSConfig | None = None, key_from: Path | None = None, standby: bool = False,
                 host: str = "127.0.0.1", fence_grace: str = "", wrap: Sequence[str] = (),
                 heartbeat_more: dict[str, Any] | None = None, **settings: Any) -> None:
        """`settings`: more rm.yaml keys (e.g. tls); `client_tls`: the certificate the test's own calls use.
        `key_from`: another RM's token.key, copied in first (RMs of an HA set share it); `standby`: this RM starts
        as a standby (rm.yaml ha:), so wait for it to stand by rather than serve. `host`: the address it listens
        on (a bridge's, for agents in network namespaces). `fence_grace`: rm.yaml heartbeat.fence_grace. `wrap`: run
        the RM under this command (`ip netns exec NS`: in a network namespace, with `host` its address there).
        `heartbeat_more`: more keys of rm.yaml's heartbeat section (max_rate, max_interval, lease)."""
        self.wrap = list(wrap)
        self.workdir = workdir
        self.state_dir = workdir / "rm-state"
        self.port = free_port()
        self.address = f"{host}:{self.port}"
        self.config = workdir / "rm.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        # AMs call allocate every 250 ms (1 s while running), as on the tests' dev clusters (harness.py).
        settings["am"] = {"allocate_interval": "250ms", **settings.get("am", {})}
        # missed_beats None: the RM's default (10; with ha, the fewest whose lease outlasts a takeover).
        heartbeat_section = {"interval": heartbeat, **({"missed_beats": missed_beats} if missed_beats else {}),
                             **({"fence_grace": fence_grace} if fence_grace else {}), **(heartbeat_more or {})}
        self.config.write_text(yaml.safe_dump({
            "listen": self.address, "state_dir": str(self.state_dir), "mqtt": broker.rm_config(),
            "admins": [USER], "heartbeat": heartbeat_section,
            "http": {"listen": "127.0.0.1:0"}, **settings}))
        self.log_path = workdir / "rm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client_tls = client_tls
        self.channel = tls.channel(self.address, client_tls)
        self.client = pbg.ClientStub(self.channel)
        self.admin = pbg.AdminStub(self.channel)
        self.metadata = ((USER_KEY, USER),)
        if key_from is not None:
            write_secret_file(self.state_dir / "token.key", key_from.read_text())
        self.start(standby=standby)

    # ------------------------------------------------------------ the process

    def start(self, timeout: float = 60.0, standby: bool = False) -> None:
        """Start the RM and wait until it serves, or (`standby`) until it stands by."""
        pidfile = self.state_dir / "rm.json"
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()  # a SIGKILLed RM leaves its own behind
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.wrap, sys.executable, "-m", "gpurm.cli.main", "rm", "--config", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        proc = self.proc

        def serving() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the RM exited with {proc.returncode}:\n{self.log_text()}")
            try:
                info = json.loads(pidfile.read_text())
            except (OSError, ValueError):
                return False
            if info.get("pid") != proc.pid:
                return False
            with contextlib.suppress(grpc.RpcError):
                self.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=2)
                return True
            return False

        def standing_by() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the RM exited with {proc.returncode}:\n{self.log_text()}")
            return self.standing_by()

        if standby:
            poll(standing_by, timeout, lambda: f"the RM does not stand by on {self.address}:\n{self.log_text()}")
            return
        poll(serving, timeout, lambda: f"the RM does not serve on {self.address}:\n{self.log_text()}")

    def standing_by(self) -> bool:
        """Whether this RM answers as a standby (rm/server/standby.py)."""
        try:
            self.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=2)
        except grpc.RpcError as exc:
            return exc.code() is grpc.StatusCode.UNAVAILABLE and "standby" in (exc.details() or "")
        return False

    def kill(self) -> None:
        """SIGKILL: the RM gets no chance to do anything more."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> int:
        code = self.stop()
        self.channel.close()
        return code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def keys(self) -> ClusterKeys:
        """The RM's real keys, from its state dir (they exist once the RM has started)."""
        path = self.state_dir / "token.key"
        assert path.exists(), "the RM has not written its key yet"
        return ClusterKeys.load(path)

    def key(self, node_id: str) -> TokenKey:
        """The key the RM signs `node_id`'s container tokens with (that node's secret)."""
        return self.keys().node_key(node_id)

    def am_token(self, job_id: str, am_attempt: int, ttl_s: float = 600) -> str:
        """A valid AM token for this job and attempt, as the RM makes them."""
        return am_token(self.keys().am_key, job_id, am_attempt, int((time.time() + ttl_s) * 1000))

    def prove(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeRequest:
        """`request` with the join proof its agent would add (insecure mode: the node's secret proves it)."""
        request.join_time_ms = int(time.time() * 1000)
        request.join_proof = join_proof(self.key(request.node_id).secret, request.node_id, request.agent_instance,
                                        request.join_time_ms)
        return request

    def write_node_secret(self, node_id: str, path: Path) -> Path:
        """The node's secret in a 0600 file, as `gpurm admin node-secret NODE --out FILE` writes it."""
        return write_secret_file(path, self.key(node_id).secret.hex())

    # ------------------------------------------------------------ the Client and Admin services

    def nodes(self) -> dict[str, pb.NodeInfo]:
        return {n.node_id: n for n in paging.fetch_all(lambda r: self.client.ListNodes(r, timeout=10),
                                                        pb.ListNodesRequest(), "nodes")}

    def view(self) -> pb.ClusterView:
        view: pb.ClusterView = self.client.GetClusterView(pb.GetClusterViewRequest(), timeout=10)
        return view

    def wait_node(self, node_id: str, state: int = pb.NODE_RUNNING, timeout: float = WAIT,
                  check: Callable[[pb.NodeInfo], bool] = lambda n: True) -> pb.NodeInfo:
        def ready() -> pb.NodeInfo | None:
            node = self.nodes().get(node_id)
            return node if node is not None and node.state == state and check(node) else None

        def describe() -> str:
            node = self.nodes().get(node_id)
            got = pb.NodeState.Name(node.state) if node is not None else "unknown to the RM"
            return f"node {node_id} is {got}, not {pb.NodeState.Name(state)}"

        return poll(ready, timeout, describe)

    def drain(self, node_id: str) -> None:
        """Offer nothing more on a node whose agent is gone, so no later AM is sent there."""
        with contextlib.suppress(grpc.RpcError):
            self.admin.DrainNode(pb.DrainNodeRequest(node_id=node_id), metadata=self.metadata, timeout=10)

    def submit(self, command: str, gpus: int = 1, max_retries: int = 0) -> str:
        spec = pb.JobSpec(name="agent-test", gpus=gpus, command=["/bin/sh", "-c", command],
                          max_retries=max_retries)
        reply = self.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                      metadata=self.metadata, timeout=10)
        return str(reply.job_id)

    def kill_job(self, job_id: str) -> None:
        self.client.KillJob(pb.KillJobRequest(job_id=job_id, reason="test cleanup"), metadata=self.metadata,
                            timeout=10)

    def job(self, job_id: str) -> pb.Job:
        job: pb.Job = self.client.GetJob(pb.GetJobRequest(job_id=job_id), timeout=10)
        return job

    def wait_job(self, job_id: str, states: Iterable[int] = TERMINAL, timeout: float = WAIT,
                 check: Callable[[pb.Job], bool] = lambda j: True) -> pb.Job:
        wanted = set(states)

        def done() -> pb.Job | None:
            job = self.job(job_id)
            return job if job.state in wanted and check(job) else None

        def describe() -> str:
            job = self.job(job_id)
            return (f"{job_id} is {pb.JobState.Name(job.state)} ({job.waiting_reason} {job.diagnostics}); "
                    f"wanted {[pb.JobState.Name(s) for s in wanted]}")

        return poll(done, timeout, describe)

    def learner(self, job_id: str) -> pb.Learner:
        """The only learner of a running one-GPU job, once the RM knows its pid."""
        job = self.wait_job(job_id, [pb.JOB_RUNNING],
                            check=lambda j: bool(j.attempts and j.attempts[-1].learners
                                                 and j.attempts[-1].learners[0].pid))
        (learner,) = job.attempts[-1].learners
        return learner


class AgentProcess:
    """`python -m gpurm.nodeagent --config FILE` with fake GPUs, pointing at a real RM."""

    def __init__(self, workdir: Path, rm: RMProcess, node_id: str, *, gpus: dict[str, Any] | None = None,
                 containers: dict[str, Any] | None = None, rack: str = "rack-1", ib_domain: str = "ib-1",
                 run_as_user: str | None = None, rm_list: list[str] | None = None, wrap: Sequence[str] = (),
                 **settings: Any) -> None:
        """`settings`: more agent.yaml keys (e.g. tls); the test's own calls to it use `rm.client_tls`.
        `run_as_user`: start the agent as this account (the tests run as root) instead of the tests' user.
        `rm_list`: agent.yaml `rm` as a list of RMs (default: `rm`'s address alone). `wrap`: run the agent under
        this command (`ip netns exec NS`: in a network namespace; give `host=` its address there)."""
        self.wrap = list(wrap)
        self.host = str(settings.get("host", "127.0.0.1"))
        self.run_as_user = run_as_user
        self.workdir = workdir
        self.rm = rm
        self.node_id = node_id
        self.state = workdir / "agent-state"
        self.config = workdir / "agent.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        if "tls" not in settings and "node_secret" not in settings and "node_secret_file" not in settings:
            secret = rm.write_node_secret(node_id, workdir / "node.secret")
            if run_as_user:   # the agent's own account must read its secret (still 0600)
                account = pwd.getpwnam(run_as_user)
                os.chown(secret, account.pw_uid, account.pw_gid)
            settings["node_secret_file"] = str(secret)
        self.config.write_text(yaml.safe_dump({
            "node_id": node_id, "listen": f"{self.host}:0", "rm": rm_list or rm.address, "rack": rack,
            "ib_domain": ib_domain, "cpus": 8, "memory_mib": 64000, "state_dir": str(self.state),
            "gpus": gpus or {"fake": 2}, "containers": {"stop_grace": "2s", **(containers or {})}, **settings}))
        self.log_path = workdir / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.channel: grpc.Channel | None = None

    def start(self, timeout: float = WAIT) -> pb.NodeInfo:
        """Start the agent; return the node as the RM lists it once it has registered."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*self.wrap, sys.executable, "-m", "gpurm.nodeagent", "--config",
                                          str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, user=self.run_as_user,
                                         group=self.run_as_user and _group_of(self.run_as_user),
                                         extra_groups=[] if self.run_as_user else None)
        proc = self.proc

        def serving() -> dict[str, Any] | None:
            if proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {proc.returncode}:\n{self.log_text()}")
            with contextlib.suppress(OSError, ValueError):
                info: dict[str, Any] = json.loads((self.state / "agent.json").read_text())
                if info.get("pid") == proc.pid:
                    return info
            return None

        info = poll(serving, timeout, lambda: f"agent {self.node_id} did not write agent.json:\n{self.log_text()}")
        self.port = int(info["port"])
        self.channel = tls.channel(f"{self.host}:{self.port}", self.rm.client_tls)
        node = self.rm.wait_node(self.node_id, timeout=timeout, check=lambda n: n.agent_port == self.port)
        # The RM lists the node once it has registered it; the agent takes containers once the reply reached it.
        poll(self._registered, timeout, lambda: f"agent {self.node_id} never took the RM's registration reply:\n"
                                                f"{self.log_text()}")
        return node

    def _registered(self) -> bool:
        """Whether the agent checks container tokens yet (before registering, it refuses every call)."""
        probe = pb.ContainerStatusRequest(tokens=[self.token("registration-probe", "job-probe")])
        try:
            self.manager.GetContainerStatus(probe, timeout=10)
        except grpc.RpcError as exc:
            return "has not registered" not in str(exc.details())
        return True

    @property
    def manager(self) -> pbg.ContainerManagerStub:
        assert self.channel is not None
        return pbg.ContainerManagerStub(self.channel)

    def token(self, container_id: str, job_id: str, gpu_indices: Iterable[int] = (),
              purpose: pb.TokenPurpose = pb.TOKEN_CONTAINER, *, user: str = USER,
              kind: pb.ContainerKind = pb.CONTAINER_LEARNER) -> pb.ContainerToken:
        """A token for this node naming `user`, as the RM would sign it."""
        payload = pb.ContainerTokenPayload(
            container_id=container_id, job_id=job_id, node_id=self.node_id, gpu_indices=list(gpu_indices),
            kind=kind, user=user, expiry_ms=int(time.time() * 1000) + 60_000, attempt=1, purpose=purpose)
        return sign_container(payload, self.rm.key(self.node_id))

    def start_container(self, container_id: str, job_id: str, script: str, gpu_indices: Iterable[int] = (), *,
                        user: str = USER, kind: pb.ContainerKind = pb.CONTAINER_LEARNER) -> pb.ContainerStatus:
        """StartContainer on this agent, as an AM would, with a token signed by the RM's key for this node."""
        reply = self.manager.StartContainer(pb.StartContainerRequest(
            token=self.token(container_id, job_id, gpu_indices, user=user, kind=kind),
            launch=pb.LaunchContext(argv=["/bin/sh", "-c", script])), timeout=10)
        status: pb.ContainerStatus = reply.status
        return status

    def terminate(self, timeout: float = WAIT) -> int:
        """SIGTERM, and the exit code once the agent has finished its shutdown."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def processes(self, **env: str) -> list[int]:
        """Live processes of this agent's containers, only those whose environment also has each KEY=VALUE given
        (job ids repeat across RMs on one machine). Found by the key every container's environment carries, which
        starts with its agent's name for itself (the node id and a digest of its state dir): not by the node id
        alone, which another test or a test session beside this one may give its own agent (close() kills what
        it finds)."""
        key = f"{agent_cgroup_name(self.node_id, self.state)}/"
        pids = set(processes_with_env(MARKER_ENV, key, prefix=True))
        for key, value in env.items():
            pids &= set(processes_with_env(key, value))
        return sorted(pids)

    def close(self) -> None:
        """Stop the agent if it still runs (a failed test), kill any container it left behind, and drain its
        node so that the RM sends no later AM to a node whose agent is gone."""
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.processes():
            kill_group(pid)
        remove_cgroups(self.state)
        self.rm.drain(self.node_id)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _group_of(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid
