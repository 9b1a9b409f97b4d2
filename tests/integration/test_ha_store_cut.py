"""An HA leader cut off from its store: the leader RM runs in a network namespace of its own, the standby, the
PostgreSQL server and the broker on a bridge, an agent in another namespace runs a job. iptables inside the leader's
namespace drops its traffic to and from PostgreSQL's port (the agent and the broker still reach it): the leader
must stop acting as leader before the standby takes over (no moment where both answer as leader), exit 3 (deposed)
for its supervisor, and the job keep running, the same learner process, under the new leader. Needs root."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpurm.cli import netns
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import run_broker
from tests.integration.harness import alive
from tests.integration.rmproc import AgentProcess, RMProcess, poll
from tests.integration.test_ha_failover import ask, job_on
from tests.pg import run_postgres

pytestmark = [pytest.mark.netns, pytest.mark.skipif(bool(netns.root_problem()), reason=netns.root_problem()
                                                    or "needs root")]

HA_LEASE_S = 3.0


@pytest.fixture
def net() -> Iterator[netns.ClusterNet]:
    name = f"h{uuid.uuid4().hex[:6]}"
    cluster = netns.create(name, ["rm-a", f"{name}-n1"])
    try:
        yield cluster
    finally:
        netns.remove(name)


def test_a_leader_cut_off_from_its_store_stops_leading_before_the_standby_takes_over(
        tmp_path: Path, net: netns.ClusterNet) -> None:
    rm_ns = net.nodes["rm-a"]
    node_id = next(n for n in net.nodes if n != "rm-a")
    with run_postgres(tmp_path / "pg", host=net.gateway) as pg, \
            run_broker(tmp_path / "broker", host=net.gateway) as broker:
        settings = {"store": {"url": pg.create_database()}, "ha": {"enabled": True, "lease": f"{HA_LEASE_S:g}s"}}
        leader = RMProcess(tmp_path / "rm-a", broker, heartbeat="1s", host=rm_ns.address,
                           wrap=netns.in_namespace(rm_ns.namespace, []), **settings)
        standby = RMProcess(tmp_path / "rm-b", broker, heartbeat="1s", host=net.gateway,
                            key_from=leader.state_dir / "token.key", standby=True, **settings)
        agent = AgentProcess(tmp_path / "agent", leader, node_id, gpus={"fake": 1},
                             rm_list=[leader.address, standby.address], host=net.nodes[node_id].address,
                             wrap=netns.in_namespace(net.nodes[node_id].namespace, []))
        try:
            agent.start()
            job_id = leader.submit("sleep 300", gpus=1)
            learner = leader.learner(job_id)

            netns.partition(rm_ns.namespace, [net.gateway], port=pg.port)
            t0 = time.monotonic()
            last_old = first_new = exited = -1.0
            while first_new < 0 or exited < 0:
                now = time.monotonic() - t0
                assert now < 60, (f"60s after the cut: old leader last answered {last_old}, new from {first_new}, "
                                  f"old exited {exited}\n{leader.log_text()[-3000:]}")
                if exited < 0 and ask(leader.address)[0] == "leader":
                    last_old = now
                if first_new < 0 and ask(standby.address)[0] == "leader":
                    first_new = now
                assert leader.proc is not None
                if exited < 0 and leader.proc.poll() is not None:
                    exited = now
                time.sleep(0.05)
            print(f"\nstore cut: the old leader last answered as leader {last_old:.2f}s after the cut, exited "
                  f"{exited:.2f}s; the standby served from {first_new:.2f}s (ha.lease {HA_LEASE_S:g}s)")
            assert last_old < first_new, "both RMs answered as leader"
            assert leader.proc is not None and leader.proc.returncode == 3, leader.log_text()[-3000:]
            assert first_new < 3 * HA_LEASE_S + 5

            # The job runs on, the same learner process, under the new leader; the agent followed it.
            job = poll(lambda: _running(standby.address, job_id), 30, f"{job_id} is not RUNNING on the new leader")
            assert job.attempts[-1].learners[0].container_id == learner.container_id
            assert alive(learner.pid) and len(job.attempts) == 1
        finally:
            agent.rm = standby          # (close() drains its node on the RM that leads now)
            agent.close()
            standby.close()
            leader.close()


def _running(address: str, job_id: str) -> pb.Job | None:
    """The job as the RM at `address` knows it, once RUNNING (a fresh channel: the standby's address changed hands
    from its stand-in server to the real one when it took over)."""
    try:
        job = job_on(address, job_id)
    except grpc.RpcError:
        return None
    return job if job.state == pb.JOB_RUNNING else None
