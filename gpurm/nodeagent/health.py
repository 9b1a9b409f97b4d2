"""Node and GPU health, as pure logic: what a GPU event means, and what an admin health script said.

Nothing here reads a clock, sleeps or runs a process; the agent's shell (`monitor.py`) feeds it observations
and the time.

GPU health
- An XID in `CRITICAL_XIDS` takes the GPU out of service; any other XID (13, 31, 43, 45 ...: faults of the
  application running on it) is only logged.
- A GPU that falls off the bus (any NVML query answering NVML_ERROR_GPU_IS_LOST), uncorrectable ECC errors,
  retired pages pending, a failed or pending row remapping, or an injected fault (fake provider) take it out too.
- Unhealthy is sticky until the agent restarts: every one of these needs a GPU reset or a reboot, an admin's
  decision, and the RM must not see a GPU flap in and out of service.

Node health (YARN NodeManager semantics for the admin script, `health.script`)
- A line of its output (stdout and stderr) that starts with `ERROR` makes the node unhealthy; the report is
  that line (the first such line, at most 500 characters).
- Output without such a line is healthy, whatever the exit code: a non-zero exit is a bug of the script, not
  a verdict on the node (as in YARN); it is logged.
- A run that times out changes nothing (the last verdict stays) and is logged. (YARN marks the node unhealthy
  on a timeout; a slow script here is taken as a slow script, not a sick node.)
- A script that cannot be run at all (missing, not executable) makes the node unhealthy, as in YARN: the
  admin asked for a check that does not happen.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpurm.nodeagent.gpus import GpuDevice, GpuEvent, GpuEventKind

# XIDs that take a GPU out of service (from NVIDIA's XID catalogue; the set DCGM and the Kubernetes device
# plugin treat as hardware faults). Keep docs/ARCHITECTURE.md's list in step.
CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded (reset needed)",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}
# XIDs caused by the application on the GPU, not the GPU: logged, never a reason to stop offering it.
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    68: "video processor exception",
}

ERROR_PREFIX = "ERROR"
MAX_REPORT = 500


def gpu_name(gpu: GpuDevice) -> str:
    """How operators and diagnostics name a GPU: "GPU 3 (GPU-8f1c...)"."""
    return f"GPU {gpu.index} ({gpu.uuid})" if gpu.uuid else f"GPU {gpu.index}"


def event_reason(event: GpuEvent) -> str | None:
    """Why this event takes its GPU out of service, or None when it does not."""
    if event.kind is GpuEventKind.XID:
        what = CRITICAL_XIDS.get(event.xid)
        return f"XID {event.xid} ({what})" if what is not None else None
    if event.kind is GpuEventKind.LOST:
        return "fell off the bus"
    if event.kind is GpuEventKind.ECC:
        return event.detail or "uncorrectable ECC errors"
    return event.detail or "fault"


def describe_xid(xid: int) -> str:
    what = CRITICAL_XIDS.get(xid) or APPLICATION_XIDS.get(xid) or "see NVIDIA's XID catalogue"
    return f"XID {xid} ({what})"


@dataclass(frozen=True)
class HealthChange:
    """A GPU whose health changed (today always to unhealthy: unhealthy is sticky)."""

    index: int
    uuid: str
    healthy: bool
    reason: str
    since: float

    @property
    def diagnostic(self) -> str:
        """One line for the containers on this GPU: "GPU 3 (GPU-xxxx) fell off the bus"."""
        name = f"GPU {self.index} ({self.uuid})" if self.uuid else f"GPU {self.index}"
        if self.reason.startswith("fell off the bus"):
            return f"{name} {self.reason}"
        return f"{name} failed: {self.reason}"


class GpuHealthBook:
    """The health of every GPU of the node, kept on the shared `GpuDevice` objects (the ContainerManager and
    the RM tracker read the same objects)."""

    def __init__(self, gpus: Sequence[GpuDevice]) -> None:
        self.gpus = {g.index: g for g in gpus}
        self.since: dict[int, float] = {}
        self.ignored: list[GpuEvent] = []  # the last non-critical events, for the log (bounded)

    def observe(self, events: Iterable[GpuEvent], now: float) -> list[HealthChange]:
        """Apply observations; returns the GPUs that became unhealthy, each once."""
        changes: list[HealthChange] = []
        for event in events:
            gpu = self.gpus.get(event.index)
            if gpu is None:
                continue
            reason = event_reason(event)
            if reason is None:
                self.ignored = [*self.ignored[-31:], event]
                continue
            if not gpu.healthy:
                continue  # the first reason stays: it is the cause, later ones are consequences
            gpu.healthy = False
            gpu.health_reason = reason[:MAX_REPORT]
            self.since[gpu.index] = now
            changes.append(HealthChange(gpu.index, gpu.uuid, False, gpu.health_reason, now))
        return changes

    def unhealthy(self) -> list[GpuDevice]:
        return [g for g in self.gpus.values() if not g.healthy]


# ---------------------------------------------------------------- the admin health script


class ScriptOutcome(enum.Enum):
    OK = "ok"                     # ran, no ERROR line (any exit code)
    ERROR = "error"               # printed a line starting with ERROR
    TIMED_OUT = "timed_out"       # did not finish within health.timeout: no verdict
    CANNOT_RUN = "cannot_run"     # could not be started at all


@dataclass(frozen=True)
class ScriptResult:
    outcome: ScriptOutcome
    report: str = ""              # the ERROR line, or why it could not run
    exit_code: int | None = None


def interpret_script(output: str, exit_code: int | None, *, timed_out: bool = False,
                     cannot_run: str = "") -> ScriptResult:
    """What one run of the health script says (see the module doc for the rules)."""
    if cannot_run:
        return ScriptResult(ScriptOutcome.CANNOT_RUN, f"health script cannot run: {cannot_run}"[:MAX_REPORT])
    if timed_out:
        return ScriptResult(ScriptOutcome.TIMED_OUT, exit_code=exit_code)
    for line in output.splitlines():
        if line.startswith(ERROR_PREFIX):
            return ScriptResult(ScriptOutcome.ERROR, line.strip()[:MAX_REPORT], exit_code)
    return ScriptResult(ScriptOutcome.OK, exit_code=exit_code)


@dataclass
class NodeHealth:
    """The node's verdict from its health script; healthy until a run says otherwise."""

    healthy: bool = True
    report: str = ""
    since: float = 0.0
    last_run: float | None = None

    def apply(self, result: ScriptResult, now: float) -> bool:
        """Take one run's result; True when the verdict (healthy, report) changed."""
        self.last_run = now
        if result.outcome is ScriptOutcome.TIMED_OUT:
            return False
        healthy = result.outcome is ScriptOutcome.OK
        report = "" if healthy else result.report
        if (healthy, report) == (self.healthy, self.report):
            return False
        self.healthy, self.report, self.since = healthy, report, now
        return True
