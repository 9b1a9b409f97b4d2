"""The attacks of issue 13, each tried against a running cluster the way someone on the same network would.

Each attack returns a Result: what it tried, what a safe cluster does (expected) and what happened (observed).
tests/security/test_attacks.py runs them against a dev cluster with and without mTLS; `scripts/pentest` runs
them against any dev cluster and prints the table.

The attacker holds what a cluster user or a compromised node would: in mTLS mode her own user certificate
(`mallory`, issued by the dev cluster's CA) or one node's certificate; in insecure mode nothing but the network,
or one node's secret file. She never holds the RM's state dir: where an attack needs a credential the RM really
issued (an AM token for her own job), the harness makes it with the RM's key, as the RM would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
import grpc

from gpurm.common import mqtt, tls
from gpurm.common.callers import AM_TOKEN_KEY, USER_KEY
from gpurm.common.mqtt import Credentials
from gpurm.common.tls import TLSConfig, load_tls
from gpurm.common.tokens import ClusterKeys, TokenKey, am_token, join_proof, parse_node_secret, sign_container
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.security import pki
from tests.integration.harness import TEST_RM_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {pb.JOB_SUCCEEDED, pb.JOB_FAILED, pb.JOB_KILLED}
MIB = 1024 * 1024


@dataclass
class Result:
    name: str
    finding: str
    expected: str
    observed: str
    ok: bool


def remote_host() -> str | None:
    """A non-loopback IPv4 address of this machine (connecting to it is 'another host' to a server), or None."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))      # TEST-NET-1: no packet is sent for a UDP connect
        addr: str = s.getsockname()[0]
        if not addr.startswith("127."):
            return addr
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addr = str(info[4][0])
            if not addr.startswith("127."):
                return addr
    return None


@dataclass
class Cluster:
    """A running dev cluster, found through its state dir."""

    state: Path
    proc: subprocess.Popen[bytes] | None = None
    _certs: dict[str, TLSConfig] = field(default_factory=dict)
    _victim: str = ""

    @property
    def info(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state / "cluster.json").read_text())
        return data

    @property
    def address(self) -> str:
        return str(self.info["rm_address"])

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def tls(self) -> bool:
        return bool(self.info.get("tls"))

    @property
    def rm_pid(self) -> int:
        return int(self.info["rm"]["pid"])

    def nodes(self) -> list[str]:
        return sorted(str(a["node_id"]) for a in self.info["agents"])

    def agent_address(self, node: str) -> str:
        data = json.loads((self.state / "agents" / node / "agent.json").read_text())
        return f"127.0.0.1:{data['port']}"

    def node_secret(self, node: str) -> TokenKey:
        """What the agent of `node` holds (its node secret file): a compromised node gives this away."""
        return parse_node_secret((self.state / "agents" / node / "node.secret").read_text())

    def rm_keys(self) -> ClusterKeys:
        """The RM's own keys: used only to make what the RM would really issue (see the module doc)."""
        return ClusterKeys.load(self.state / "rm" / "token.key")

    # ------------------------------------------------------------ identities and channels

    def user_tls(self, name: str) -> TLSConfig | None:
        """In mTLS mode a certificate for user `name` from the cluster's CA (a user's own credential)."""
        if not self.tls:
            return None
        if name not in self._certs:
            out = Path(tempfile.mkdtemp(prefix="pentest-cert-")) / name
            self._certs[name] = load_tls(pki.issue(self.state / "pki" / "ca", name, out, days=1).tls_section())
        return self._certs[name]

    def node_tls(self, node: str) -> TLSConfig | None:
        if not self.tls:
            return None
        d = self.state / "pki"
        return load_tls({"ca": str(d / "ca" / "ca.pem"), "cert": str(d / f"{node}.pem"),
                         "key": str(d / f"{node}-key.pem")})

    def am_tls(self) -> TLSConfig | None:
        """The certificate agents hand the AMs they start (readable by job users: an attacker may hold it)."""
        if not self.tls:
            return None
        d = self.state / "pki"
        return load_tls({"ca": str(d / "ca" / "ca.pem"), "cert": str(d / "am.pem"), "key": str(d / "am-key.pem")})

    def channel(self, creds: TLSConfig | None, address: str | None = None) -> grpc.Channel:
        # The dev cluster's certificates name 127.0.0.1 and localhost; a remote caller checks them as localhost.
        options = [("grpc.ssl_target_name_override", "localhost")] if creds is not None else []
        return tls.channel(address or self.address, creds, options=options)

    @contextlib.contextmanager
    def as_user(self, name: str, remote: bool = False) -> Iterator[tuple[pbg.ClientStub, pbg.AdminStub, Any]]:
        """Stubs for user `name` (her certificate, or her claim in insecure mode), from another host if `remote`."""
        address = self.address
        if remote:
            host = remote_host()
            if host is None:
                raise Skip("this machine has no non-loopback address to call from")
            address = f"{host}:{self.port}"
        with self.channel(self.user_tls(name), address) as ch:
            yield pbg.ClientStub(ch), pbg.AdminStub(ch), ((USER_KEY, name),)

    # ------------------------------------------------------------ jobs

    def submit(self, user: str, command: list[str], env: dict[str, str] | None = None, name: str = "pentest",
               gpus: int = 1) -> str:
        with self.as_user(user) as (client, _, md):
            spec = pb.JobSpec(name=name, gpus=gpus, command=command, env=env or {}, max_retries=0)
            reply = client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex), metadata=md,
                                     timeout=15)
            return str(reply.job_id)

    def job(self, job_id: str, user: str = "alice") -> pb.Job:
        with self.as_user(user) as (client, _, md):
            job: pb.Job = client.GetJob(pb.GetJobRequest(job_id=job_id), metadata=md, timeout=15)
            return job

    def wait(self, job_id: str, what: Callable[[pb.Job], bool], timeout: float = 60, user: str = "alice"
             ) -> pb.Job:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id, user)
            if what(job) or time.monotonic() > deadline:
                return job
            time.sleep(0.2)

    def victim(self) -> pb.Job:
        """alice's long job with a secret in its env, running (its AM and learner up)."""
        if not self._victim:
            self._victim = self.submit("alice", ["sleep", "600"], env={"SECRET": "hunter2"}, name="victim")
        return self.wait(self._victim, lambda j: j.state == pb.JOB_RUNNING and bool(j.attempts)
                         and bool(j.attempts[-1].learners) and all(x.container_id for x in
                                                                   j.attempts[-1].learners))

    def logs(self) -> str:
        """Every daemon log of the cluster (not the learners' own output)."""
        parts = [self.state / "rm" / "rm.log", *sorted(self.state.glob("agents/*/agent.log"))]
        return "\n".join(p.read_text(errors="replace") for p in parts if p.exists())


class Skip(Exception):
    """The attack cannot be tried here (the reason says why)."""


def _code(call: Callable[[], Any]) -> tuple[str, str]:
    """The status code name and details a call ends with ('OK', '') when it succeeds."""
    try:
        call()
        return "OK", ""
    except grpc.RpcError as exc:
        return exc.code().name, (exc.details() or "")[:160]


def _refused(codes: list[tuple[str, str]]) -> bool:
    return all(c in ("PERMISSION_DENIED", "UNAUTHENTICATED", "UNAVAILABLE") for c, _ in codes)


def _observed(codes: list[tuple[str, str]]) -> str:
    return "; ".join(f"{c}" + (f" ({d[:70]})" if d else "") for c, d in codes)


# ---------------------------------------------------------------- the attacks

def admin_by_claim(c: Cluster) -> Result:
    """Critical 1: the user header says root and an admin call passes."""
    with c.as_user("mallory", remote=True) as (_, admin, _md):
        md = ((USER_KEY, "root"),)
        codes = [_code(lambda: admin.DrainNode(pb.DrainNodeRequest(node_id=c.nodes()[0]), metadata=md, timeout=10)),
                 _code(lambda: admin.RefreshQueues(pb.RefreshQueuesRequest(yaml="queues: {}"), metadata=md,
                                                   timeout=10))]
    return Result("admin_by_claim", "1", "admin calls refused from another host whatever the claimed user",
                  _observed(codes), _refused(codes))


def job_as_claimed_root(c: Cluster) -> Result:
    """Critical 1: a job whose owner is claimed to be root runs as uid 0."""
    out = Path(tempfile.mkdtemp(prefix="pentest-uid-"))
    out.chmod(0o777)
    mark = out / "uid"
    with c.as_user("mallory") as (client, _, _md):
        spec = pb.JobSpec(name="as-root", gpus=1, command=["/bin/sh", "-c", f"id -u > {mark}"], max_retries=0)
        job_id = client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                  metadata=((USER_KEY, "root"),), timeout=15).job_id
    job = c.wait(job_id, lambda j: j.state in TERMINAL, user="root" if not c.tls else "mallory")
    uid = mark.read_text().strip() if mark.exists() else ""
    shutil.rmtree(out, ignore_errors=True)
    ran_as = f"uid {uid}" if uid else "no process ran"
    ok = uid != "0" and (not uid or int(uid) >= 1000)
    return Result("job_as_claimed_root", "1", "never uid 0 (insecure: the agent's local user; mTLS: the "
                  "certificate's user)", f"{ran_as}; job {pb.JobState.Name(job.state)} as {job.user}", ok)


def _registration(node: str) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(node_id=node, host="127.0.0.1", agent_port=1, rack="rack-1",
                                  gpus=[pb.GpuInfo(index=0, uuid=f"GPU-{node}", model="x", healthy=True)],
                                  cpus=1, memory_mib=1000, agent_instance=uuid.uuid4().hex, healthy=True)


def register_stranger(c: Cluster) -> Result:
    """Critical 2: anyone may register a node and receives the container-token key."""
    got_key = b""

    def register() -> None:
        nonlocal got_key
        with c.channel(c.user_tls("mallory")) as ch:
            got_key = pbg.ResourceTrackerStub(ch).RegisterNode(_registration("stranger"), timeout=10).token_key

    codes = [_code(register)]
    with c.as_user("alice") as (client, _, md):
        listed = [n.node_id for n in client.ListNodes(pb.ListNodesRequest(), metadata=md, timeout=10).nodes]
    ok = _refused(codes) and not got_key and "stranger" not in listed
    return Result("register_stranger", "2", "refused; no key handed out; no node added",
                  _observed(codes) + ("; got a key!" if got_key else ""), ok)


def hijack_live_node(c: Cluster) -> Result:
    """Critical 2: re-registering a live node's name marks its learners LOST."""
    victim = c.victim()
    node = victim.attempts[-1].learners[0].node_id
    other = next(n for n in c.nodes() if n != node)
    request = _registration(node)
    request.join_time_ms = int(time.time() * 1000)
    request.join_proof = os.urandom(32)
    creds = c.node_tls(other)                       # mTLS: another node's certificate
    with c.channel(creds) as ch:
        codes = [_code(lambda: pbg.ResourceTrackerStub(ch).RegisterNode(request, timeout=10))]
    time.sleep(1)
    after = c.job(victim.job_id)
    learners = after.attempts[-1].learners
    lost = [x for x in learners if x.state != pb.CONTAINER_RUNNING]
    ok = _refused(codes) and after.state == pb.JOB_RUNNING and not lost
    return Result("hijack_live_node", "2", f"refused; {node}'s learners keep running",
                  _observed(codes) + f"; job {pb.JobState.Name(after.state)}, {len(lost)} learners not running", ok)


def replay_registration(c: Cluster) -> Result:
    """Critical 2: a registration seen on the wire is sent again (insecure mode's join proof)."""
    node = c.nodes()[0]
    key = c.node_secret(node)
    old = _registration(node)
    old.join_time_ms = int(time.time() * 1000) - 10 * 60 * 1000
    old.join_proof = join_proof(key.secret, node, old.agent_instance, old.join_time_ms)
    with c.channel(c.user_tls("mallory")) as ch:
        stub = pbg.ResourceTrackerStub(ch)
        codes = [_code(lambda: stub.RegisterNode(old, timeout=10))]
    return Result("replay_registration", "2", "a proof from 10 minutes ago is refused (mTLS: a user's "
                  "certificate registers no node)", _observed(codes), _refused(codes))


def _mint(key: TokenKey, node: str, cid: str, purpose: pb.TokenPurpose = pb.TOKEN_CONTAINER,
          job: str = "job-x", user: str = "root", kind: pb.ContainerKind = pb.CONTAINER_LEARNER
          ) -> pb.ContainerToken:
    payload = pb.ContainerTokenPayload(container_id=cid, job_id=job, node_id=node, user=user, kind=kind,
                                       expiry_ms=int(time.time() * 1000) + 60_000, attempt=1, purpose=purpose)
    return sign_container(payload, key)


def stolen_node_key(c: Cluster) -> Result:
    """Critical 3: one node's key mints tokens that every agent accepts (root everywhere)."""
    first, second = c.nodes()[:2]
    stolen = c.node_secret(first)
    with c.channel(c.node_tls(first), c.agent_address(second)) as ch:
        agent = pbg.ContainerManagerStub(ch)
        request = pb.StartContainerRequest(token=_mint(stolen, second, "pwn-1"),
                                           launch=pb.LaunchContext(argv=["/bin/sh", "-c", "id -u"]))
        codes = [_code(lambda: agent.StartContainer(request, timeout=10))]
    return Result("stolen_node_key", "3", f"{first}'s key starts nothing on {second}", _observed(codes),
                  _refused(codes))


def am_token_from_node_key(c: Cluster) -> Result:
    """Critical 3: an AM token forged from a node's key takes over another job."""
    victim = c.victim()
    forged = am_token(c.node_secret(c.nodes()[0]).secret, victim.job_id, victim.am_attempt,
                      int(time.time() * 1000) + 60_000)
    # mTLS: a node's owner also holds the AM certificate its agent hands out, so the token is what is tested.
    with c.channel(c.am_tls()) as ch:
        am = pbg.ApplicationMasterStub(ch)
        codes = [_code(lambda: am.Allocate(pb.AllocateRequest(job_id=victim.job_id, am_attempt=victim.am_attempt,
                                                              releases=[x.container_id for x in
                                                                        victim.attempts[-1].learners]),
                                           metadata=((AM_TOKEN_KEY, forged),), timeout=10))]
    after = c.job(victim.job_id)
    ok = _refused(codes) and after.state == pb.JOB_RUNNING
    return Result("am_token_from_node_key", "3", "refused; the job keeps its learners",
                  _observed(codes) + f"; job {pb.JobState.Name(after.state)}", ok)


def stolen_am_token(c: Cluster) -> Result:
    """Critical 3: an AM token for one job (or an old one) works for another."""
    victim = c.victim()
    keys = c.rm_keys()
    now = int(time.time() * 1000)
    other_jobs = am_token(keys.am_key, "job-999999", 1, now + 60_000)           # another job's real token
    expired = am_token(keys.am_key, victim.job_id, victim.am_attempt, now - 1000)  # the victim's, expired
    codes = []
    with c.channel(c.am_tls()) as ch:
        am = pbg.ApplicationMasterStub(ch)
        for token in (other_jobs, expired):
            codes.append(_code(lambda t=token: am.Allocate(  # type: ignore[misc]
                pb.AllocateRequest(job_id=victim.job_id, am_attempt=victim.am_attempt),
                metadata=((AM_TOKEN_KEY, t),), timeout=10)))
    return Result("stolen_am_token", "3", "another job's and an expired AM token are refused", _observed(codes),
                  _refused(codes))


def agent_calls_without_token(c: Cluster) -> Result:
    """Medium: ReadLog and ReservePort (and status) answer anyone."""
    victim = c.victim()
    learner = victim.attempts[-1].learners[0]
    with c.channel(c.user_tls("mallory"), c.agent_address(learner.node_id)) as ch:
        agent = pbg.ContainerManagerStub(ch)
        codes = [_code(lambda: agent.ReadLog(pb.ReadLogRequest(container_id=learner.container_id), timeout=10)),
                 _code(lambda: agent.ReservePort(pb.ReservePortRequest(job_id=victim.job_id), timeout=10)),
                 _code(lambda: agent.GetContainerStatus(pb.ContainerStatusRequest(), timeout=10)),
                 _code(lambda: agent.StopContainer(pb.StopContainerRequest(container_id=learner.container_id),
                                                   timeout=10))]
    return Result("agent_calls_without_token", "medium", "every agent call without a token is refused",
                  _observed(codes), _refused(codes))


def others_env_and_logs(c: Cluster) -> Result:
    """Medium: GetJob shows env to anyone; GetLogs reads anyone's logs."""
    victim = c.victim()
    with c.as_user("mallory") as (client, _, md):
        seen = dict(client.GetJob(pb.GetJobRequest(job_id=victim.job_id), metadata=md, timeout=10).spec.env)
        listed = [dict(j.spec.env) for j in client.ListJobs(pb.ListJobsRequest(), metadata=md, timeout=10).jobs
                  if j.job_id == victim.job_id]
        codes = [_code(lambda: client.GetLogs(pb.GetLogsRequest(job_id=victim.job_id), metadata=md, timeout=10))]
    owner = dict(c.job(victim.job_id, "alice").spec.env)
    leaked = seen.get("SECRET") == "hunter2" or any(e.get("SECRET") == "hunter2" for e in listed)
    ok = not leaked and _refused(codes) and owner.get("SECRET") == "hunter2"
    return Result("others_env_and_logs", "medium", "another user sees env values hidden and no logs; the owner "
                  "sees both", f"env SECRET={seen.get('SECRET')!r}; logs {_observed(codes)}; owner sees "
                  f"{owner.get('SECRET')!r}", ok)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def huge_messages(c: Cluster) -> Result:
    """High 7: 16 MiB messages, 8 at once, took the RM to 2.25 GB."""
    before = _rss_mib(c.rm_pid)
    peak = before
    codes: list[tuple[str, str]] = []
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_mib(c.rm_pid))
            time.sleep(0.02)

    def submit() -> None:
        with c.as_user("mallory") as (client, _, md):
            spec = pb.JobSpec(name="big", gpus=1, command=["true"], env={"X": "x" * (16 * MIB)})
            codes.append(_code(lambda: client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                                        metadata=md, timeout=30)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    refused = all(code == "RESOURCE_EXHAUSTED" for code, _ in codes)
    grew = peak - before
    return Result("huge_messages", "7", "refused (RESOURCE_EXHAUSTED); RM RSS grows < 200 MiB",
                  f"{len(codes)}x {codes[0][0] if codes else '?'}; RSS {before:.0f} -> peak {peak:.0f} MiB", refused
                  and grew < 200)


def silent_connection(c: Cluster) -> Result:
    """Medium: a connection that never speaks is never closed."""
    t0 = time.monotonic()
    closed_after = None
    with socket.create_connection(("127.0.0.1", c.port), timeout=20) as s:
        s.settimeout(20)
        with contextlib.suppress(OSError):
            while s.recv(4096):
                pass
            closed_after = time.monotonic() - t0
    return Result("silent_connection", "medium", "closed by the RM within the handshake timeout",
                  f"closed after {closed_after:.1f}s" if closed_after is not None else "still open after 20s",
                  closed_after is not None and closed_after < 15)


FORGED = "2026-01-01 00:00:00,000 ERROR gpurm.rm.server.daemon: forged by a learner"


def control_characters(c: Cluster) -> Result:
    """Low: control characters from learner output go verbatim into the daemons' logs."""
    script = f"printf '\\033[2J\\033]0;pwned\\007\\r\\n{FORGED}\\n' >&2; exit 3"
    job_id = c.submit("mallory", ["/bin/sh", "-c", script], name="ctl")
    job = c.wait(job_id, lambda j: j.state in TERMINAL, user="mallory")
    text = c.logs()
    bad = [line for line in text.splitlines() if "\x1b" in line or "\x07" in line or line.startswith(FORGED)]
    return Result("control_characters", "low", "no raw control character or forged line in RM/agent logs",
                  f"job {pb.JobState.Name(job.state)}; {len(bad)} bad log lines", not bad)


def _cluster_info(c: Cluster) -> pb.ClusterInfo:
    with c.as_user("mallory") as (client, _, md):
        info: pb.ClusterInfo = client.GetClusterInfo(pb.ClusterInfoRequest(), metadata=md, timeout=10)
        return info


async def _try_broker(url: str, reader: Credentials) -> tuple[str, int]:
    """Connect anonymously; then, with the reader login anyone may get, publish a forged delta and listen
    for it. Returns (what the anonymous connect got, forged deltas seen)."""
    anonymous = "connected"
    try:
        async with mqtt.client(url, None):
            pass
    except aiomqtt.MqttError as exc:
        anonymous = f"refused ({str(exc)[:40]})"
    forged = pb.ClusterView(version=2**62, base_version=0, delta=True, nodes=[
        pb.NodeView(node_id="node-1", state=pb.NODE_RUNNING, free_gpus=list(range(64)))]).SerializeToString()
    seen = 0
    with contextlib.suppress(aiomqtt.MqttError):
        async with mqtt.client(url, reader) as listener, mqtt.client(url, reader) as forger:
            await listener.subscribe(mqtt.TOPIC_VIEW_DELTA)
            with contextlib.suppress(aiomqtt.MqttError):
                await forger.publish(mqtt.TOPIC_VIEW_DELTA, forged)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    async for message in listener.messages:
                        view = pb.ClusterView()
                        view.ParseFromString(bytes(message.payload))
                        seen += view.version == 2**62
    return anonymous, seen


def forged_view_delta(c: Cluster) -> Result:
    """High 4: an anonymous broker; one forged delta (version 2^62) and every waiting AM ignores real views."""
    info = _cluster_info(c)
    reader = Credentials(info.mqtt_username, info.mqtt_password)
    anonymous, seen = asyncio.run(_try_broker(info.mqtt_url, reader))
    job_id = c.submit("alice", ["true"], name="after-forgery")
    job = c.wait(job_id, lambda j: j.state in TERMINAL)
    ok = anonymous.startswith("refused") and not seen and job.state == pb.JOB_SUCCEEDED
    return Result("forged_view_delta", "4", "anonymous clients refused; a reader's forged delta reaches no one; "
                  "jobs still run", f"anonymous {anonymous}; forged deltas delivered: {seen}; next job "
                  f"{pb.JobState.Name(job.state)}", ok)


def second_rm(c: Cluster) -> Result:
    """Medium: two RMs can run on one state directory."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = c.state / "rm" / "rm.yaml"
    try:
        done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "rm", "--config", str(config), "--listen",
                               f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30, cwd=ROOT,
                              check=False)
        observed = f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][-110:]}"
        ok = done.returncode == 2
    except subprocess.TimeoutExpired:
        observed, ok = "a second RM ran for 30 s on the same state dir", False
    return Result("second_rm", "medium", "the second RM exits 2 naming the lock holder", observed, ok)


def huge_queue_refresh(c: Cluster) -> Result:
    """Medium: a 100k-queue refresh stalled the RM for 27 s."""
    text = "queues:\n" + "".join(f"  q{i}: {{weight: 1}}\n" for i in range(100_000))
    admin_user = "root"
    creds = None
    if c.tls:
        d = c.state / "pki"
        creds = load_tls({"ca": str(d / "ca" / "ca.pem"), "cert": str(d / "user.pem"), "key": str(d / "user-key.pem")})
    worst = 0.0
    done = threading.Event()

    def other_client() -> None:
        nonlocal worst
        with c.as_user("alice") as (client, _, md):
            while not done.is_set():
                t0 = time.monotonic()
                client.ListNodes(pb.ListNodesRequest(), metadata=md, timeout=60)
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.02)

    watcher = threading.Thread(target=other_client)
    watcher.start()
    t0 = time.monotonic()
    reply = pb.RefreshQueuesResponse()

    def refresh() -> None:
        nonlocal reply
        reply = pbg.AdminStub(ch).RefreshQueues(pb.RefreshQueuesRequest(yaml=text),
                                                metadata=((USER_KEY, admin_user),), timeout=60)

    with c.channel(creds) as ch:
        code, details = _code(refresh)
    took = time.monotonic() - t0
    done.set()
    watcher.join()
    why = details or "; ".join(reply.errors)
    ok = code in ("OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED") and not reply.applied and took < 5 and worst < 2
    return Result("huge_queue_refresh", "medium", "refused within seconds; other clients answered meanwhile",
                  f"{code}{' applied!' if reply.applied else ', not applied'} after {took:.2f}s ({why[:60]}); "
                  f"other client's worst wait {worst * 1000:.0f} ms", ok)


ATTACKS: dict[str, Callable[[Cluster], Result]] = {f.__name__: f for f in (
    admin_by_claim, job_as_claimed_root, register_stranger, hijack_live_node, replay_registration, stolen_node_key,
    am_token_from_node_key, stolen_am_token, agent_calls_without_token, others_env_and_logs, forged_view_delta,
    huge_messages, silent_connection, control_characters, second_rm, huge_queue_refresh)}


def run_attack(name: str, cluster: Cluster) -> Result:
    fn = ATTACKS[name]
    try:
        return fn(cluster)
    except Skip as exc:
        return Result(name, "-", "-", f"skipped: {exc}", True)
    except Exception as exc:
        return Result(name, "-", "the attack fails", f"harness error: {type(exc).__name__}: {exc}"[:200], False)


@contextlib.contextmanager
def dev_cluster(tls_on: bool, nodes: int = 3, workdir: Path | None = None) -> Iterator[Cluster]:
    """A dev cluster whose RM listens on every address (so 'another host' can be tried from this one)."""
    state = Path(tempfile.mkdtemp(prefix="gpurm-pentest-", dir=workdir))
    state.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "gpurm.cli.main", "dev-cluster", "--nodes", str(nodes), "--gpus-per-node", "4",
            "--racks", "1", "--port", str(port), "--state-dir", str(state), "--http-port", "0",
            "--rm-option", f"listen=0.0.0.0:{port}", "--rm-option", f"advertise=127.0.0.1:{port}",
            "--rm-option", "limits.handshake_timeout=3s", *TEST_RM_OPTIONS, *(["--tls"] if tls_on else [])]
    with (state / "dev-cluster.log").open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(OSError, ValueError):
                if json.loads((state / "cluster.json").read_text()).get("ready"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the dev cluster did not start:\n"
                                   + (state / "dev-cluster.log").read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        yield Cluster(state, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
