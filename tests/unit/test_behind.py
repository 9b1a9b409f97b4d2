"""Who is starving (rm/sched/behind.py): a job's wait against the one-GPU jobs' recent queueing. Pure."""

from __future__ import annotations

from gpurm.rm.sched.behind import FLOOR_S, Behind


def test_the_bar_is_a_multiple_of_the_one_gpu_jobs_queueing_with_a_floor() -> None:
    b = Behind(behind=2.0)
    assert b.bar_s == 2 * FLOOR_S                  # nothing seen: the floor
    for _ in range(10):
        b.started(1, 100.0)
    assert b.bar_s == 2 * FLOOR_S                  # they queue less than the floor
    assert not b.starving(1199.0) and b.starving(1200.0)
    b2 = Behind(behind=2.0)
    for q in (1000.0, 3000.0):
        b2.started(1, q)
    assert b2.bar_s == 4000.0                      # the plain mean while few have started


def test_only_one_gpu_jobs_move_the_bar_and_it_follows_recent_ones() -> None:
    b = Behind(behind=2.0, recent=10)
    b.started(8, 1e6)                              # a big job's wait is what is measured, not the bar
    assert b.seen == 0
    for _ in range(10):
        b.started(1, 5000.0)
    assert b.mean_s == 5000.0
    for _ in range(50):                            # the load fell: the bar falls with it
        b.started(1, 1000.0)
    assert 1000.0 <= b.mean_s < 1100.0
