"""The simulator leaves an AM untimed while it is stuck at its last level (sim/waking.py `Waker.stuck`): its timers
would only drive it through plans that fail until GPUs come free, and a release wakes it anyway. The same
decisions as timing it, with fewer events; and under a policy that preempts by rank, nothing changes at all."""

from __future__ import annotations

from gpurm.queues.tree import Policy
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions, SimResult
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import Trace, TraceJob


def fragmented() -> Trace:
    """Three 8-GPU servers, each with 5 GPUs busy for hours: 9 GPUs free in all, never 8 on one server, so an
    8-GPU job (kept on one server) waits at `packed` until the first of them ends; then a stream of short 1-GPU
    jobs comes and goes (releases) meanwhile."""
    jobs = [TraceJob(f"big{k}", 0.0, 5, 10_000.0 + 5_000.0 * k, "q", line=k + 1) for k in range(3)]
    jobs.append(TraceJob("eight", 10.0, 8, 600.0, "q", line=4))
    jobs += [TraceJob(f"one{k}", 100.0 + 900.0 * k, 1, 300.0, "q", line=5 + k) for k in range(12)]
    return Trace(jobs, None, "test")


def replay(policy: Policy, time_stuck: bool = False, reservations: int = 0) -> SimResult:
    """With `time_stuck`, every idle AM timed and driven, as before Waker.stuck."""
    trace = fragmented()
    engine = Engine(trace, parse_cluster("1x3x8"), trace_tree(trace.queues()),
                    SimOptions(policy=policy, reservations=reservations))
    engine.waker.time_stuck = time_stuck
    return engine.run()


def outcome(result: SimResult) -> list[tuple[str, float | None, float | None, int]]:
    return sorted((r.job_id, r.start_s, r.finish_s, r.preemptions) for r in result.results)


def test_a_stuck_am_gets_no_timer_and_nothing_else_changes() -> None:
    untimed = replay(Policy.FIFO)
    before = replay(Policy.FIFO, time_stuck=True)
    assert outcome(untimed) == outcome(before)
    eight = next(r for r in untimed.results if r.job_id == "eight")
    assert eight.start_s is not None and eight.start_s >= 10_000.0      # it waited for a whole server
    # Timed, the 8-GPU job's AM woke every back-off (about 6 minutes) for nearly three hours to plan and fail.
    assert before.events - untimed.events >= 40


def test_under_ranked_preemption_every_am_keeps_its_timers() -> None:
    untimed = replay(Policy.LAS)
    before = replay(Policy.LAS, time_stuck=True)
    assert outcome(untimed) == outcome(before) and untimed.events == before.events


def test_while_the_rm_reserves_every_am_keeps_its_timers() -> None:
    """A reservation given up frees GPUs in the AMs' views without a release: nothing would wake a parked AM."""
    untimed = replay(Policy.FIFO, reservations=1)
    before = replay(Policy.FIFO, time_stuck=True, reservations=1)
    assert outcome(untimed) == outcome(before) and untimed.events == before.events
