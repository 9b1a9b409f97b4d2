"""The shell's read-only views (rm/state/views.py) on their own."""

from __future__ import annotations

import pytest

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Attempt, Container, ContainerKind, Job, JobState, Learner
from gpurm.queues.config import parse_queues
from gpurm.rm.sched.scheduler import App
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.cluster import Cluster
from gpurm.rm.state.messages import AppState, ErrorCode, RequestError
from gpurm.rm.state.queuebook import QueueBook
from gpurm.rm.state.views import list_jobs, log_container, queue_stats, why_waiting

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


def test_log_container_names_the_am_or_a_learner_and_says_what_exists_instead() -> None:
    j = job(9, "a", JobState.RUNNING)
    j.am_attempt = 2
    am2 = Container("job-9-am2", "job-9", ContainerKind.AM, "n3", [], 2, 0.0)
    containers = {am2.container_id: am2}
    assert log_container(containers, j, True, 0, 0) == ("job-9-am2", "n3")
    with pytest.raises(RequestError, match="no AM attempt 1") as e:
        log_container(containers, j, True, 1, 0)
    assert e.value.code is ErrorCode.FAILED_PRECONDITION
    with pytest.raises(RequestError, match="has not started yet"):
        log_container(containers, j, False, 0, 0)
    j.attempts = [Attempt(1, learners=[Learner(0, "n1", [0], container_id="c-1-0")]),
                  Attempt(2, learners=[Learner(0, "n1", [0], container_id="c-2-0"),
                                       Learner(1, "n2", [0], container_id="c-2-1"), Learner(2, "n2", [1])])]
    assert log_container(containers, j, False, 0, 1) == ("c-2-1", "n2")          # the latest attempt
    assert log_container(containers, j, False, 1, 0) == ("c-1-0", "n1")
    with pytest.raises(RequestError, match="attempts 1-2, not 3") as e:
        log_container(containers, j, False, 3, 0)
    assert e.value.code is ErrorCode.INVALID_ARGUMENT
    with pytest.raises(RequestError, match="ranks 0-1, not 2"):                 # rank 2 has no container yet
        log_container(containers, j, False, 0, 2)
