"""AM launching (rm/state/amlaunch.py) on its own: the waiting line per queue, the caps, the least loaded node; starting
an AM is a callback here."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Job, JobState
from gpurm.queues.config import parse_queues
from gpurm.queues.tree import default_tree
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.cluster import Cluster, Node, NodeState
from gpurm.rm.state.queuebook import QueueBook


class Rig:
    def __init__(self, nodes: int = 2, max_active: int = 100, per_queue: int = 100, queues: str = "") -> None:
        self.cluster = Cluster()
        for k in range(nodes):
            self.cluster.upsert(Node(f"n{k}", "h", 1, "r1", "r1", {0: GpuRecord(0)}))
        self.book = QueueBook(parse_queues(queues) if queues else default_tree())
        self.jobs: dict[str, Job] = {}
        self.live_ams: dict[str, dict[str, None]] = {}
        self.started: list[tuple[str, str]] = []
        self.ams = AMLauncher(self.cluster, self.book, self.jobs, self.live_ams, max_active, per_queue, self.start)

    def start(self, job: Job, node_id: str, now: float) -> None:     # what the core does, in short
        self.started.append((job.job_id, node_id))
        self.ams.drop(job)
        self.ams.up(job)
        if not job.admitted:
            job.admitted = True
            self.book.activate(job.queue, 1)
        self.live_ams.setdefault(node_id, {})[f"{job.job_id}-am"] = None

    def job(self, queue: str = "root.default") -> Job:
        seq = len(self.jobs) + 1
        j = Job(job_id=f"job-{seq}", spec=JobSpec(gpus=1, command=["x"]), user="u", queue=queue, submit_time=0.0,
                seq=seq)
        self.jobs[j.job_id] = j
        self.ams.want(j)
        return j


def test_ams_go_in_submit_order_to_the_least_loaded_node() -> None:
    rig = Rig(nodes=2)
    for _ in range(3):
        rig.job()
    rig.ams.launch(0.0)
    assert rig.started == [("job-1", "n0"), ("job-2", "n1"), ("job-3", "n0")]
    assert list(rig.ams.with_am) == ["job-1", "job-2", "job-3"]
    assert not any(rig.ams.needs_am.values())


def test_no_node_offering_starts_nothing_and_says_why() -> None:
    rig = Rig(nodes=1)
    rig.cluster.set_state("n0", NodeState.LOST)
    j = rig.job()
    rig.ams.launch(0.0)
    assert rig.started == []
    assert "no node is up" in rig.ams.queued_reason(j)


def test_the_cluster_wide_cap_holds_new_jobs_and_a_restart_goes_first() -> None:
    rig = Rig(nodes=1, max_active=1)
    a, b = rig.job(), rig.job()
    rig.ams.launch(0.0)
    assert rig.started == [("job-1", "n0")]
    assert "AM slot" in rig.ams.queued_reason(b)
    rig.ams.gone(a)                      # its AM ended: the admitted job wants another, ahead of b
    rig.ams.want(a)
    assert rig.ams.needs_am["root.default"].first() == (0, 1, "job-1")
    rig.ams.launch(1.0)
    assert [j for j, _ in rig.started] == ["job-1", "job-1", "job-2"]


def test_the_per_queue_cap_counts_only_jobs_still_acquiring() -> None:
    rig = Rig(nodes=1, per_queue=1)
    a, b = rig.job(), rig.job()
    rig.ams.launch(0.0)
    assert [j for j, _ in rig.started] == ["job-1"]
    assert "acquiring GPUs" in rig.ams.queued_reason(b)
    a.state = JobState.RUNNING           # running: no longer acquiring
    rig.ams.launch(1.0)
    assert [j for j, _ in rig.started] == ["job-1", "job-2"]


def test_max_running_jobs_holds_the_queue() -> None:
    rig = Rig(nodes=1, queues="queues:\n  a: {max_running_jobs: 1}\n")
    rig.job("root.a")
    b = rig.job("root.a")
    rig.ams.launch(0.0)
    assert [j for j, _ in rig.started] == ["job-1"]
    assert "max_running_jobs (1)" in rig.ams.running_limit(b)
    assert rig.ams.counts() == (1, {"root.a": 1})
