"""The AM state machine's vocabulary: its phases, what the shell tells it (`Held`: a grant, `Ended`: a container's
end), what it asks the shell to do (`Launch`, `Stop`: the `Action`s), and what it keeps (`Run`: a launched learner,
`AttemptRecord`: an attempt as reported to the RM, `Final`: how the job ended). Plain records, no behaviour beyond
describing themselves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from gpurm.common.model import FailureKind, JobState, Learner


class Phase(enum.Enum):
    """Where the current attempt stands (the transitions: am/master.py)."""

    PLANNING = "PLANNING"
    ACQUIRING = "ACQUIRING"
    BACKOFF = "BACKOFF"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    DONE = "DONE"


@dataclass
class Held:
    """A container the RM granted to this job."""

    container_id: str
    node_id: str
    rack: str
    host: str
    port: int
    gpu_indices: tuple[int, ...]
    token: Any = None          # opaque to the state machine; the shell passes it to the agent
    preemptible: bool = False

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)


@dataclass
class Ended:
    """A container the RM reports ended."""

    container_id: str
    exit_code: int = 0
    signal: int = 0
    stopped: bool = False       # ended because somebody stopped it
    failed_to_start: bool = False
    lost: bool = False          # node lost, agent forgot it, grant expired
    infra: bool = False
    diagnostics: str = ""
    user_error: bool = False    # the agent saw the job's own fault (command not found, no workdir): never retried

    def describe(self) -> str:
        if self.lost:
            return f"lost ({self.diagnostics})" if self.diagnostics else "lost"
        if self.failed_to_start:
            return f"failed to start: {self.diagnostics}" if self.diagnostics else "failed to start"
        if self.infra and self.diagnostics:  # e.g. stopped by its agent because its GPU failed
            return f"failed ({self.diagnostics})"
        if self.signal:
            return f"was killed by signal {self.signal}"
        if self.user_error and self.diagnostics:    # e.g. the shell's 127: what the agent made of it
            return self.diagnostics
        return f"exited with code {self.exit_code}"


@dataclass
class Run:
    """A launched learner."""

    rank: int
    held: Held
    state: str = "STARTING"     # STARTING, RUNNING, EXITED, FAILED_TO_START, LOST
    pid: int = 0
    exit_code: int = 0
    signal: int = 0
    extra: bool = False         # an elastic job's growth beyond its gang (am/elastic.py)

    @property
    def live(self) -> bool:
        return self.state in ("STARTING", "RUNNING")


@dataclass
class Launch:
    """Start these learners (one per server); env holds the torchrun variables."""

    attempt: int
    learners: list[tuple[Held, int, dict[str, str]]]   # (container, rank, env without MASTER_PORT)
    master_node: str


@dataclass
class Stop:
    """Stop this learner, with `grace_s` between SIGTERM and SIGKILL."""

    held: Held
    grace_s: float
    reason: str


Action = Launch | Stop


@dataclass
class AttemptRecord:
    """One attempt as the AM reports it to the RM (and takes it back from the RM on adoption)."""

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
    waiting_reason: str = ""
    launched_at: float = -1.0      # when every learner ran; -1 = never (or unknown after adoption)


@dataclass
class Final:
    """How the job ended: the AM's last word to the RM."""

    state: JobState
    diagnostics: str
    exit_code: int = 0
