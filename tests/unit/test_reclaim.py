"""Fair-share reclaiming (rm/sched/reclaim.py) on its own: the ledger of GPUs taken back for a queue, which jobs run on
borrowed GPUs, hoarded grants, and when queue work next comes due. Preempting and revoking are callbacks here."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Container, ContainerKind, Job, JobState
from gpurm.queues.config import parse_queues
from gpurm.rm.sched import preemption
from gpurm.rm.sched.reclaim import RECLAIM_HOLD_S, Reclaims
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.cluster import Cluster, Node
from gpurm.rm.state.containers import ContainerIndex
from gpurm.rm.state.queuebook import QueueBook

QUEUES = "queues:\n  a: {weight: 1}\n  b: {weight: 1}\n"


class Rig:
    def __init__(self, gpus: int = 8) -> None:
        self.cluster = Cluster()
        self.cluster.upsert(Node("n1", "h", 1, "r1", "r1", {i: GpuRecord(i) for i in range(gpus)}))
        self.book = QueueBook(parse_queues(QUEUES))
        self.jobs: dict[str, Job] = {}
        self.index = ContainerIndex(lambda job_id: None)
        self.apps: dict[str, object] = {}
        self.asking: dict[str, object] = {}
        self.ams = AMLauncher(self.cluster, self.book, self.jobs, self.index.live_ams, 100, 100,
                              lambda job, node_id, now: None)
        self.revoked: list[tuple[str, str]] = []
        self.preempted: list[str] = []
        self.reclaims = Reclaims(self.cluster, self.book, self.jobs, self.index, self.ams, self.apps, self.asking,
                                 False, 300.0, self.preempt, self.revoke)

    def preempt(self, job: Job, d: preemption.Decision, grace_s: float, now: float) -> None:
        self.preempted.append(job.job_id)

    def revoke(self, c: Container, diagnostics: str, now: float) -> None:
        self.revoked.append((c.container_id, diagnostics))

    def job(self, queue: str, gpus: int, start: float = 0.0) -> Job:
        seq = len(self.jobs) + 1
        j = Job(f"job-{seq}", JobSpec(gpus=gpus, command=["x"]), "u", f"root.{queue}", 0.0, seq=seq,
                state=JobState.RUNNING if start else JobState.ALLOCATING, start_time=start)
        self.jobs[j.job_id] = j
        self.book.want(j.queue, gpus)
        return j

    def grant(self, job: Job, gpus: int, created: float = 0.0, started: float = 0.0) -> Container:
        cid = f"{job.job_id}-c{len(self.index.containers)}"
        free = [i for i in range(8) if i not in self.cluster.nodes["n1"].allocated][:gpus]
        self.cluster.allocate("n1", free, cid)
        c = Container(cid, job.job_id, ContainerKind.LEARNER, "n1", free, 1, created, started=started)
        self.index.add(c)
        self.book.charge(job.queue, job.user, gpus)
        return c


def test_gpus_freed_by_preemption_are_held_for_the_beneficiary_until_granted_or_expired() -> None:
    rig = Rig()
    c = Container("c1", "job-1", ContainerKind.LEARNER, "n1", [0, 1, 2], 1, 0.0, preempt_deadline=30.0,
                  preempted_for="root.b")
    rig.reclaims.marked("root.b", 3)
    assert rig.reclaims.reclaiming_live == {"root.b": 3}
    rig.reclaims.ended(c, 10.0)
    assert rig.reclaims.reclaiming_live == {"root.b": 0}
    assert rig.reclaims.reserved(20.0) == {"root.b": 3}
    rig.reclaims.consume("root.b", 2)
    assert rig.reclaims.reserved(20.0) == {"root.b": 1}
    assert rig.reclaims.reserved(10.0 + RECLAIM_HOLD_S) == {}          # the hold ran out


def test_jobs_on_borrowed_gpus_are_the_newest_above_the_steady_share() -> None:
    rig = Rig()
    first, second = rig.job("a", 4, start=1.0), rig.job("a", 4, start=2.0)
    rig.grant(first, 4, started=1.0)
    rig.grant(second, 4, started=2.0)
    assert rig.reclaims.preemptible_jobs() == {second.job_id}          # a's steady share: half of 8


def test_a_hoarded_grant_is_taken_back_while_another_queue_waits() -> None:
    rig = Rig()
    hoarder = rig.job("a", 16)
    rig.apps[hoarder.job_id] = object()
    rig.grant(hoarder, 4, created=1.0)
    rig.grant(hoarder, 4, created=2.0)
    assert rig.reclaims.revoke_hoarded(5.0) == []        # nobody else waits
    rig.job("b", 4)                                      # b wants 4 and has none
    assert rig.reclaims.revoke_hoarded(6.0) == [f"{hoarder.job_id}-c1"]   # the newest first, down to a's share
    ((_, why),) = rig.revoked
    assert "incomplete" in why and "b waited" in why


def test_nothing_is_due_while_no_queue_waits_or_is_reclaimed() -> None:
    rig = Rig()
    assert rig.reclaims.next_check(0.0) is None
    assert rig.reclaims.being_preempted() == set()
