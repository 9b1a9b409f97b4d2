"""What the simulator keeps for a job while its AM lives: `SimAM` (the real `Master`, the allocate protocol's
response id, the work done so far, the AM's timer, what the `placement` model counted) and `Run` (one attempt's
learners while they run, and the rate its work goes at)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpurm.am.master import Master
from gpurm.sim.trace import TraceJob


@dataclass
class Run:
    """One attempt's learners while they run."""

    token: int
    start: float
    containers: dict[str, str]           # container -> node
    ended: bool = False
    finish_seq: int = 0                  # the FINISH event still valid (placement: re-timed when the rate changes)
    # The `placement` model only (see sim/runtime.py):
    rate: float = 1.0                    # work (full-speed seconds) per second now
    productive_from: float = 0.0         # the restart cost paid, work begins here
    accounted_at: float = 0.0            # work is counted up to here
    work: float = 0.0                    # work done by this attempt
    nodes: tuple[str, ...] = ()          # its servers, when more than one (they share network links)
    racks: int = 1
    gpus: int = 0                        # elastic jobs: the GPUs its learners hold now
    # (time, work, rate from then): every rate change, to find the work saved at the last checkpoint.
    breaks: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass
class SimAM:
    """A job's AM as the simulator plays its shell: its Master and what the engine tracks beside it."""

    job_id: str                          # the RM's job id
    trace: TraceJob
    master: Master
    am_attempt: int
    am_container: str
    am_node: str
    response_id: int = 0
    progress_s: float = 0.0              # work done (seconds at full speed), kept across attempts (checkpoints)
    run: Run | None = None
    wake_at: float | None = None
    first_start: float | None = None
    done: bool = False
    # The `placement` model only:
    sensitivity: float = 0.0
    restart_after: str = ""              # "preemption" / "failure": the next attempt pays the restart cost
    run_s: float = 0.0                   # productive seconds run (all attempts)
    slow_s: float = 0.0                  # the integral of 1 / rate over them (run_s x the mean slowdown)
    lost_preemption_gpu_s: float = 0.0   # GPU-time lost to preemption: work since the checkpoint, restarts
    lost_failure_gpu_s: float = 0.0      # the same for failed attempts
