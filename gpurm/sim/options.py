"""What one simulator run is asked to do and what it gives back: `SimOptions` (with `RelaxPolicy`, `gpurm sim
--relax`) and `SimResult`. `sim/engine.py` re-exports all three, the names its callers import."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpurm.common.jobspec import Locality
from gpurm.queues.tree import Borrowing, Policy
from gpurm.rm.sched.history import DEFAULT_CONDITIONING, Finished
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S
from gpurm.rm.state.messages import RESERVATIONS, RESERVE_AFTER_S, RESERVE_BEHIND
from gpurm.sim.metrics import JobResult, Timeline
from gpurm.sim.runtime import RuntimeConfig


class RelaxPolicy(enum.Enum):
    """How every job's AM trades waiting for locality against running spread (`gpurm sim --relax`)."""

    TIMEOUT = "timeout"       # the AM's default: wait `locality.timeout` at each level, then relax one level
    COST = "cost"             # relax by expected cost (am/relax.py), the trace's duration as the expected run time
    NEVER = "never"           # every job `locality: strict`: never relax past the best level the cluster allows
    IMMEDIATE = "immediate"   # every job `locality: any`: no waiting for locality at all


@dataclass
class SimOptions:
    """The settings of one run: the RM's (policy, caps, retries), the AMs' (locality, relaxing), the run-time
    model's and the injected failures'."""

    policy: Policy | None = None           # every leaf uses this policy (None: the queue config's)
    borrowing: Borrowing | None = None     # how borrowed capacity is ordered (None: the queue config's, else fair)
    failures_per_1000_gpu_h: float = 0.0   # injected infrastructure failures (Poisson, per learner GPU-hour)
    seed: int = 0
    max_acquiring_per_queue: int = 10**9   # the RM's AM admission cap per queue (off by default: see docs/sim.md)
    max_retries: int = 3
    inqueue_min_run_s: float = 300.0
    las_thresholds_gpu_s: tuple[float, ...] = LAS_THRESHOLDS_GPU_S   # rm.yaml preemption.las_thresholds
    locality: Locality = field(default_factory=Locality)   # every job's locality settings (the RM's defaults)
    # The `placement` run-time model's constants (sim/runtime.py); None: the `ideal` model (full speed anywhere,
    # instant checkpoints), exactly the behaviour before the model existed.
    runtime: RuntimeConfig | None = None
    relax: RelaxPolicy = RelaxPolicy.TIMEOUT
    reservations: int = RESERVATIONS        # rm.yaml scheduler.reservations (rm/sched/reservations.py)
    reserve_after_s: float = RESERVE_AFTER_S
    reserve_behind: float = RESERVE_BEHIND  # rm.yaml scheduler.reserve_behind (rm/sched/behind.py)
    history_by: str = DEFAULT_CONDITIONING        # rm.yaml scheduler.history.group_by
    history_prior: tuple[Finished, ...] = ()      # scheduler.history.prior


@dataclass
class SimResult:
    """What a run gives back: every job's result, the allocation timeline, and the replay's own counts."""

    results: list[JobResult]
    timeline: Timeline
    capacity: int
    wall_s: float
    events: int
    settles: int
    preemptions: int
    borrowing: str = "fair"                # how borrowed capacity was ordered (the queue tree's, or --borrowing)
    borrow_preemptions: int = 0            # borrowers preempted for better-ranked waiting jobs (of those above)
    extra: dict[str, object] = field(default_factory=dict)
