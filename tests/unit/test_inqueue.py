"""In-queue preemption (rm/sched/inqueue.py) on its own: a cluster, a queue book and the job records by hand; the
preemptions it decides go to a callback."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Container, ContainerKind, Job
from gpurm.queues.tree import Policy, default_tree
from gpurm.rm.sched import preemption
from gpurm.rm.sched.inqueue import InQueuePreemption
from gpurm.rm.sched.scheduler import Scheduler
from gpurm.rm.sched.standing import Standings
from gpurm.rm.state.cluster import Cluster, Node
from gpurm.rm.state.queuebook import QueueBook

QUEUE = "root.default"


class Rig:
    def __init__(self, gpus: int = 8) -> None:
        self.cluster = Cluster()
        self.cluster.upsert(Node("n1", "h1", 1, "r1", "r1", {i: GpuRecord(i) for i in range(gpus)}))
        book = QueueBook(default_tree())
        scheduler = Scheduler(self.cluster, book)
        scheduler.policy_override = Policy.LAS
        self.jobs: dict[str, Job] = {}
        self.live_by_job: dict[str, dict[str, Container]] = {}
        self.learners_live: dict[str, int] = {}
        self.with_am: dict[str, dict[str, None]] = {}
        self.nudged: dict[str, None] = {}
        self.preempted: list[tuple[str, str, float]] = []
        self.standings = Standings(self.live_by_job)
        self.inqueue = InQueuePreemption(self.cluster, book, scheduler, self.standings, self.jobs,
                                         self.live_by_job, self.learners_live, self.with_am, self.nudged,
                                         300.0, self.preempt)

    def preempt(self, job: Job, d: preemption.Decision, grace_s: float, now: float) -> None:
        self.preempted.append((job.job_id, d.beneficiary, now))

    def job(self, name: str, gpus: int, now: float) -> Job:
        j = Job(job_id=name, spec=JobSpec(gpus=gpus, command=["x"]), user="u", queue=QUEUE, submit_time=now,
                seq=len(self.jobs) + 1, idle_since=now)
        self.jobs[name] = j
        self.with_am.setdefault(QUEUE, {})[name] = None
        return j

    def run(self, name: str, gpus: int, started: float) -> None:
        cid = f"{name}-c"
        self.cluster.allocate("n1", range(gpus), cid)
        self.live_by_job[name] = {cid: Container(cid, name, ContainerKind.LEARNER, "n1", list(range(gpus)), 1,
                                                 started, started=started)}
        self.learners_live[name] = 1
        self.standings.runs_changed(name)

    def arrive(self, name: str, gpus: int, now: float) -> None:
        self.inqueue.touch(self.job(name, gpus, now))


def test_a_waiting_job_outranking_an_old_enough_runner_takes_its_gpus() -> None:
    rig = Rig()
    rig.job("old", 8, 0.0)
    rig.run("old", 8, 10.0)
    assert rig.inqueue.run(set(), 100.0) == []      # nobody waits (and `old` is too young anyway)
    assert rig.inqueue.run(set(), 2000.0) == []     # LAS level 1 now, but still nobody waits
    rig.arrive("w", 8, 2100.0)                      # level 0: outranks it
    assert rig.inqueue.run(set(), 2200.0) == [("old", "w")]
    assert rig.preempted == [("old", QUEUE, 2200.0)]
    assert "w" in rig.nudged


def test_a_job_under_a_deadline_is_not_weighed_again() -> None:
    rig = Rig()
    rig.job("old", 8, 0.0)
    rig.run("old", 8, 10.0)
    rig.job("w", 8, 2100.0)
    assert rig.inqueue.run({"old"}, 2200.0) == []
    assert rig.preempted == []


def test_an_outranking_job_that_fits_in_idle_gpus_is_only_told_to_plan() -> None:
    rig = Rig()
    rig.job("old", 4, 0.0)
    rig.run("old", 4, 10.0)
    rig.job("w", 4, 20.0)
    assert rig.inqueue.run(set(), 2000.0) == []
    assert rig.preempted == [] and list(rig.nudged) == ["w"]


def test_a_quiet_look_is_kept_until_a_job_of_its_queue_changes() -> None:
    rig = Rig()
    rig.job("old", 8, 0.0)
    rig.run("old", 8, 10.0)
    rig.inqueue.run(set(), 2000.0)
    look = rig.inqueue.looks[QUEUE]
    assert not look.dirty
    rig.inqueue.touch(rig.jobs["old"])
    assert list(look.dirty) == ["old"]
    rig.inqueue.clear()
    assert rig.inqueue.looks == {}


def test_rooms_follow_the_cluster() -> None:
    rig = Rig(gpus=4)
    rig.cluster.allocate("n1", [0], "x")
    (room,) = rig.inqueue.rooms()
    assert (room.node_id, room.domain, room.size, room.free) == ("n1", "r1", 4, 3)
    assert rig.inqueue.idle_on() == [3]
