"""Recovery (rm/state/recovery.py) on its own: records in, derived state rebuilt from them alone."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Container, ContainerKind, ContainerPhase, Job, JobState
from gpurm.queues.tree import default_tree
from gpurm.rm.state import recovery
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.cluster import Cluster, Node
from gpurm.rm.state.containers import ContainerIndex
from gpurm.rm.state.queuebook import QueueBook

Q = "root.default"


def job(n: int, state: JobState = JobState.RUNNING, am: str = "", admitted: bool = True) -> Job:
    return Job(f"job-{n}", JobSpec(gpus=2, command=["x"]), "u", Q, 0.0, seq=n, state=state, am_container=am,
               admitted=admitted, submit_id=f"s{n}")


def test_records_come_back_with_their_gpus_and_each_job_has_an_am_or_waits_for_one() -> None:
    jobs: dict[str, Job] = {}
    submit_ids: dict[str, str] = {}
    index = ContainerIndex(lambda job_id: None)
    cluster = Cluster()
    am = Container("job-1-am1", "job-1", ContainerKind.AM, "n1", [], 1, 0.0, phase=ContainerPhase.RUNNING)
    learner = Container("job-1-c1", "job-1", ContainerKind.LEARNER, "n1", [0, 1], 1, 1.0,
                        phase=ContainerPhase.RUNNING)
    ended = Container("job-2-c2", "job-2", ContainerKind.LEARNER, "n1", [2, 3], 1, 1.0,
                      phase=ContainerPhase.COMPLETED)
    stale = Node("n1", "h", 1, "r1", "r1", {i: GpuRecord(i) for i in range(4)}, session="old",
                 allocated={3: "gone"})
    recovery.load([job(1, am="job-1-am1"), job(2, am="job-2-am1"), job(3, JobState.SUCCEEDED)],
                  [am, learner, ended], [stale], 50.0, jobs, submit_ids, index, cluster)
    node = cluster.nodes["n1"]
    assert node.allocated == {0: "job-1-c1", 1: "job-1-c1"}
    assert (node.session, node.last_heartbeat) == ("", 50.0)
    assert submit_ids == {"s1": "job-1", "s2": "job-2", "s3": "job-3"}

    book = QueueBook(default_tree())
    ams = AMLauncher(cluster, book, jobs, index.live_ams, 10, 10, lambda j, n, now: None)
    recovery.readmit(jobs, index.live, ams, ams.up)
    assert list(ams.with_am) == ["job-1"]
    assert jobs["job-2"].am_container == "" and ams.needs_am[Q].first() == (0, 2, "job-2")   # a restart first

    recovery.rebuild_queue_book(book, jobs, index.containers)
    assert book.used.get(Q) == 2 and book.jobs_active.get(Q) == 2


def test_counters_default_to_one() -> None:
    assert recovery.counters({}) == (1, 1)
    assert recovery.counters({"next_job_seq": "7", "next_container_seq": "9"}) == (7, 9)
