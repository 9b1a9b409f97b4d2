"""The memory limit for the phase a container is in now (`rightsize: on` queues; docs/queues.md).

The agent writes it to the container's cgroup v2 `memory.high`, the point above which the kernel reclaims and
throttles the container, not `memory.max`, which stays the container's granted share: a hard limit at one phase's
level would kill the job the moment it entered a heavier phase, before the agent saw the change. Pure.
"""

from __future__ import annotations

from gpurm.rightsize.phases import PhaseModel

MARGIN = 0.25          # the limit is the phase's mean + 2 sigma, plus 25%
FLOOR_MIB = 256.0      # never below this, whatever the phases say
RAISE_AT = 0.9         # a sample above 90% of the limit raises it at once to the largest phase's (see monitor.py)


def phase_limit_mib(model: PhaseModel, latest_mem_mib: float, *, margin: float = MARGIN,
                    floor_mib: float = FLOOR_MIB) -> float | None:
    """memory.high for the phase of the latest sample: its mean + 2 sigma with the margin, never below what the
    container uses now (with the margin) nor `floor_mib`; None when there are no phases yet."""
    if not model.labels:
        return None
    phase = model.phase(model.labels[-1])
    return max(max(phase.mem_provision, latest_mem_mib) * (1 + margin), floor_mib)


def ceiling_mib(model: PhaseModel, latest_mem_mib: float, *, margin: float = MARGIN,
                floor_mib: float = FLOOR_MIB) -> float:
    """The limit when a container outgrows its phase's: the largest phase's mean + 2 sigma with the margin."""
    return max(max(model.recommend().mem_mib, latest_mem_mib) * (1 + margin), floor_mib)
