"""What the agent knows about each GPU of its node, and the provider seam that discovers them.

Providers: the fake one (`fakegpu.py`, for dev clusters and tests); NVML comes in a later issue behind the
same `GpuProvider` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpurm.proto import gpurm_pb2 as pb

if TYPE_CHECKING:
    from gpurm.nodeagent.config import AgentConfig


class GpuDiscoveryError(Exception):
    """GPUs could not be discovered; the message is one line for the operator."""


@dataclass(frozen=True)
class GpuLink:
    peer: int                     # index of the other GPU on this node
    level: pb.LinkLevel
    nvlinks: int = 0              # active NVLinks between the two, 0 if none


@dataclass
class GpuDevice:
    index: int
    uuid: str
    model: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int = -1           # -1 when unknown
    cpu_affinity: str = ""        # cpulist, e.g. "0-23,48-71"
    mig_enabled: bool = False
    healthy: bool = True
    health_reason: str = ""
    links: list[GpuLink] = field(default_factory=list)

    def to_proto(self) -> pb.GpuInfo:
        return pb.GpuInfo(
            index=self.index, uuid=self.uuid, model=self.model, memory_mib=self.memory_mib,
            pci_bus_id=self.pci_bus_id, numa_node=self.numa_node, cpu_affinity=self.cpu_affinity,
            mig_enabled=self.mig_enabled, healthy=self.healthy, health_reason=self.health_reason,
            links=[pb.GpuLink(peer=lk.peer, level=lk.level, nvlinks=lk.nvlinks) for lk in self.links],
        )


class GpuProvider(Protocol):
    def discover(self) -> list[GpuDevice]:
        """Every GPU of the node, ordered by index (= PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
        ...

    def close(self) -> None: ...


def make_provider(cfg: AgentConfig) -> GpuProvider:
    """The provider agent.yaml asks for; GpuDiscoveryError when none is usable."""
    if cfg.gpus.nvml:
        raise GpuDiscoveryError("gpus.nvml: NVML discovery is not available yet; use gpus.fake")
    if cfg.gpus.fake is None:
        raise GpuDiscoveryError("gpus: no GPU provider configured: set gpus.fake: N or gpus.nvml: true")
    # Imported here so a later NVML provider's import (pynvml) is paid only by nodes that use it.
    from gpurm.nodeagent.fakegpu import FakeGpuProvider

    return FakeGpuProvider(cfg.gpus.fake, cfg.gpus.model, cfg.gpus.memory_mib, cfg.gpus.nvlink_islands,
                           cfg.node_id, cpus=cfg.cpus)
