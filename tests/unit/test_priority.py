"""Priorities inside a queue: Tiresias 2D-LAS levels and starvation guard, srtf, in-queue preemption."""

from __future__ import annotations

from gpurm.queues.tree import Policy
from gpurm.rm.priority import Standing, in_queue_victims, las_level, rank


def st(job: str, seq: int, gpus: int = 4, attained: float = 0.0, executed: float = 0.0, waiting_since: float = 0.0,
       remaining: float = 0.0, running_since: float = -1.0) -> Standing:
    return Standing(job, seq, gpus, attained, executed, waiting_since, remaining, running_since)


def test_las_levels() -> None:
    assert [las_level(x) for x in (0, 3599, 3600, 35999, 36000, 1e9)] == [0, 0, 1, 1, 2, 3]


def test_las_orders_by_level_then_submit_order() -> None:
    key = rank(Policy.LAS, now=100.0)
    jobs = [st("a", 1, attained=5000, executed=100, waiting_since=99), st("b", 2, attained=10), st("c", 3)]
    assert [j.job_id for j in sorted(jobs, key=key)] == ["b", "c", "a"]


def test_a_starved_job_is_promoted_to_the_top_level() -> None:
    # "a" ran 100 s (level 1) and has waited 900 s > 8 x 100 s: promoted ahead of the level-0 job "c".
    key = rank(Policy.LAS, now=1000.0)
    jobs = [st("c", 3), st("a", 1, attained=5000, executed=100, waiting_since=100)]
    assert [j.job_id for j in sorted(jobs, key=key)] == ["a", "c"]


def test_srtf_orders_by_remaining_gpu_time() -> None:
    key = rank(Policy.SRTF, now=0.0)
    jobs = [st("a", 1, remaining=900), st("b", 2, remaining=100)]
    assert [j.job_id for j in sorted(jobs, key=key)] == ["b", "a"]


def test_in_queue_victims_lowest_ranked_first_and_only_when_outranked() -> None:
    running = [st("old", 1, 4, attained=50000, executed=5000, running_since=0),      # level 2
               st("mid", 2, 4, attained=5000, executed=1000, running_since=0),       # level 1
               st("new", 5, 4, attained=10, executed=5, running_since=200)]          # level 0, young
    waiting = [st("w", 6, 8)]                                                        # level 0
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running, idle_gpus=0, min_run_s=60) == \
        [("old", "w"), ("mid", "w")]
    # enough idle GPUs: nobody is preempted
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running, idle_gpus=8, min_run_s=60) == []
    # the same level does not preempt (ties go to submit order inside a level)
    assert in_queue_victims(Policy.LAS, 300.0, [st("w2", 9, 4, attained=5000, executed=10, waiting_since=299)],
                            running[1:2], idle_gpus=0, min_run_s=60) == []


def test_no_victims_if_the_waiting_job_cannot_be_made_to_fit() -> None:
    running = [st("r", 1, 4, attained=50000, executed=5000, running_since=0)]
    assert in_queue_victims(Policy.LAS, 300.0, [st("w", 2, 16)], running, idle_gpus=4, min_run_s=60) == []


def test_young_jobs_are_not_preempted() -> None:
    running = [st("r", 1, 4, attained=50000, executed=5000, running_since=280)]
    assert in_queue_victims(Policy.LAS, 300.0, [st("w", 2, 4)], running, idle_gpus=0, min_run_s=60) == []
