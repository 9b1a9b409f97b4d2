"""A fake GPU provider: a deterministic, plausible server (DGX-like) for dev clusters, tests and demos."""

from __future__ import annotations

import uuid

from gpurm.nodeagent.gpus import GpuDevice, GpuDiscoveryError, GpuLink
from gpurm.proto import gpurm_pb2 as pb

# A fixed namespace so the same node id and index give the same UUID on every start (the RM keys health
# history by UUID).
_NAMESPACE = uuid.UUID("6f1c1a52-52a4-4c55-9a4e-3f0f3c2d5e10")
NVLINKS_PER_PAIR = 18             # H100 SXM: 18 NVLink 4 links per GPU into the NVSwitch fabric


def _cpulist(first: int, count: int) -> str:
    if count <= 0:
        return ""
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


class FakeGpuProvider:
    """`count` identical GPUs in `nvlink_islands` equal NVLink islands; two NUMA nodes split by halves."""

    def __init__(self, count: int, model: str, memory_mib: int, nvlink_islands: int, node_id: str, *,
                 cpus: int = 0) -> None:
        if count < 0:
            raise GpuDiscoveryError(f"gpus.fake must be 0 or more, got {count}")
        if count and (nvlink_islands < 1 or count % nvlink_islands):
            raise GpuDiscoveryError(
                f"gpus.nvlink_islands ({nvlink_islands}) must divide gpus.fake ({count}) into equal islands")
        self.count = count
        self.model = model
        self.memory_mib = memory_mib
        self.nvlink_islands = max(1, nvlink_islands)
        self.node_id = node_id
        self.cpus = cpus

    def island_of(self, index: int) -> int:
        return index // (self.count // self.nvlink_islands)

    def discover(self) -> list[GpuDevice]:
        numa_nodes = 2 if self.count >= 2 else 1
        per_numa_cpus = self.cpus // numa_nodes
        devices = []
        for i in range(self.count):
            numa = 0 if numa_nodes == 1 or i < self.count / 2 else 1
            links = []
            for j in range(self.count):
                if j == i:
                    continue
                if self.island_of(j) == self.island_of(i):
                    links.append(GpuLink(j, pb.LINK_NVLINK, NVLINKS_PER_PAIR))
                else:
                    links.append(GpuLink(j, pb.LINK_SYSTEM, 0))
            devices.append(GpuDevice(
                index=i,
                uuid=f"GPU-{uuid.uuid5(_NAMESPACE, f'{self.node_id}/{i}')}",
                model=self.model,
                memory_mib=self.memory_mib,
                # 16 buses per PCI domain keeps ids unique and ordered for any count.
                pci_bus_id=f"{i // 16:08X}:{0x18 + (i % 16) * 0x0E:02X}:00.0",
                numa_node=numa,
                cpu_affinity=_cpulist(numa * per_numa_cpus, per_numa_cpus),
                links=links,
            ))
        return devices

    def close(self) -> None:
        pass
