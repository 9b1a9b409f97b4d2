"""The fence under a real partition: two agents, each in a network namespace of its own with an address on a bridge,
an RM and a broker on the bridge; the server that runs a job's learner is cut off (iptables DROP inside its
namespace) and the test watches the processes: the learner must be gone before the RM declares the node LOST, and
before the job's next attempt starts on the other server. When the cut heals the agent registers again and reports
what it stopped. Needs root (network namespaces): skipped otherwise, with the reason."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.cli import netns
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import run_broker
from tests.integration.harness import alive
from tests.integration.rmproc import AgentProcess, RMProcess, poll

pytestmark = [pytest.mark.netns, pytest.mark.skipif(bool(netns.root_problem()), reason=netns.root_problem()
                                                    or "needs root")]

INTERVAL = "500ms"
MISSED_BEATS = 12        # expiry 6 s
FENCE_GRACE_S = 1.0      # lease: 6 - 1 - (0.5 + 0.5) = 4 s
LEASE_S = 4.0


@pytest.fixture
def net() -> Iterator[netns.ClusterNet]:
    name = f"t{uuid.uuid4().hex[:6]}"
    cluster = netns.create(name, [f"{name}-a", f"{name}-b"])
    try:
        yield cluster
    finally:
        netns.remove(name)
        assert not netns.leftovers(name)


def test_a_cut_off_server_stops_its_learner_before_the_rm_may_start_it_elsewhere(
        tmp_path: Path, net: netns.ClusterNet) -> None:
    a_id, b_id = sorted(net.nodes)
    with run_broker(tmp_path / "broker", host=net.gateway) as broker:
        rm = RMProcess(tmp_path / "rm", broker, host=net.gateway, heartbeat=INTERVAL, missed_beats=MISSED_BEATS,
                       fence_grace=f"{FENCE_GRACE_S:g}s")
        agents = {n: AgentProcess(tmp_path / n, rm, n, gpus={"fake": 1}, host=net.nodes[n].address,
                                  wrap=netns.in_namespace(net.nodes[n].namespace, []))
                  for n in (a_id, b_id)}
        try:
            for agent in agents.values():
                agent.start()
            job_id = rm.submit("while true; do sleep 0.1; done", gpus=1, max_retries=3)
            first = rm.learner(job_id)
            cut = agents[first.node_id]
            other = agents[b_id if first.node_id == a_id else a_id]
            watch = _watch_the_cut(rm, net.nodes[cut.node_id].namespace, cut, other, job_id, first.pid)
            assert watch["both"] < 0, "two attempts of the job ran at once"
            # The measured timeline, from the moment of the cut (docs/operations.md quotes it).
            print(f"\nfence timeline (s after the cut): learner gone {watch['gone']:.2f}, node LOST "
                  f"{watch['lost']:.2f}, next attempt's learner running {watch['next']:.2f}; lease {LEASE_S:g}s, "
                  f"grace {FENCE_GRACE_S:g}s, expiry {0.5 * MISSED_BEATS:g}s")
            assert watch["gone"] < watch["lost"] and watch["gone"] < watch["next"]
            assert LEASE_S - 1.0 <= watch["gone"] <= LEASE_S + FENCE_GRACE_S + 1.5
            assert watch["lost"] >= 0.5 * MISSED_BEATS - 0.5
            # The stopped learner is recorded as such, an infrastructure failure: the job is retried, not failed.
            record = json.loads((cut.state / "containers" / first.container_id / "record.json").read_text())
            assert record["stop_reason"].startswith("fenced: no answer from the RM") and record["infra_failure"]
            job = rm.wait_job(job_id, [pb.JOB_RUNNING], timeout=30)
            assert job.attempts[0].failure == pb.FAILURE_INFRA
            assert all(x.state != pb.CONTAINER_RUNNING for x in job.attempts[0].learners)
            # The cut heals: the agent registers again, reports what the fence stopped, and may start work again.
            netns.heal(net.nodes[cut.node_id].namespace)
            rm.wait_node(cut.node_id, timeout=30)
            poll(lambda: "containers the fence stopped" in cut.log_text() or None, 20,
                 lambda: f"the agent did not report what it stopped:\n{cut.log_text()}")
            # Lifted by the first answer to something sent after the heal (a registration sent during the cut and
            # answered after it renews the lease only from when it was sent, which may have run out already).
            poll(lambda: "the fence is lifted" in cut.log_text() or None, 20,
                 lambda: f"the fence was not lifted:\n{cut.log_text()}")
            assert rm.job(job_id).attempts[-1].learners[0].node_id == other.node_id
        except BaseException:
            for agent in agents.values():      # what each side saw, for the failure's report
                print(f"--- agent {agent.node_id}\n{agent.log_text()[-4000:]}")
            print(f"--- rm\n{rm.log_text()[-6000:]}")
            raise
        finally:
            for agent in agents.values():
                agent.close()
            assert rm.close() == 0, rm.log_text()


def _watch_the_cut(rm: RMProcess, namespace: str, cut: AgentProcess, other: AgentProcess, job_id: str, pid: int
                   ) -> dict[str, float]:
    """Cut `cut` off the RM and watch, every 20 ms, the first learner, the node's state and the other server's
    learner processes of the job (GPURM_GPUS=0: not its AM), until the job's next learner runs there. Times are
    seconds after the cut; "both": when both learners were seen alive at once (-1: never)."""
    netns.partition(namespace, [rm.address.split(":")[0]])
    t0 = time.monotonic()
    gone = lost = nxt = both = -1.0
    deadline = t0 + 60
    while nxt < 0 or lost < 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"after 60s: gone {gone}, lost {lost}, next {nxt}\n{cut.log_text()[-3000:]}")
        now = time.monotonic() - t0
        if gone < 0 and not alive(pid):
            gone = now
        if lost < 0 and rm.nodes()[cut.node_id].state == pb.NODE_LOST:
            lost = now
        if other.processes(GPURM_GPUS="0"):
            if nxt < 0:
                nxt = now
            if alive(pid) and both < 0:
                both = now
        time.sleep(0.02)
    return {"gone": gone, "lost": lost, "next": nxt, "both": both}
