"""`gpurm sim --relax`: the same job under the four ways an AM may trade waiting for locality against spread."""

from __future__ import annotations

from gpurm.queues.tree import Policy
from gpurm.sim.engine import RelaxPolicy
from gpurm.sim.metrics import JobResult
from tests.unit.test_sim_runtime import by_id, simulate, trace_of

# Two 4-GPU servers. A (2 GPUs) and C (3 GPUs), 1,000 s each, take one server each; B (3 GPUs, 100 s) then finds
# 3 free GPUs, but only spread over both servers; at 1,000 a whole server is free again.
JOBS = (("A", 0.0, 2, 1000.0, 1.0), ("C", 0.0, 3, 1000.0, 1.0), ("B", 10.0, 3, 100.0, 1.0))


def b_under(relax: RelaxPolicy) -> JobResult:
    result = simulate(trace_of(*JOBS), "1x2x4", config=None, policy=Policy.FIFO, relax=relax)
    jobs = by_id(result)
    assert jobs["A"].servers == 1 == jobs["C"].servers
    return jobs["B"]


def test_immediate_starts_spread_at_once() -> None:
    b = b_under(RelaxPolicy.IMMEDIATE)
    assert b.start_s == 10.0 and b.servers == 2


def test_never_waits_for_a_whole_server() -> None:
    b = b_under(RelaxPolicy.NEVER)
    assert b.start_s is not None and b.start_s >= 1000.0 and b.servers == 1


def test_timeout_never_splits_a_job_that_fits_on_one_server() -> None:
    # The AM's default (timeout) rule relaxes one level per timeout, but a multi-GPU job that fits on one server is
    # not split across servers (am/levels.py, keeps_one_server): B waits for a whole server, as under never.
    b = b_under(RelaxPolicy.TIMEOUT)
    assert b.start_s is not None and b.start_s >= 1000.0 and b.servers == 1


def test_cost_spreads_a_short_job_rather_than_wait_for_the_long_ones() -> None:
    # B's 100 s can never save the ~990 s it would wait for a whole server: it spreads, no later than the timeout.
    b = b_under(RelaxPolicy.COST)
    assert b.start_s is not None and b.start_s < 1000.0 and b.servers == 2
