"""The RM core's vocabulary: its settings, the errors it refuses requests with, the messages it takes from agents
and AMs (container reports, registrations, attempt reports), what it answers (allocate results, heartbeat
actions), the effects it leaves for the shell (AM launches, job changes) and the records it marks for the store.
Plain data; `rm/state/core.py` re-exports every name, so callers keep importing them from there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpurm.common.gpus import GpuRecord
from gpurm.common.model import Container, FailureKind, JobState, Learner
from gpurm.rm.sched.behind import BEHIND
from gpurm.rm.sched.history import DEFAULT_CONDITIONING, Finished
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S
from gpurm.rm.sched.scheduler import App, Grant

RESERVATIONS = 0              # rm.yaml scheduler.reservations' default: off (docs/queues.md "Reservations")
RESERVE_AFTER_S = 0.0         # scheduler.reserve_after's
RESERVE_BEHIND = BEHIND       # scheduler.reserve_behind's: a job starves past twice the one-GPU jobs' queueing


class ErrorCode(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAVAILABLE = "UNAVAILABLE"


class RequestError(Exception):
    """A request the RM refuses; the message names the field and what to do."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class RMSettings:
    heartbeat_interval_s: float = 1.0     # the shortest interval the RM names (a small fleet's)
    missed_beats: int = 10                # a node is LOST after this many intervals without a beat
    # The whole fleet's heartbeats a second, at most: past max_rate x interval servers the RM names a longer
    # interval (rm/state/heartbeats.py; 0: never), up to heartbeat_max_interval_s
    heartbeat_max_rate: float = 2000.0
    heartbeat_max_interval_s: float = 30.0
    agent_lease_s: float = 0.0            # an agent the RM has not answered this long stops its containers (the
                                          # fence, gpurm/common/lease.py; 0: the longest the expiry allows)
    fence_grace_s: float = 2.0            # ... TERM, then KILL after this
    resync_grace_s: float = 0.0           # after an RM restart, nodes have this long to register again (0: auto,
                                          # see rm/state/resync.py)
    container_start_timeout_s: float = 120.0  # a grant must be seen running within this, or it is reclaimed
    am_register_timeout_s: float = 60.0   # a launched AM must register within this
    am_liveness_timeout_s: float = 60.0   # a registered AM must call allocate at least this often
    am_max_attempts: int = 2              # AM processes per job (a restarted AM adopts running learners)
    am_launch_retries: int = 3            # failed AM launches before the job fails
    max_active_ams: int = 256             # AMs acquiring at once, cluster-wide
    # A submit within this of the last AM launch pass leaves its job's AM to the next one, which the daemon runs for
    # a whole burst of submits at once (rm/server/loops.py; its scheduler.interval); 0: at once (the simulator)
    am_launch_coalesce_s: float = 0.0
    max_acquiring_per_queue: int = 16     # jobs with an AM but not yet running, per leaf queue
    kill_grace_s: float = 10.0
    stop_resend_s: float = 10.0           # re-send a stop order the agent has not acted on
    allocate_interval_s: float = 0.5
    max_allocate_rate: float = 500.0     # running AMs' allocate calls a second, at most (rm/sched/pacing.py)
    token_ttl_s: float = 600.0            # container and AM tokens; their holders renew them (docs/security.md)
    inqueue_preemption: bool = True       # las / srtf leaves preempt inside the queue (Tiresias), daemon and simulator
    inqueue_min_run_s: float = 300.0      # a job runs at least this long before a same-queue job may preempt it
    # las: GPU-seconds of attained service at which a job drops to the next level (rm.yaml preemption.las_thresholds)
    las_thresholds_gpu_s: tuple[float, ...] = LAS_THRESHOLDS_GPU_S
    # elastic jobs grow only once no queue has wanted GPUs it may have for this long (rm.yaml elastic.idle_hold)
    elastic_idle_hold_s: float = 300.0
    elastic_regrow_hold_s: float = 60.0   # an elastic job whose growth was taken back does not grow again this long
    # What the learned job history is grouped by (rm/sched/history.py; rm.yaml scheduler.history.group_by), and the
    # finished jobs it starts from (scheduler.history.prior: a trace of earlier jobs)
    history_conditioning: str = DEFAULT_CONDITIONING
    history_prior: tuple[Finished, ...] = ()
    # Reservations for waiting jobs that cannot be placed, at most this many at once (rm/sched/reservations.py;
    # rm.yaml scheduler.reservations), once a job has waited reserve_after_s (scheduler.reserve_after) and
    # reserve_behind times what the one-GPU jobs recently queued (scheduler.reserve_behind; 0: any job that does
    # not fit; rm/sched/behind.py)
    reservations: int = RESERVATIONS
    reserve_after_s: float = RESERVE_AFTER_S
    reserve_behind: float = RESERVE_BEHIND


# ---------------------------------------------------------------- effects for the shell


@dataclass
class LaunchAM:
    job_id: str
    container_id: str
    node_id: str
    am_attempt: int


@dataclass
class JobChanged:
    job_id: str


Effect = LaunchAM | JobChanged


@dataclass
class ContainerReport:
    """What an agent says about one of its containers."""

    container_id: str
    state: str                 # STARTING, RUNNING, EXITED, FAILED_TO_START, LOST
    pid: int = 0
    exit_code: int = 0
    signal: int = 0
    stopped: bool = False
    diagnostics: str = ""
    infra_failure: bool = False
    job_id: str = ""
    user_error: bool = False

    @property
    def live(self) -> bool:
        return self.state in ("STARTING", "RUNNING")


@dataclass
class NodeRegistration:
    node_id: str
    host: str
    port: int
    rack: str
    ib_domain: str
    gpus: list[GpuRecord]
    cpus: int = 0
    memory_mib: int = 0
    containers: list[ContainerReport] = field(default_factory=list)
    agent_version: str = ""
    agent_instance: str = ""
    healthy: bool = True
    health_report: str = ""
    metrics_port: int = 0           # the agent's Prometheus exporter on `host` (0: none)
    container_engine: str = ""      # podman | docker: the server runs image jobs ("" = it does not)
    gpu_passing: str = ""           # cdi | devices | env: how its containers get their GPUs
    images: frozenset[str] = frozenset()   # the images its engine holds (image locality)
    # The agent takes the interval and lease each heartbeat reply names (rm/state/heartbeats.py); an older one keeps
    # what its registration named, and its node keeps that expiry
    follows_interval: bool = False


class HeartbeatAction(enum.Enum):
    OK = "OK"
    REREGISTER = "REREGISTER"


@dataclass
class AttemptUpdate:
    """An AM's report of one attempt (mirrors pb.AttemptReport)."""

    number: int
    state: JobState
    learners: list[Learner] = field(default_factory=list)
    waiting_reason: str = ""
    level: str = ""
    failure: FailureKind = FailureKind.NONE
    cause: str = ""
    exit_code: int = 0
    counts_as_failure: bool = False
    start_time: float = 0.0
    end_time: float = 0.0


@dataclass
class AllocateResult:
    response_id: int
    grants: list[Grant]
    completed: list[Container]
    kill_requested: bool
    preempt_ids: list[str] = field(default_factory=list)
    preempt_deadline: float = 0.0
    preempt_reason: str = ""
    plan_now: bool = False        # GPUs wait for it (idle, or freed for it by in-queue preemption): end a back-off
    target_gpus: int = 0          # elastic: the size to grow or shrink toward (0 = its max)
    expected_run_s: float = 0.0   # how long the job is expected to run (backfill onto reserved GPUs: View.for_job)


@dataclass
class AppState:
    """The RM's side of one running AM."""

    app: App
    am_attempt: int
    registered: bool = False
    last_seen: float = 0.0
    response_id: int = 0
    last_response: AllocateResult | None = None
    pending_grants: list[Grant] = field(default_factory=list)
    completed: list[Container] = field(default_factory=list)
    delivered: set[str] = field(default_factory=set)   # ends this AM has been sent
    preempt_ids: list[str] = field(default_factory=list)
    preempt_deadline: float = 0.0
    preempt_reason: str = ""


@dataclass
class Dirty:
    jobs: set[str] = field(default_factory=set)
    containers: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    meta: bool = False

    def __bool__(self) -> bool:
        return bool(self.jobs or self.containers or self.nodes or self.meta)
