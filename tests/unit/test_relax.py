"""Relax by expected cost (am/relax.py), pure, and the AM using it on a fake clock."""

from __future__ import annotations

import math
import random

from gpurm.am.master import Master, Phase
from gpurm.am.placement import ServerView, View
from gpurm.am.relax import TYPICAL, CostRelax, FreeRate, expected_wait_s, level_slowdown, missing_gpus
from gpurm.common.jobspec import JobSpec, Locality, LocalityLevel
from gpurm.sim.runtime import RuntimeConfig, rate

P, R, A = LocalityLevel.PACKED, LocalityLevel.RACK, LocalityLevel.ANY


def srv(node: str, rack: str, free: int, total: int = 8) -> ServerView:
    return ServerView(node, rack, total, tuple(range(total - free, total)))


def test_level_slowdowns_are_the_runtime_model_s() -> None:
    config = RuntimeConfig()
    assert level_slowdown(P, 16, 2, 1.0, config) == 1.0 == level_slowdown(LocalityLevel.NODE, 8, 1, 1.0, config)
    # rack: twice the fewest servers (4 for 16 GPUs), one rack, TYPICAL.neighbours multi-server neighbours.
    spread = rate(config, 1.0, 4, 2, 1, 1, 0)
    assert math.isclose(level_slowdown(R, 16, 2, 1.0, config),
                        (1 + config.contention_per_job * TYPICAL.neighbours) / spread)
    assert 1.0 < level_slowdown(R, 16, 2, 1.0, config) < level_slowdown(A, 16, 2, 1.0, config)
    assert level_slowdown(A, 16, 2, 0.0, config) == 1.0                       # an insensitive job does not care
    assert level_slowdown(A, 1, 1, 1.0, config) == 1.0                        # one GPU never spreads
    flat = RuntimeConfig(spread_exponent=0.0, rack_factor=1.0, contention_per_job=0.0)
    assert level_slowdown(A, 16, 2, 1.0, flat) == 1.0                         # the model's constants rule
    # A 2-GPU job spread takes 2 servers, not 4.
    assert math.isclose(level_slowdown(R, 2, 1, 1.0, config),
                        (1 + config.contention_per_job * TYPICAL.neighbours) / rate(config, 1.0, 2, 1, 1, 1, 0))


def test_the_saving_counts_what_spreading_costs_the_others() -> None:
    config = RuntimeConfig()
    mean = config.sensitive_share * config.sensitive_value
    own = level_slowdown(R, 16, 2, 1.0, config) - 1.0
    others = level_slowdown(R, 16, 2, mean, config) - 1.0
    assert math.isclose(CostRelax(3600, 1.0, others_weight=0.0).saving_s(P, R, 16, 2), 3600 * own)
    assert math.isclose(CostRelax(3600, 1.0, others_weight=2.0).saving_s(P, R, 16, 2), 3600 * (own + 2 * others))
    # An insensitive job loses nothing itself, but still slows its sensitive neighbours.
    assert CostRelax(3600, 0.0, others_weight=0.0).saving_s(P, R, 16, 2) == 0.0
    assert math.isclose(CostRelax(3600, 0.0, others_weight=2.0).saving_s(P, R, 16, 2), 3600 * 2 * others)


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


def test_the_deadline_is_the_saving_unless_told_to_trust_the_rate() -> None:
    view = View([srv("a", "r1", 4), srv("b", "r1", 4)])          # 16 GPUs packed: 8 missing
    watched = FreeRate(window_s=100)
    watched.observe(View([]), view, 0.0)
    watched.observe(view, view, 100.0)
    assert watched.trusted and watched.rate() == 0.0
    policy = CostRelax(expected_runtime_s=3600)
    saving = policy.saving_s(P, R, 16, 2)
    # By default, the ski-rental rule: wait as long as the level saves, whatever the rate seemed.
    assert math.isclose(policy.deadline(P, R, 100.0, view, 16, watched), 100.0 + saving)
    assert math.isclose(policy.deadline(P, R, 100.0, view, 16, FreeRate()), 100.0 + saving)
    # Trusting the rate: no GPUs came free in a whole window, so the level never fills: relax now ...
    with_rate = CostRelax(expected_runtime_s=3600, use_rate=True)
    assert with_rate.deadline(P, R, 100.0, view, 16, watched) == 100.0
    # ... 8 missing GPUs at 0.1 a second are 80 s away.
    watched.observe(View([srv("a", "r1", 0), srv("b", "r1", 0)]), View([srv("a", "r1", 8), srv("b", "r1", 2)]),
                    100.0)
    assert math.isclose(with_rate.deadline(P, R, 100.0, view, 16, watched), 100.0 + saving - 8 / 0.1)
    # A job that does not care, in a cluster where nobody else does either, saves nothing by waiting.
    careless = RuntimeConfig(sensitive_share=0.0)
    assert CostRelax(3600, sensitivity=0.0, config=careless).deadline(P, R, 100.0, view, 16, FreeRate()) == 100.0


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
    policy = CostRelax(expected_runtime_s=10 * 3600, use_rate=True)
    m = watched_master(policy, timeout=60)
    assert m.level is P and m.frees.trusted
    deadline = m.next_deadline()
    saving = policy.saving_s(P, R, 16, 2)
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


def test_without_a_policy_the_timeout_rules_and_a_fresh_cost_am_waits_the_saving() -> None:
    m = watched_master(None, timeout=60)
    assert m.next_deadline() == m.level_since + 60
    job = JobSpec(gpus=16, command=["x"], locality=Locality(timeout_s=60))
    policy = CostRelax(expected_runtime_s=10 * 3600)
    fresh = Master(job, 0.0, rng=random.Random(1), relax=policy)
    fresh.on_view([srv("a", "r1", 4), srv("b", "r1", 4)], 0.0)
    deadline = fresh.next_deadline()
    assert deadline is not None and math.isclose(deadline, policy.saving_s(P, R, 16, 2)) and deadline > 3600
    fresh.step(deadline - 1)
    assert fresh.level is P and fresh.phase is Phase.PLANNING
    fresh.step(deadline)
    assert fresh.phase is Phase.BACKOFF                            # waited what packing saves: relaxes
