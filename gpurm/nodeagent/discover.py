"""`gpurm agent --discover`: what the configured GPU provider finds, as a table or JSON, without running the agent.

For admins checking a new server (and NVML on a real one): GPUs, their health, the topology matrix in
nvidia-smi's notation and the NVLink islands the RM will plan with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpurm.common.gpus import GpuRecord, nvlink_islands
from gpurm.nodeagent.config import AgentConfig
from gpurm.nodeagent.gpus import GpuDevice, make_provider
from gpurm.nodeagent.health import GpuHealthBook
from gpurm.proto import gpurm_pb2 as pb

# nvidia-smi topo -m's names for each level
LEVEL_NAMES = {pb.LINK_SINGLE: "PIX", pb.LINK_MULTIPLE: "PXB", pb.LINK_HOSTBRIDGE: "PHB", pb.LINK_NODE: "NODE",
               pb.LINK_SYSTEM: "SYS", pb.LINK_LEVEL_UNSPECIFIED: "?"}


@dataclass(frozen=True)
class Discovery:
    provider: str
    gpus: list[GpuDevice]

    @property
    def islands(self) -> list[list[int]]:
        return islands_of(self.gpus)


def islands_of(gpus: Sequence[GpuDevice]) -> list[list[int]]:
    """The NVLink islands exactly as the RM computes them from the registration."""
    return nvlink_islands(GpuRecord(index=g.index, links=[(lk.peer, int(lk.level), lk.nvlinks) for lk in g.links])
                          for g in gpus)


def discover(cfg: AgentConfig) -> Discovery:
    """Discover with the configured provider and run one health check; GpuDiscoveryError when none works."""
    provider = make_provider(cfg)
    try:
        gpus = provider.discover()
        GpuHealthBook(gpus).observe(provider.poll_events(), 0.0)
    finally:
        provider.close()
    return Discovery("nvml" if cfg.gpus.nvml else f"fake ({cfg.gpus.fake} GPUs)", gpus)


def link_name(link: Any) -> str:
    if link.level == pb.LINK_NVLINK:
        return f"NV{link.nvlinks}" if link.nvlinks else "NV"
    return LEVEL_NAMES.get(link.level, "?")


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def as_text(d: Discovery) -> str:
    if not d.gpus:
        return f"provider {d.provider}: no GPUs\n"
    rows = [["GPU", "UUID", "MODEL", "MEMORY", "PCI BUS", "NUMA", "CPUS", "MIG", "HEALTH"]]
    for g in d.gpus:
        rows.append([str(g.index), g.uuid or "-", g.model, f"{g.memory_mib} MiB", g.pci_bus_id or "-",
                     str(g.numa_node) if g.numa_node >= 0 else "-", g.cpu_affinity or "-",
                     "on" if g.mig_enabled else "off", "ok" if g.healthy else f"UNHEALTHY: {g.health_reason}"])
    lines = [f"provider {d.provider}: {len(d.gpus)} GPUs", *_grid(rows), ""]
    matrix = [["", *(f"GPU{g.index}" for g in d.gpus)]]
    for g in d.gpus:
        by_peer = {lk.peer: lk for lk in g.links}
        matrix.append([f"GPU{g.index}", *("X" if p.index == g.index else
                                          link_name(by_peer[p.index]) if p.index in by_peer else "?"
                                          for p in d.gpus)])
    lines += ["topology (NV<n>: n NVLinks; PIX/PXB/PHB/NODE/SYS as in nvidia-smi topo -m):", *_grid(matrix), ""]
    islands = " ".join("[" + ",".join(map(str, isl)) + "]" for isl in d.islands)
    lines.append(f"NVLink islands: {islands}")
    return "\n".join(lines) + "\n"


def as_json(d: Discovery) -> dict[str, Any]:
    return {
        "provider": d.provider,
        "gpus": [{
            "index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib,
            "pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node, "cpu_affinity": g.cpu_affinity,
            "mig_enabled": g.mig_enabled, "healthy": g.healthy, "health_reason": g.health_reason,
            "links": [{"peer": lk.peer, "level": pb.LinkLevel.Name(lk.level), "nvlinks": lk.nvlinks}
                      for lk in g.links],
        } for g in d.gpus],
        "nvlink_islands": d.islands,
    }
