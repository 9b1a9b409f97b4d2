"""Holding a shared GPU's jobs to their share of its memory, where nothing else does. Pure.

On a GPU shared without CUDA MPS (docs/jobs.md, "Shared GPUs") the driver does not limit a process's GPU memory:
one job can take what its neighbours were promised and make them fail. The agent reads each process's GPU memory
(NVML) with every telemetry sample, sums it per container, and stops a container that stays above its share (its
`gpu_memory_mib`, with a small margin for allocator slack) for `strikes` samples in a row, saying why. A single
spike is forgiven; a job that keeps more is stopped before its neighbours run out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MARGIN = 0.05          # above the share by more than this (5%) counts
STRIKES = 2            # samples in a row (telemetry.interval apart: 10 s by default) before the job is stopped


@dataclass
class GpuMemoryGuard:
    margin: float = MARGIN
    strikes: int = STRIKES
    over: dict[str, int] = field(default_factory=dict)     # container id -> samples in a row above its share

    def observe(self, container_id: str, used_mib: int, limit_mib: int) -> str:
        """One sample of a container's GPU memory: why to stop it now, or ''."""
        if limit_mib <= 0 or used_mib <= limit_mib * (1 + self.margin):
            self.over.pop(container_id, None)
            return ""
        n = self.over[container_id] = self.over.get(container_id, 0) + 1
        if n < self.strikes:
            return ""
        self.over.pop(container_id, None)
        return (f"used {used_mib} MiB of GPU memory on its shared GPU, above its share of {limit_mib} MiB, for "
                f"{n} samples in a row: stopped so the GPU's other jobs keep theirs (ask for a bigger share, or "
                "hold the framework to GPURM_GPU_MEMORY_MIB)")

    def forget(self, live: set[str]) -> None:
        for cid in [c for c in self.over if c not in live]:
            del self.over[cid]
