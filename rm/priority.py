"""Job priority inside a leaf queue, and preemption inside a queue for the preemptive policies. Pure.

- `fifo`: submit order.
- `las`: Tiresias' discretized two-dimensional LAS. A job's attained service is GPUs x seconds run (both
  dimensions, hence 2D). Service is discretized into priority levels by `LAS_THRESHOLDS_GPU_S`: a job starts at
  level 0 and drops a level each time its attained service crosses the next threshold; inside a level, submit
  order (so jobs of similar service are not preempted over small differences). Starvation guard: a job that has
  waited, since it last ran (or was submitted), more than `LAS_STARVE_FACTOR` times as long as it has run in all
  is promoted to level 0.
- `srtf`: shortest remaining GPU-time first, from the trace's durations (the simulator's oracle baseline; an RM
  has no durations and treats every job alike, i.e. fifo).

In-queue preemption (the simulator's `las` and `srtf`, Tiresias-style): a waiting job that outranks running jobs
of its own queue takes their GPUs when the idle ones do not suffice: the lowest-ranked running jobs go first, and
only jobs that ran at least `min_run_s` (no flapping).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpurm.queues.tree import Policy

LAS_THRESHOLDS_GPU_S = (3600.0, 36000.0, 360000.0)   # 1, 10 and 100 GPU-hours: levels 0..3
LAS_STARVE_FACTOR = 8.0


@dataclass
class Standing:
    """What ranking a job needs to know."""

    job_id: str
    seq: int
    gpus: int
    attained_gpu_s: float = 0.0
    executed_s: float = 0.0       # wall time it has run in all
    waiting_since: float = 0.0    # when it last stopped running (or was submitted)
    remaining_gpu_s: float = 0.0  # srtf only: from the trace
    running_since: float = -1.0   # when its current run started, -1 if it holds no GPUs


def las_level(attained_gpu_s: float) -> int:
    return bisect.bisect_right(LAS_THRESHOLDS_GPU_S, attained_gpu_s)


def rank(policy: Policy, now: float) -> Callable[[Standing], tuple[float, float, int]]:
    """Sort key: lower ranks first."""
    if policy is Policy.LAS:
        def las(s: Standing) -> tuple[float, float, int]:
            starved = s.running_since < 0 and now - s.waiting_since > LAS_STARVE_FACTOR * max(s.executed_s, 1.0)
            return (0.0 if starved else float(las_level(s.attained_gpu_s)), 0.0, s.seq)
        return las
    if policy is Policy.SRTF:
        return lambda s: (0.0, s.remaining_gpu_s, s.seq)
    return lambda s: (0.0, 0.0, s.seq)


def preemptive(policy: Policy) -> bool:
    return policy in (Policy.LAS, Policy.SRTF)


def in_queue_victims(policy: Policy, now: float, waiting: Sequence[Standing], running: Sequence[Standing],
                     idle_gpus: int, min_run_s: float) -> list[tuple[str, str]]:
    """(victim, beneficiary) pairs: running jobs of one queue that waiting jobs of the same queue outrank."""
    key = rank(policy, now)
    rk = {s.job_id: key(s) for s in running}
    victims: list[tuple[str, str]] = []
    taken: set[str] = set()
    free = idle_gpus
    pool = sorted(running, key=lambda r: rk[r.job_id], reverse=True)     # lowest-ranked first
    for w in sorted(waiting, key=key):
        if free >= w.gpus:
            free -= w.gpus                                 # it fits without preempting anybody
            continue
        kw = key(w)
        chosen: list[Standing] = []
        got = free
        for r in pool:
            if got >= w.gpus or rk[r.job_id] <= kw:
                break                                      # enough, or nobody further down is outranked
            if r.job_id in taken or now - r.running_since < min_run_s:
                continue
            chosen.append(r)
            got += r.gpus
        if got < w.gpus:
            continue                                       # cannot make room for it: take nothing
        for r in chosen:
            taken.add(r.job_id)
            victims.append((r.job_id, w.job_id))
        free = got - w.gpus
    return victims
