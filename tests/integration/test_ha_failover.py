"""Two real RMs on one real PostgreSQL (`gpurm dev-cluster --rms 2 --store postgresql://...`), real agents, a real
job: SIGKILL the leader, then pause the next one (SIGSTOP, as a hung or partitioned leader), and each time the
standby takes over within the lease, with the running job, its containers and its learner processes as they were;
the CLI, given both addresses, follows; the paused leader, let go, finds itself deposed and stands by."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import grpc

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.server.standby import LEADER_KEY
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

LEASE_S = 3.0


def ask(address: str) -> tuple[str, str]:
    """('leader', '') when the RM at `address` serves, ('standby', leader it names) or ('down', why)."""
    with grpc.insecure_channel(address) as channel:
        try:
            pbg.ClientStub(channel).GetClusterInfo(pb.ClusterInfoRequest(), timeout=2)
            return "leader", ""
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE and "standby" in (exc.details() or ""):
                return "standby", dict(exc.trailing_metadata() or ()).get(LEADER_KEY, "")
            return "down", exc.details() or ""


def leader_of(*addresses: str) -> str:
    """The address of the RM that serves ('' when none does)."""
    return next((a for a in addresses if ask(a)[0] == "leader"), "")


def wait_for(what: str, check: Any, timeout: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():
            return time.monotonic() - began
        time.sleep(0.1)
    raise TimeoutError(what)


def job_on(address: str, job_id: str) -> pb.Job:
    with grpc.insecure_channel(address) as channel:
        job: pb.Job = pbg.ClientStub(channel).GetJob(pb.GetJobRequest(job_id=job_id), timeout=10)
        return job


def learners(job: pb.Job) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted((x.container_id, x.node_id, tuple(x.gpu_indices)) for x in job.attempts[-1].learners)


def test_the_standby_takes_over_a_killed_then_a_paused_leader_and_nothing_is_lost(
        tmp_path: Any, broker: TestBroker, pg_url: str) -> None:
    c = DevCluster(tmp_path / "c", nodes=2, gpus_per_node=4, racks=1, broker=broker,
                   extra=("--rms", "2", "--store", pg_url, "--rm-option", f"ha.lease={LEASE_S:g}s"))
    try:
        first, second = (r["address"] for r in c.info["rms"])
        everyone = {"GPURM_RM": f"{first},{second}"}
        wait_for("the second RM stands by", lambda: ask(second) == ("standby", first), 30)
        job_id = c.submit("--gpus", "4", "--name", "survivor", "--", "sleep", "300")
        c.wait_job(job_id, states=[pb.JOB_RUNNING], timeout=60)
        before = learners(c.job(job_id))
        pids = c.job_pids(job_id)
        assert before and pids

        # 1. SIGKILL the leader: an RM leads again within the lease (the standby, or the killed one, which the
        # dev cluster restarts at once, as a supervisor would) and knows the job as it was.
        os.kill(int(c.info["rms"][0]["pid"]), signal.SIGKILL)
        took = wait_for("an RM takes over", lambda: leader_of(first, second) != "", 3 * LEASE_S + 10)
        assert took < 10, took
        leader = leader_of(first, second)
        other = second if leader == first else first
        job = job_on(leader, job_id)
        assert job.state == pb.JOB_RUNNING and learners(job) == before
        assert all(_alive(p) for p in pids)
        # The CLI, given both addresses, finds the leader; the other RM stands by, naming it.
        listed = c.gpurm("jobs", "-o", "json", env=everyone)
        assert listed.code == 0 and job_id in listed.out, listed.err
        wait_for("the other RM stands by", lambda: ask(other) == ("standby", leader), 30)
        # Its web UI sends browsers to the leader's.
        with grpc.insecure_channel(leader) as channel:
            leader_http = pbg.ClientStub(channel).GetClusterInfo(pb.ClusterInfoRequest(), timeout=5).http_url
        other_http = next(r["http"] for r in c.info["rms"] if r["address"] == other)
        # (503 until the leader's web UI URL reaches its lease row, which the standby reads.)
        expected = (307, f"{leader_http}/jobs/{job_id}")
        assert leader_http
        wait_for("the standby's web UI redirects to the leader's",
                 lambda: _get_no_redirect(f"http://{other_http}/jobs/{job_id}") == expected, 3 * LEASE_S + 10)
        # Both agents follow to the leader; a new job runs there.
        wait_for("the agents re-register", lambda: _running_nodes(leader) == 2, 30)
        quick = c.gpurm("submit", "--gpus", "1", "--name", "after", "--", "true", env=everyone)
        assert quick.code == 0, quick.err
        wait_for("the new job succeeds", lambda: job_on(leader, quick.out.strip()).state == pb.JOB_SUCCEEDED, 60)

        # 2. Pause the leader (SIGSTOP): the other takes over; let go, the paused one stands down and stands by.
        paused = int(next(r["pid"] for r in c.info["rms"] if r["address"] == leader))
        os.kill(paused, signal.SIGSTOP)
        try:
            took = wait_for("the standby takes over", lambda: ask(other)[0] == "leader", 3 * LEASE_S + 10)
            assert took < 10, took
        finally:
            os.kill(paused, signal.SIGCONT)
        wait_for("the paused RM stands by", lambda: ask(leader) == ("standby", other), 30)
        job = job_on(other, job_id)
        assert job.state == pb.JOB_RUNNING and learners(job) == before
        assert all(_alive(p) for p in pids)
        # No GPU is booked twice: the job holds its 4 GPUs and nothing else runs (the quick job ended).
        with grpc.insecure_channel(other) as channel:
            nodes = pbg.ClientStub(channel).ListNodes(pb.ListNodesRequest(), timeout=10).nodes
        used = sorted((n.node_id, a.gpu_index) for n in nodes for a in n.assignments)
        assert used == sorted((node, i) for _, node, idx in before for i in idx)
        paused_log = c.state_dir / ("rm" if leader == first else "rm-2") / "rm.log"
        assert "no longer the leader" in paused_log.read_text()
        assert c.gpurm("kill", job_id, env=everyone).code == 0
    finally:
        c.stop()


def _get_no_redirect(url: str) -> tuple[int, str]:
    """(status, Location) of a GET that is not followed."""
    class Keep(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None
    try:
        with urllib.request.build_opener(Keep()).open(url, timeout=10) as r:
            return r.status, r.headers.get("Location", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", "")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running_nodes(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        nodes = pbg.ClientStub(channel).ListNodes(pb.ListNodesRequest(), timeout=10).nodes
    return sum(1 for n in nodes if n.state == pb.NODE_RUNNING)
