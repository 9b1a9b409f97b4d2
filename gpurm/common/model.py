"""The RM's records: jobs, attempts, learners, containers. Pure data; rm/state/core.py moves them between states."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpurm.common.jobspec import JobSpec


class JobState(enum.Enum):
    QUEUED = "QUEUED"
    ALLOCATING = "ALLOCATING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


class FailureKind(enum.Enum):
    NONE = "NONE"
    USER = "USER"            # the command failed
    INFRA = "INFRA"          # lost node, unreachable agent, failed GPU, failed to start
    PREEMPTED = "PREEMPTED"  # taken back by fair-share preemption; not a failure
    KILLED = "KILLED"
    AM = "AM"                # the AM itself failed


class ContainerKind(enum.Enum):
    AM = "AM"
    LEARNER = "LEARNER"


class ContainerPhase(enum.Enum):
    ALLOCATED = "ALLOCATED"  # granted (or, for an AM, being launched); not yet seen running
    RUNNING = "RUNNING"      # the agent reports it running
    COMPLETED = "COMPLETED"  # ended, released, expired or lost: its GPUs are free again

    @property
    def live(self) -> bool:
        return self is not ContainerPhase.COMPLETED


class ExitKind(enum.Enum):
    """How a container ended, from the RM's point of view."""

    NONE = "NONE"
    EXITED = "EXITED"                # the process ended by itself (exit_code / signal say how)
    STOPPED = "STOPPED"              # stopped on request (release, kill, preemption)
    FAILED_TO_START = "FAILED_TO_START"
    LOST = "LOST"                    # its node was lost or forgot it
    EXPIRED = "EXPIRED"              # granted but never started in time
    RELEASED = "RELEASED"            # given back before it ever ran


@dataclass
class Learner:
    rank: int
    node_id: str
    gpu_indices: list[int]
    container_id: str = ""
    host: str = ""
    state: str = "STARTING"      # STARTING, RUNNING, EXITED, FAILED_TO_START, LOST
    exit_code: int = 0
    signal: int = 0
    pid: int = 0
    preemptible: bool = False
    usage: str = ""


@dataclass
class Attempt:
    number: int
    state: JobState = JobState.ALLOCATING
    start_time: float = 0.0
    end_time: float = 0.0
    learners: list[Learner] = field(default_factory=list)
    failure: FailureKind = FailureKind.NONE
    cause: str = ""
    exit_code: int = 0
    counts_as_failure: bool = False
    level: str = ""
    am_attempt: int = 1
    waiting_reason: str = ""


@dataclass
class Job:
    job_id: str
    spec: JobSpec
    user: str
    queue: str
    submit_time: float
    seq: int = 0                     # submission order, for FIFO ties
    state: JobState = JobState.QUEUED
    start_time: float = 0.0
    finish_time: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    diagnostics: str = ""
    exit_code: int = 0
    am_attempt: int = 0              # 0 until the first AM is launched
    am_container: str = ""
    am_node: str = ""
    preemptions: int = 0
    failures: int = 0
    waiting_reason: str = ""
    attained_gpu_s: float = 0.0      # GPU-seconds served so far (LAS ordering)
    las_base_gpu_s: float = 0.0      # attained_gpu_s when the LAS starvation guard last promoted it
    submit_id: str = ""
    kill_requested: bool = False
    final_reported: bool = False     # the AM called FinishApplicationMaster
    am_registered: list[int] = field(default_factory=list)  # AM attempts that came up
    am_launch_failures: int = 0
    admitted: bool = False           # got an AM: counts against its queues' max_running_jobs
    idle_since: float = 0.0          # when it last held no GPUs (submit, or its last learner's end)
    expected_gpu_s: float = 0.0      # known total GPU-time (the simulator's traces; 0 = unknown)
    target_gpus: int = 0             # elastic: the size `gpurm scale` asked for (0 = its max)

    @property
    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


@dataclass
class ExitStatus:
    kind: ExitKind = ExitKind.NONE
    exit_code: int = 0
    signal: int = 0
    diagnostics: str = ""
    infra: bool = False
    user_error: bool = False    # the agent judged it the job's own fault (command not found, no workdir)

    def describe(self) -> str:
        if self.kind is ExitKind.EXITED:
            if self.user_error and self.diagnostics:   # the agent's reading of it, e.g. a shell's 127
                return self.diagnostics
            return f"killed by signal {self.signal}" if self.signal else f"exited with code {self.exit_code}"
        text = self.kind.name.lower().replace("_", " ")
        return f"{text}: {self.diagnostics}" if self.diagnostics else text


@dataclass
class Container:
    container_id: str
    job_id: str
    kind: ContainerKind
    node_id: str
    gpu_indices: list[int]
    attempt: int                      # job attempt for a learner, AM attempt for an AM
    created: float
    user: str = ""
    phase: ContainerPhase = ContainerPhase.ALLOCATED
    started: float = 0.0
    finished: float = 0.0
    pid: int = 0
    exit: ExitStatus = field(default_factory=ExitStatus)
    preemptible: bool = False
    stop_requested: bool = False
    stop_reason: str = ""
    preempt_deadline: float = 0.0     # set when fair-share preemption takes it back
    preempted_for: str = ""           # the queue it is taken back for
    elastic: bool = False             # growth of an elastic job beyond its minimum (rm/sched/elastic.py)
    share_milli: int = 0              # a share of its one GPU, in thousandths (0: whole GPUs): see rm/state/cluster.py
    note: str = ""                    # what its agent says while it starts (an image job: "pulling image ...")

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)

    @property
    def amount(self) -> float:
        """What it counts for in its queue's usage: its GPUs, or its fraction of a shared GPU."""
        return self.share_milli / 1000 if self.share_milli else float(len(self.gpu_indices))
