"""Tiresias' 2D-Gittins index (rm/sched/gittins.py) and the `gittins` policy's ranks: known small distributions."""

from __future__ import annotations

import pytest

from gpurm.queues.tree import Policy
from gpurm.rm.sched import gittins
from gpurm.rm.sched.gittins import EDGES, bucket, index_table, next_edge
from gpurm.rm.sched.history import Features, Finished, History
from gpurm.rm.sched.priority import Room, Standing, in_queue_victims, rank, rank_changes_at, waiting_rank


def test_buckets_double_from_one_gpu_minute() -> None:
    assert EDGES[:5] == (0.0, 60.0, 120.0, 240.0, 480.0)
    assert [bucket(x) for x in (0, 59.9, 60, 119, 120, 479, 480)] == [0, 0, 1, 1, 2, 3, 4]
    assert next_edge(0) == 60.0 and next_edge(130) == 240.0


def test_two_point_distribution() -> None:
    # Half the jobs take 60 GPU-s, half 480. At 0, a quantum of 60 finishes half of them for an expected 60 GPU-s
    # spent: 0.5 / 60; a quantum of 480 finishes all for an expected 0.5 x 60 + 0.5 x 480 = 270: 1 / 270. Best: 1/120.
    table = index_table([60.0] * 5 + [480.0] * 5)
    assert table[0] == pytest.approx(1 / 120)
    # Past 60 only the 480s are left: certain to finish within 420 more, so the index is 1 / 420 at the 60 edge ...
    assert table[1] == pytest.approx(1 / 420)
    # ... and it grows as they near their end (at 240: 1 / 240); past every known size it is 0.
    assert table[3] == pytest.approx(1 / 240)
    assert table[4] == 0.0


def test_a_job_that_outlived_the_short_ones_ranks_below_a_new_one() -> None:
    # Mostly short jobs (60) and a few long (7680): a new job is likely short, one past 60 is surely long.
    table = index_table([60.0] * 9 + [7680.0])
    assert table[0] > table[1]


def test_the_table_waits_for_enough_finished_jobs_and_rebuilds_on_growth() -> None:
    g = History("none")
    for _ in range(gittins.MIN_FINISHED - 1):
        assert not g.finished(Finished(size_gpu_s=100.0))
    assert not g.ready
    assert g.finished(Finished(size_gpu_s=100.0)) and g.ready and g.version == 1
    built = len(g.sizes())
    grown = int(built * gittins.REBUILD_GROWTH)
    assert not any(g.finished(Finished(size_gpu_s=100.0)) for _ in range(grown - 1))   # < 10% more: the table stays
    assert g.finished(Finished(size_gpu_s=100.0)) and g.version == 2


def st(job: str, seq: int, gpus: int = 1, attained: float = 0.0, running_since: float = -1.0,
       waiting_since: float = 0.0) -> Standing:
    return Standing(job, seq, gpus, attained, attained / gpus, waiting_since, 0.0, running_since)


def learned(sizes: list[float]) -> History:
    g = History("none")
    for s in sizes * (gittins.MIN_FINISHED // len(sizes) + 1):
        g.finished(Finished(size_gpu_s=s))
    return g


def test_gittins_ranks_as_las_until_ready_then_by_level_then_index() -> None:
    jobs = [st("long", 1, attained=100.0), st("new", 2)]
    assert rank(Policy.GITTINS, 0.0, gittins=History())(jobs[0]) == rank(Policy.LAS, 0.0)(jobs[0])
    # Sizes 60 or 480: a job at 100 (surely a 480 one) has index 1/420 < a new job's 1/120: inside las level 0,
    # the new one first.
    key = rank(Policy.GITTINS, 0.0, gittins=learned([60.0, 480.0]))
    assert [s.job_id for s in sorted(jobs, key=key)] == ["new", "long"]
    # Where the index is not monotone the two part: a job at 300 (a 480 one near its end, index 1/240) goes before
    # the one at 100 (1/420) under gittins; las, least attained first inside a level, has it the other way round.
    near = st("near", 3, attained=300.0)
    assert [s.job_id for s in sorted([jobs[0], near], key=key)] == ["near", "long"]
    assert [s.job_id for s in sorted([jobs[0], near], key=rank(Policy.LAS, 0.0))] == ["long", "near"]
    # The las level comes first: past the first threshold (3,600 GPU-s) a job ranks after every level-0 job,
    # whatever its index.
    past = st("past", 3, attained=4000.0)
    assert sorted([past, *jobs], key=key)[-1] is past
    # The rank in-queue preemption weighs moves only at the las thresholds: a running job at 100 GPU-s on 2 GPUs
    # reaches 3,600 in 1,750 s (not at the index's next bucket edge, 120 GPU-s).
    running = st("r", 3, gpus=2, attained=100.0, running_since=0.0)
    assert rank_changes_at(Policy.GITTINS, running, 50.0, gittins=learned([60.0, 480.0])) == pytest.approx(1800.0)


def test_a_starved_job_is_promoted_under_gittins_too() -> None:
    s = st("old", 1, attained=100.0, waiting_since=0.0)
    g = learned([60.0, 480.0])
    _, starve_at = waiting_rank(Policy.GITTINS, s, gittins=g)
    assert starve_at == pytest.approx(8 * 100.0)
    # Level 0, and first inside it: ahead of a new job with the best index.
    key = rank(Policy.GITTINS, 1000.0, gittins=g)
    assert key(s)[0] == 0.0 and key(s) < key(st("new", 2))


def test_gittins_does_not_preempt_inside_a_las_level() -> None:
    # Sizes 60 or 480. A job past 240 GPU-s (sure to be a 480 one) has index 1/240, a new job 1/120: the new job
    # runs first when both wait, but does not take a running job's GPUs over it: both are at las level 0. (Weighing
    # the index made the Philly window thrash: 149k preemptions, each losing the work since a checkpoint.)
    g = learned([60.0, 480.0])
    running = [st("long", 1, gpus=4, attained=400.0, running_since=0.0)]
    waiting = [st("new", 2, gpus=4)]
    args = (500.0, waiting, running, [Room("n0", "r0", 4, 0)], {"long": {"n0": 4}})
    assert in_queue_victims(Policy.GITTINS, *args, min_run_s=60, gittins=g) == []
    assert in_queue_victims(Policy.LAS, *args, min_run_s=60) == []


def test_gittins_preempts_across_levels_the_lowest_index_first() -> None:
    # Sizes 60, 5,000 and 20,000 GPU-s. Both running jobs are past the first las threshold (level 1); the one at
    # 8,000 (surely a 20,000 one) has a lower index than the one at 4,000 (maybe a 5,000 one): a new job needing
    # one server's room takes the 8,000 one's.
    g = learned([60.0, 5000.0, 20000.0])
    assert g.index(Features(), 8000.0) < g.index(Features(), 4000.0)
    running = [st("near", 1, gpus=4, attained=4000.0, running_since=0.0),
               st("far", 2, gpus=4, attained=8000.0, running_since=0.0)]
    waiting = [st("new", 3, gpus=4)]
    rooms = [Room("n0", "r0", 4, 0), Room("n1", "r0", 4, 0)]
    held = {"near": {"n0": 4}, "far": {"n1": 4}}
    assert in_queue_victims(Policy.GITTINS, 500.0, waiting, running, rooms, held, min_run_s=60,
                            gittins=g) == [("far", "new")]
