"""What the agent knows about each GPU of its node, and the provider seam that discovers them.

Providers: NVML (`nvml.py`, real servers) and the fake one (`fakegpu.py`, for dev clusters and tests), both
behind the `GpuProvider` protocol: discovery once at start, then health observations (`poll_events`) and
telemetry (`sample`) for as long as the agent runs. What an observation means (which XIDs take a GPU out of
service) is decided by `health.py`, not by the providers.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
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


class GpuEventKind(enum.Enum):
    XID = "xid"                   # an XID error the driver reported (critical or not: see health.CRITICAL_XIDS)
    LOST = "lost"                 # NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus
    ECC = "ecc"                   # uncorrectable ECC errors, retired pages pending, row remapping failed
    FAULT = "fault"               # any other reason to stop using the GPU (a fake provider's injected fault)


@dataclass(frozen=True)
class GpuEvent:
    """One health observation about one GPU."""

    index: int
    kind: GpuEventKind
    xid: int = 0
    detail: str = ""


@dataclass(frozen=True)
class GpuSample:
    """One telemetry reading of one GPU; None where the GPU cannot report it."""

    index: int
    util_pct: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    power_w: float | None


class GpuProvider(Protocol):
    def discover(self) -> list[GpuDevice]:
        """Every GPU of the node, ordered by index (= PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
        ...

    def poll_events(self) -> list[GpuEvent]:
        """Health observations since the last call (XID events, lost GPUs, ECC state). Never blocks long."""
        ...

    def sample(self, busy: Mapping[int, str]) -> list[GpuSample]:
        """A telemetry reading of every GPU that can be read; `busy` maps GPU index -> container using it."""
        ...

    def process_memory(self, indices: Sequence[int]) -> dict[int, dict[int, int]]:
        """GPU memory each process uses on the GPUs `indices`: index -> pid -> MiB (what the GPU can tell;
        empty where it cannot). The agent holds shared GPUs' jobs to their memory share with it."""
        ...

    def close(self) -> None: ...


def make_provider(cfg: AgentConfig) -> GpuProvider:
    """The provider agent.yaml asks for; GpuDiscoveryError when none is usable."""
    if cfg.gpus.nvml:
        # Imported here so only nodes that use NVML pay for loading pynvml.
        from gpurm.nodeagent.nvml import NvmlProvider

        return NvmlProvider(cpus=cfg.cpus)
    if cfg.gpus.fake is None:
        raise GpuDiscoveryError("gpus: no GPU provider configured: set gpus.fake: N or gpus.nvml: true")
    from gpurm.nodeagent.fakegpu import FakeGpuProvider

    return FakeGpuProvider(cfg.gpus.fake, cfg.gpus.model, cfg.gpus.memory_mib, cfg.gpus.nvlink_islands,
                           cfg.node_id, cpus=cfg.cpus, fail_gpus=cfg.gpus.fail_gpus, fault_file=cfg.gpus.fault_file)
