"""Standings (rm/sched/standing.py) on their own: a job's las / srtf standing from its live learners, and the caches the
core drops when learners change."""

from __future__ import annotations

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Container, ContainerKind, Job
from gpurm.queues.tree import Policy
from gpurm.rm.sched import priority
from gpurm.rm.sched.standing import Standings


def job(gpus: int = 2, **kw: float) -> Job:
    return Job(job_id="job-1", spec=JobSpec(gpus=gpus, command=["x"]), user="u", queue="root.default",
               submit_time=0.0, seq=1, **kw)  # type: ignore[arg-type]


def learner(cid: str, gpus: int, started: float) -> Container:
    return Container(container_id=cid, job_id="job-1", kind=ContainerKind.LEARNER, node_id="n1",
                     gpu_indices=list(range(gpus)), attempt=1, created=0.0, started=started)


def test_a_job_running_nothing_stands_still_and_is_shared() -> None:
    s = Standings({})
    j = job(attained_gpu_s=100.0, idle_since=5.0, expected_gpu_s=400.0)
    first = s.standing(j, 10.0)
    assert (first.attained_gpu_s, first.executed_s, first.remaining_gpu_s, first.running_since) == \
        (100.0, 50.0, 300.0, -1.0)
    assert s.standing(j, 99.0) is first               # the clock changes nothing
    j.attained_gpu_s = 120.0                          # its service does: a new one
    assert s.standing(j, 99.0).attained_gpu_s == 120.0


def test_running_learners_add_service_with_the_clock_until_runs_change() -> None:
    live: dict[str, dict[str, Container]] = {"job-1": {"c1": learner("c1", 2, 10.0)}}
    s = Standings(live)
    j = job(las_base_gpu_s=0.0)
    assert (s.standing(j, 20.0).attained_gpu_s, s.standing(j, 20.0).running_since) == (20.0, 10.0)
    live["job-1"]["c2"] = learner("c2", 2, 30.0)
    assert s.standing(j, 40.0).attained_gpu_s == 60.0     # cached runs: c2 not seen yet
    s.runs_changed("job-1")
    assert s.standing(j, 40.0).attained_gpu_s == 80.0


def test_a_las_promotion_counts_service_from_its_base() -> None:
    s = Standings({})
    j = job(attained_gpu_s=5000.0, las_base_gpu_s=4000.0)
    assert s.standing(j, 0.0).attained_gpu_s == 1000.0


def test_waiting_rank_is_cached_per_policy_and_dropped_with_the_runs() -> None:
    s = Standings({})
    j = job(idle_since=0.0)
    st, key, starve_at = s.waiting_rank(j, Policy.LAS)
    assert (key, starve_at) == priority.waiting_rank(Policy.LAS, st)
    assert s.waiting_rank(j, Policy.LAS)[0] is st
    j.attained_gpu_s = 10_000.0
    assert s.waiting_rank(j, Policy.LAS)[0] is st          # cached until its runs change
    s.runs_changed("job-1")
    assert s.waiting_rank(j, Policy.LAS)[0].attained_gpu_s == 10_000.0


def test_running_rank_of_a_job_that_started_nothing_and_of_one_that_runs() -> None:
    live: dict[str, dict[str, Container]] = {}
    s = Standings(live)
    j = job()
    assert s.running_rank(j, Policy.LAS, 5.0) == ((0.0, 0.0), float("inf"), -1.0)
    live["job-1"] = {"c1": learner("c1", 2, 10.0)}
    s.runs_changed("job-1")
    rank, changes_at, since = s.running_rank(j, Policy.LAS, 20.0)
    assert since == 10.0 and changes_at > 20.0
    assert s.running_rank(j, Policy.LAS, 21.0) == (rank, changes_at, since)   # cached until changes_at
    s.forget("job-1")
    s.runs_changed("job-1")
    assert s.running_rank(j, Policy.LAS, 21.0)[2] == 10.0
