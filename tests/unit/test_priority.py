"""Priorities inside a queue: Tiresias 2D-LAS levels and starvation guard, srtf, in-queue preemption."""

from __future__ import annotations

from gpurm.queues.tree import Policy
from gpurm.rm.sched.priority import Room, Standing, in_queue_victims, las_level, las_promoted, rank


def st(job: str, seq: int, gpus: int = 4, attained: float = 0.0, executed: float = 0.0, waiting_since: float = 0.0,
       remaining: float = 0.0, running_since: float = -1.0) -> Standing:
    return Standing(job, seq, gpus, attained, executed, waiting_since, remaining, running_since)


def test_las_levels() -> None:
    assert [las_level(x) for x in (0, 3599, 3600, 35999, 36000, 1e9)] == [0, 0, 1, 1, 2, 3]


def test_las_orders_by_level_then_least_attained_then_submit_order() -> None:
    key = rank(Policy.LAS, now=5.0)          # before any of them has waited long enough to count as starved
    jobs = [st("a", 1, attained=5000, executed=100, waiting_since=4), st("b", 2, attained=10, executed=3),
            st("c", 3), st("d", 4)]
    # Level 0 before level 1; inside level 0 the least served first (c and d: none), then submit order.
    assert [j.job_id for j in sorted(jobs, key=key)] == ["c", "d", "b", "a"]


def test_attained_service_inside_a_level_orders_but_never_preempts() -> None:
    running = [st("r", 2, 4, attained=3000, executed=750, running_since=0)]            # level 0, well served
    waiting = [st("w", 1, 4, attained=0, waiting_since=299)]                           # level 0, none yet
    assert rank(Policy.LAS, 300.0)(waiting[0]) < rank(Policy.LAS, 300.0)(running[0])
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running, rooms(0), {"r": {"n0": 4}}, min_run_s=60) == []


def test_a_starved_job_is_promoted_to_the_top_level() -> None:
    # "a" ran 100 s (level 1) and has waited 900 s > 8 x 100 s: promoted ahead of the level-0 job "c".
    key = rank(Policy.LAS, now=1000.0)
    jobs = [st("c", 3), st("a", 1, attained=5000, executed=100, waiting_since=100)]
    assert [j.job_id for j in sorted(jobs, key=key)] == ["a", "c"]


def test_srtf_orders_by_remaining_gpu_time() -> None:
    key = rank(Policy.SRTF, now=0.0)
    jobs = [st("a", 1, remaining=900), st("b", 2, remaining=100)]
    assert [j.job_id for j in sorted(jobs, key=key)] == ["b", "a"]


def rooms(*free: int, size: int = 4, domain: str = "r0") -> list[Room]:
    return [Room(f"n{i}", domain, size, f) for i, f in enumerate(free)]


def test_in_queue_victims_lowest_ranked_first_and_only_when_outranked() -> None:
    # Three 4-GPU servers, one job on each; w (8 GPUs) needs two servers: the two lowest-ranked jobs go.
    running = [st("old", 1, 4, attained=50000, executed=5000, running_since=0),      # level 2
               st("mid", 2, 4, attained=5000, executed=1000, running_since=0),       # level 1
               st("new", 5, 4, attained=10, executed=5, running_since=200)]          # level 0, young
    held = {"old": {"n0": 4}, "mid": {"n1": 4}, "new": {"n2": 4}}
    waiting = [st("w", 6, 8)]                                                        # level 0
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running, rooms(0, 0, 0), held, min_run_s=60) == \
        [("old", "w"), ("mid", "w")]
    # enough idle GPUs: nobody is preempted, and w is named among those the idle GPUs can take
    fits: list[str] = []
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running, rooms(0, 0, 0, 4, 4), held, min_run_s=60,
                            fits_idle=fits) == []
    assert fits == ["w"]


def test_the_same_level_does_not_preempt_whatever_the_submit_order() -> None:
    running = [st("mid", 2, 4, attained=5000, executed=1000, running_since=0)]       # level 1
    waiting = [st("w", 1, 4, attained=4000, executed=10, waiting_since=299)]         # level 1, submitted earlier
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running, rooms(0), {"mid": {"n0": 4}}, min_run_s=60) == []


def test_victims_are_only_taken_where_they_make_room_on_the_fewest_servers() -> None:
    # Two 8-GPU servers, each half taken by a level-2 job and half by a level-0 one. Preempting both level-2
    # jobs would free 8 GPUs, but on two servers: an 8-GPU job fits on one, so nobody is preempted.
    hog = dict(attained=50000, executed=5000, running_since=0)
    running = [st("a", 1, 4, **hog), st("b", 2, 4, **hog),                            # type: ignore[arg-type]
               st("x", 3, 4, running_since=0), st("y", 4, 4, running_since=0)]
    held = {"a": {"n0": 4}, "b": {"n1": 4}, "x": {"n0": 4}, "y": {"n1": 4}}
    waiting = [st("w", 9, 8)]
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running, rooms(0, 0, size=8), held, min_run_s=60) == []
    # With 4 GPUs idle beside "b" (the rest of n0 is another queue's), preempting "b" alone makes a whole
    # server: "a" is spared.
    running2 = [st("a", 1, 4, **hog), st("b", 2, 4, **hog)]                           # type: ignore[arg-type]
    assert in_queue_victims(Policy.LAS, 300.0, waiting, running2, [Room("n0", "r0", 8, 0), Room("n1", "r0", 8, 4)],
                            {"a": {"n0": 4}, "b": {"n1": 4}}, min_run_s=60) == [("b", "w")]


def test_a_multi_server_job_is_made_room_for_inside_one_domain() -> None:
    # 16 GPUs on 8-GPU servers: two servers in one rack. Rack r0 would need both hogs preempted, rack r1 one.
    hog = dict(attained=50000, executed=5000, running_since=0)
    running = [st("a", 1, 8, **hog), st("b", 2, 8, **hog), st("c", 3, 8, **hog)]     # type: ignore[arg-type]
    servers = [Room("n0", "r0", 8, 0), Room("n1", "r0", 8, 0), Room("n2", "r1", 8, 8), Room("n3", "r1", 8, 0)]
    held = {"a": {"n0": 8}, "b": {"n1": 8}, "c": {"n3": 8}}
    assert in_queue_victims(Policy.LAS, 300.0, [st("w", 9, 16)], running, servers, held, min_run_s=60) == \
        [("c", "w")]
    # 16 idle GPUs, if in two racks: nobody is preempted (its AM relaxes locality in time).
    servers[0] = Room("n0", "r0", 8, 8)
    assert in_queue_victims(Policy.LAS, 300.0, [st("w", 9, 16)], running[1:], servers, held, min_run_s=60) == []


def test_no_victims_if_the_waiting_job_cannot_be_made_to_fit() -> None:
    running = [st("r", 1, 4, attained=50000, executed=5000, running_since=0)]
    assert in_queue_victims(Policy.LAS, 300.0, [st("w", 2, 16)], running, rooms(4, 0), {"r": {"n1": 4}},
                            min_run_s=60) == []


def test_young_jobs_are_not_preempted() -> None:
    running = [st("r", 1, 4, attained=50000, executed=5000, running_since=280)]
    assert in_queue_victims(Policy.LAS, 300.0, [st("w", 2, 4)], running, rooms(0), {"r": {"n0": 4}},
                            min_run_s=60) == []


def test_srtf_preempts_the_job_with_the_most_left_for_a_shorter_one() -> None:
    running = [st("long", 1, 4, remaining=90000, running_since=0), st("short", 2, 4, remaining=500, running_since=0)]
    held = {"long": {"n0": 4}, "short": {"n1": 4}}
    assert in_queue_victims(Policy.SRTF, 300.0, [st("w", 3, 4, remaining=1000)], running, rooms(0, 0), held,
                            min_run_s=60) == [("long", "w")]


def test_a_starved_job_is_promoted_and_a_job_at_level_0_is_not() -> None:
    # 1 GPU, served 4,000 GPU-s (level 1), stopped at 10,000: starved once it has waited 8 x 4,000 s.
    assert not las_promoted(10_000 + 32_000, 10_000, 4000, 1)
    assert las_promoted(10_000 + 32_001, 10_000, 4000, 1)
    assert not las_promoted(10_000 + 1e9, 10_000, 3000, 1)          # still level 0: nothing to promote from
    assert not las_promoted(10_000 + 31_000, 10_000, 8000, 2)       # 2 GPUs: it ran 4,000 s, waited 31,000


def test_victims_are_chosen_where_the_beneficiarys_am_can_take_them() -> None:
    # Two 4-GPU servers in two racks, a level-2 job on each; w needs 8. Packed: no rack holds 8, so nobody goes.
    # Once its AM is at `any`, both go.
    hog = dict(attained=50000, executed=5000, running_since=0)
    running = [st("a", 1, 4, **hog), st("b", 2, 4, **hog)]                             # type: ignore[arg-type]
    servers = [Room("n0", "r0", 4, 0), Room("n1", "r1", 4, 0)]
    held = {"a": {"n0": 4}, "b": {"n1": 4}}
    w = [st("w", 9, 8)]
    assert in_queue_victims(Policy.LAS, 300.0, w, running, servers, held, 60, {"w": "packed"}) == []
    assert in_queue_victims(Policy.LAS, 300.0, w, running, servers, held, 60, {"w": "rack"}) == []
    assert in_queue_victims(Policy.LAS, 300.0, w, running, servers, held, 60, {"w": "any"}) == \
        [("b", "w"), ("a", "w")]                                                      # lowest-ranked first


def test_las_thresholds_are_a_parameter() -> None:
    # rm.yaml `preemption.las_thresholds`: a 100 GPU-second first level makes a 120 GPU-second job level 1 ...
    small = (100.0, 1000.0)
    assert [las_level(x, small) for x in (0, 99, 100, 999, 1000)] == [0, 0, 1, 1, 2]
    running = [st("long", 1, 4, attained=120, executed=30, running_since=0)]
    waiting = [st("new", 2, 4)]
    held = {"long": {"n0": 4}}
    assert in_queue_victims(Policy.LAS, 60.0, waiting, running, rooms(0), held, min_run_s=10,
                            thresholds=small) == [("long", "new")]
    # ... which the default thresholds (1 GPU-hour) leave at level 0 with the newcomer: no preemption
    assert in_queue_victims(Policy.LAS, 60.0, waiting, running, rooms(0), held, min_run_s=10) == []
