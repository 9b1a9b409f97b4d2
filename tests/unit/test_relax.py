"""Relax by expected cost (am/relax.py), pure, and the AM using it on a fake clock."""

from __future__ import annotations

import math
import random

from gpurm.am.master import Master, Phase
from gpurm.am.placement import ServerView, View
from gpurm.am.relax import SLOWDOWN, CostRelax, FreeRate, expected_wait_s, missing_gpus
from gpurm.rm.jobspec import JobSpec, Locality, LocalityLevel

P, R, A = LocalityLevel.PACKED, LocalityLevel.RACK, LocalityLevel.ANY


def srv(node: str, rack: str, free: int, total: int = 8) -> ServerView:
    return ServerView(node, rack, total, tuple(range(total - free, total)))


def test_the_table_is_philly_s_measurement() -> None:
    assert SLOWDOWN[A] == round(43.66 / 28.56, 2) and SLOWDOWN[LocalityLevel.NODE] == SLOWDOWN[P] == 1.0
    assert SLOWDOWN[P] < SLOWDOWN[R] < SLOWDOWN[A]


def test_free_rate_counts_gpus_coming_free_over_its_window() -> None:
    rate = FreeRate(window_s=100)
    busy = View([srv("a", "r1", 0), srv("b", "r1", 0)])
    rate.observe(View([]), busy, 0.0)
    assert not rate.trusted and rate.rate() == 0
    rate.observe(busy, View([srv("a", "r1", 4), srv("b", "r1", 0)]), 50.0)
    rate.observe(View([srv("a", "r1", 4), srv("b", "r1", 0)]), View([srv("a", "r1", 0), srv("b", "r1", 2)]), 100.0)
    assert rate.trusted and rate.rate() == (4 + 2) / 100          # a server filling up again frees nothing
    rate.observe(busy, busy, 180.0)
    assert rate.rate() == 2 / 100                                  # the first free left the window


def test_missing_gpus_and_expected_wait() -> None:
    view = View([srv("a", "r1", 3), srv("b", "r1", 2), srv("c", "r2", 4)])
    assert missing_gpus(view, 8, LocalityLevel.NODE) == 4
    assert missing_gpus(view, 8, P) == 3 and missing_gpus(view, 8, A) == 0
    assert expected_wait_s(3, 0.1) == 30 and expected_wait_s(0, 0.0) == 0 and expected_wait_s(1, 0.0) == math.inf


def test_the_deadline_is_the_saving_less_the_expected_remaining_wait() -> None:
    policy = CostRelax(expected_runtime_s=3600)
    saving = policy.saving_s(P, R)
    assert math.isclose(saving, 3600 * (SLOWDOWN[R] - 1.0))
    view = View([srv("a", "r1", 4), srv("b", "r1", 4)])          # 16 GPUs packed: 8 missing
    assert math.isclose(policy.deadline(P, R, 100.0, view, 16, rate=0.1), 100.0 + saving - 80.0)
    assert policy.deadline(P, R, 100.0, view, 16, rate=0.0) == 100.0          # will never fill: relax now
    assert CostRelax(3600, sensitivity=0.0).deadline(P, R, 100.0, view, 16, 1.0) == 100.0


BUSY = [srv("a", "r1", 4), srv("b", "r1", 4), srv("c", "r2", 2)]


def watched_master(relax: CostRelax | None, timeout: float = 60) -> Master:
    """A 16-GPU job at packed on a busy rack, made after a 10-minute window in which 4 GPUs came free each minute
    (and were taken again): 0.0667 GPUs/s, so the 8 missing GPUs are 2 minutes away."""
    rate = FreeRate()
    before = View(BUSY)
    rate.observe(View([]), before, 0.0)
    for minute in range(1, 11):
        freed = View([srv("a", "r1", 8), srv("b", "r1", 4), srv("c", "r2", 2)])
        rate.observe(before, freed, minute * 60.0 - 1)
        rate.observe(freed, before, minute * 60.0)
    job = JobSpec(gpus=16, command=["x"], locality=Locality(timeout_s=timeout))
    m = Master(job, 600.0, rng=random.Random(1), relax=relax)
    m.frees = rate
    m.on_view(BUSY, 600.0)
    return m


def test_a_long_sensitive_job_waits_past_the_timeout_when_frees_come_often() -> None:
    m = watched_master(CostRelax(expected_runtime_s=10 * 3600), timeout=60)
    assert m.level is P and m.frees.trusted
    deadline = m.next_deadline()
    saving = 10 * 3600 * (SLOWDOWN[R] - 1.0)
    assert deadline is not None and math.isclose(deadline, 600.0 + saving - 8 / (40 / 600))
    assert deadline > m.level_since + 60 * 10
    m.step(m.level_since + 600)
    assert m.level is P and m.phase is Phase.PLANNING


def test_a_short_job_relaxes_before_the_timeout() -> None:
    m = watched_master(CostRelax(expected_runtime_s=60), timeout=600)
    deadline = m.next_deadline()
    assert deadline is not None and deadline < m.level_since + 600
    m.step(deadline)
    assert m.phase is Phase.BACKOFF


def test_without_a_policy_or_history_the_timeout_rules() -> None:
    m = watched_master(None, timeout=60)
    assert m.next_deadline() == m.level_since + 60
    job = JobSpec(gpus=16, command=["x"], locality=Locality(timeout_s=60))
    fresh = Master(job, 0.0, rng=random.Random(1), relax=CostRelax(expected_runtime_s=10 * 3600))
    fresh.on_view([srv("a", "r1", 4), srv("b", "r1", 4)], 0.0)
    assert fresh.next_deadline() == 60.0                           # no history yet: not trusted
