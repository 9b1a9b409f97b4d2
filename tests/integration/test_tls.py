"""Mutual TLS end to end: a real RM and a real agent with `tls:` sections, certificates made here (openssl).

The full path runs over mTLS: the CLI and the test to the RM, the agent's stream to the RM, the RM to the agent
(launching the AM), the AM to the RM and the AM to the agent (launching the learner).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gpurm.common import tls
from gpurm.common.callers import USER_KEY
from gpurm.common.tls import TLSConfig, load_tls
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from tests.conftest import TestBroker
from tests.integration.harness import ROOT
from tests.integration.rmproc import AgentProcess, RMProcess

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl binary")

NODE = "tls-node-1"
QUEUES = "queues:\n  default:\n    weight: 2\n    acl: {submit: ['*']}\n"


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


@dataclass
class CA:
    """A throwaway certificate authority in `folder`."""

    folder: Path
    name: str

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cert = self.folder / f"{self.name}.pem"
        self.key = self.folder / f"{self.name}-key.pem"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", self.key, "-out", self.cert, "-days", "2", "-subj", f"/CN={self.name}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def issue(self, cn: str, stem: str = "") -> dict[str, str]:
        """A certificate for CN `cn` (client and server use; names 127.0.0.1 and localhost): a `tls:` section."""
        stem = self.folder / (stem or cn.replace(":", "_"))
        key, csr, cert, ext = (stem.with_suffix(s) for s in (".key", ".csr", ".pem", ".ext"))
        ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                       "keyUsage=critical,digitalSignature,keyEncipherment\n"
                       "extendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                 "-out", csr, "-subj", f"/CN={cn}")
        _openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-CAcreateserial",
                 "-out", cert, "-days", "2", "-extfile", ext)
        return {"ca": str(self.cert), "cert": str(cert), "key": str(key)}


@dataclass
class Certs:
    rm: dict[str, str]
    agent: dict[str, str]
    am: dict[str, str]         # the client certificate the agent hands its AMs (am_tls)
    alice: dict[str, str]
    bob: dict[str, str]
    stranger: dict[str, str]   # alice's name, signed by another CA


def am_cert(ca: CA) -> dict[str, str]:
    """The AMs' own certificate (am_tls): a separate key from the node's, CN am:<name>."""
    return ca.issue("am:cluster", stem="am-cert")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    base = tmp_path_factory.mktemp("pki")
    ca, other = CA(base / "ca", "gpurm-test-ca"), CA(base / "other", "other-ca")
    return Certs(rm=ca.issue("rm"), agent=ca.issue(f"node:{NODE}"), am=am_cert(ca), alice=ca.issue("alice"),
                 bob=ca.issue("bob"), stranger=other.issue("alice"))


def as_tls(files: dict[str, str]) -> TLSConfig:
    return load_tls(files)


@dataclass
class Cluster:
    rm: RMProcess
    agent: AgentProcess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker, certs: Certs) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("tls")
    rm = RMProcess(work / "rm", broker, heartbeat="500ms", client_tls=as_tls(certs.alice), tls=certs.rm,
                   admins=["alice"])
    # alice and bob are no accounts on this machine: a root agent runs every job as nobody (containers.local_user)
    # and hands the AMs their own certificate (am_tls); an agent that is not root runs them as itself.
    root = os.geteuid() == 0
    agent = AgentProcess(work / "agent", rm, NODE, containers={"local_user": "nobody"} if root else {},
                         tls=certs.agent, **({"am_tls": {"cert": certs.am["cert"], "key": certs.am["key"]}}
                                             if root else {}))
    try:
        agent.start()
        yield Cluster(rm, agent)
    finally:
        agent.close()
        rm.close()


def gpurm(rm: RMProcess, files: dict[str, str] | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPURM_")} | {"GPURM_RM": rm.address}
    if files is not None:
        env.update({tls.ENV_CA: files["ca"], tls.ENV_CERT: files["cert"], tls.ENV_KEY: files["key"]})
    return subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_plaintext_client_is_refused(cluster: Cluster) -> None:
    with grpc.insecure_channel(cluster.rm.address) as ch, pytest.raises(grpc.RpcError) as err:
        pbg.ClientStub(ch).GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    out = gpurm(cluster.rm, None, "jobs")
    assert out.returncode == 3
    assert "cannot reach the RM" in out.stderr and "GPURM_TLS_CA" in out.stderr, out.stderr


def test_a_certificate_from_another_ca_is_refused(cluster: Cluster, certs: Certs) -> None:
    with tls.channel(cluster.rm.address, as_tls(certs.stranger)) as ch, pytest.raises(grpc.RpcError) as err:
        pbg.ClientStub(ch).GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    out = gpurm(cluster.rm, certs.stranger, "jobs")
    assert out.returncode == 3 and "over mTLS" in out.stderr, out.stderr


def test_the_user_is_the_certificate_name_whatever_the_metadata_says(cluster: Cluster, certs: Certs) -> None:
    spec = pb.JobSpec(name="claims-bob", gpus=1, command=["/bin/sh", "-c", "sleep 30"])
    reply = cluster.rm.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                        metadata=((USER_KEY, "bob"),), timeout=10)
    assert cluster.rm.job(reply.job_id).user == "alice"
    # bob's certificate cannot kill alice's job, even claiming to be alice
    with tls.channel(cluster.rm.address, as_tls(certs.bob)) as ch, pytest.raises(grpc.RpcError) as err:
        pbg.ClientStub(ch).KillJob(pb.KillJobRequest(job_id=reply.job_id), metadata=((USER_KEY, "alice"),),
                                   timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    cluster.rm.kill_job(reply.job_id)
    cluster.rm.wait_job(reply.job_id)

    out = gpurm(cluster.rm, certs.alice, "submit", "--gpus", "1", "--", "true")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    assert cluster.rm.wait_job(job_id, timeout=60).user == "alice"
    listed = gpurm(cluster.rm, certs.alice, "jobs", "-o", "json")
    assert listed.returncode == 0 and job_id in listed.stdout, listed.stderr


def test_only_admins_refresh_queues(cluster: Cluster, certs: Certs, tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(QUEUES)
    out = gpurm(cluster.rm, certs.bob, "admin", "refresh-queues", str(queues))
    assert out.returncode != 0
    assert "permission denied" in out.stderr and "RM admins (alice)" in out.stderr and "bob" in out.stderr, \
        out.stderr
    out = gpurm(cluster.rm, certs.alice, "admin", "refresh-queues", str(queues))
    assert out.returncode == 0, out.stderr
    drain = gpurm(cluster.rm, certs.bob, "admin", "drain", NODE)
    assert drain.returncode != 0 and "permission denied" in drain.stderr, drain.stderr


def test_a_user_or_another_node_cannot_register_a_node(cluster: Cluster, certs: Certs) -> None:
    """Registering hands out the container-token key: only the node's own certificate may."""
    request = pb.RegisterNodeRequest(node_id="intruder", host="127.0.0.1", agent_port=1, agent_instance="x")
    for files in (certs.alice, certs.agent):
        with tls.channel(cluster.rm.address, as_tls(files)) as ch, pytest.raises(grpc.RpcError) as err:
            pbg.ResourceTrackerStub(ch).RegisterNode(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "node:intruder" in (err.value.details() or "")
    # and a node's certificate acts as no user
    with tls.channel(cluster.rm.address, as_tls(certs.agent)) as ch, pytest.raises(grpc.RpcError) as err:
        pbg.ClientStub(ch).SubmitJob(pb.SubmitJobRequest(spec=pb.JobSpec(name="x", gpus=1, command=["true"]),
                                                         submit_id="n"), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_job_runs_through_an_am_over_mtls(cluster: Cluster) -> None:
    node = cluster.rm.nodes()[NODE]
    assert node.state == pb.NODE_RUNNING
    job_id = cluster.rm.submit("echo hello-over-tls", gpus=1)
    job = cluster.rm.wait_job(job_id, timeout=60)
    assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, cluster.agent.log_text()[-3000:])
    assert job.user == "alice"
    (learner,) = job.attempts[-1].learners
    assert learner.node_id == NODE
    logs = cluster.rm.client.GetLogs(pb.GetLogsRequest(job_id=job_id), timeout=10)   # RM -> agent over mTLS
    assert b"hello-over-tls" in logs.data
    assert "with mTLS" in cluster.rm.log_text() and "with mTLS" in cluster.agent.log_text()
