"""The shell's read-only views (rm/views.py) on their own."""

from __future__ import annotations

from gpurm.queues.config import parse_queues
from gpurm.rm.amlaunch import AMLauncher
from gpurm.rm.cluster import Cluster
from gpurm.rm.jobspec import JobSpec
from gpurm.rm.messages import AppState
from gpurm.rm.model import Job, JobState
from gpurm.rm.queuebook import QueueBook
from gpurm.rm.scheduler import App
from gpurm.rm.views import list_jobs, queue_stats, why_waiting

TREE = parse_queues("queues:\n  a: {}\n  b: {}\n")


def job(n: int, queue: str, state: JobState, user: str = "u") -> Job:
    return Job(f"job-{n}", JobSpec(gpus=1, command=["x"]), user, f"root.{queue}", 0.0, seq=n, state=state,
               waiting_reason="planning")


JOBS = {j.job_id: j for j in (job(2, "a", JobState.RUNNING), job(1, "a", JobState.QUEUED, "v"),
                              job(3, "b", JobState.SUCCEEDED), job(4, "b", JobState.ALLOCATING))}


def test_listing_filters_and_keeps_the_newest() -> None:
    assert [j.job_id for j in list_jobs(JOBS)] == ["job-1", "job-2", "job-3", "job-4"]
    assert [j.job_id for j in list_jobs(JOBS, queue="a")] == ["job-1", "job-2"]
    assert [j.job_id for j in list_jobs(JOBS, states=[JobState.RUNNING, JobState.SUCCEEDED])] == ["job-2", "job-3"]
    assert [j.job_id for j in list_jobs(JOBS, user="v")] == ["job-1"]
    assert [j.job_id for j in list_jobs(JOBS, limit=2)] == ["job-3", "job-4"]


def test_queue_stats_count_running_and_queued_up_the_tree() -> None:
    assert queue_stats(JOBS, TREE) == {"root": (1, 2), "root.a": (1, 1), "root.b": (0, 1)}


def test_why_a_job_waits() -> None:
    cluster, book = Cluster(), QueueBook(TREE)
    ams = AMLauncher(cluster, book, dict(JOBS), {}, 10, 10, lambda j, n, now: None)
    queued, allocating = JOBS["job-1"], JOBS["job-4"]
    assert "no node is up" in why_waiting(queued, ams, {})
    ams.up(allocating)
    state = AppState(App("job-4", "root.b", "u", 4), 1)
    assert why_waiting(allocating, ams, {"job-4": state}) == "planning"
    state.app.blocked = "queue b is at its max_gpus"
    assert why_waiting(allocating, ams, {"job-4": state}) == "planning; RM: queue b is at its max_gpus"
    assert why_waiting(JOBS["job-3"], ams, {}) == ""
