"""GPU telemetry, as pure logic: per-container summaries for the RM and the JSON the agent publishes.

Every `telemetry.interval` the agent reads each GPU (utilization, memory used, temperature, power) and
- publishes the whole node's reading, retained, as JSON on `gpurm/telemetry/<node_id>` (see `node_payload`);
- summarises it per container — utilization averaged over the container's GPUs, memory used as the most
  any one of its GPUs holds — into one line (`ContainerUsage.summary`) that its next heartbeat carries to
  the RM, and `gpurm status JOB` shows per learner.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpurm.nodeagent.gpus import GpuDevice, GpuSample


@dataclass(frozen=True)
class ContainerUsageSummary:
    container_id: str
    gpus: int                     # GPUs of the container that reported
    util_avg_pct: float | None
    memory_max_mib: int | None
    memory_total_mib: int | None  # of the GPU with the most memory used

    def text(self) -> str:
        """`util 73% avg, mem 40.1/80.0 GiB max` (the GPU USE column of `gpurm status`)."""
        util = f"util {self.util_avg_pct:.0f}% avg" if self.util_avg_pct is not None else "util ?"
        if self.memory_max_mib is None:
            mem = "mem ?"
        elif self.memory_total_mib:
            mem = f"mem {self.memory_max_mib / 1024:.1f}/{self.memory_total_mib / 1024:.1f} GiB max"
        else:
            mem = f"mem {self.memory_max_mib / 1024:.1f} GiB max"
        return f"{util}, {mem}"


def summarise(samples: Iterable[GpuSample],
              containers: Mapping[str, Sequence[int]]) -> dict[str, ContainerUsageSummary]:
    """One summary per container (id -> its GPU indices) that has at least one GPU with a reading."""
    by_index = {s.index: s for s in samples}
    out: dict[str, ContainerUsageSummary] = {}
    for cid, indices in containers.items():
        mine = [by_index[i] for i in indices if i in by_index]
        if not mine:
            continue
        utils = [s.util_pct for s in mine if s.util_pct is not None]
        mems = [s for s in mine if s.memory_used_mib is not None]
        top = max(mems, key=lambda s: s.memory_used_mib or 0) if mems else None
        out[cid] = ContainerUsageSummary(
            container_id=cid, gpus=len(mine),
            util_avg_pct=sum(utils) / len(utils) if utils else None,
            memory_max_mib=top.memory_used_mib if top is not None else None,
            memory_total_mib=top.memory_total_mib if top is not None else None)
    return out


def node_payload(node_id: str, time_ms: int, gpus: Sequence[GpuDevice], samples: Iterable[GpuSample],
                 holders: Mapping[int, str], summaries: Mapping[str, ContainerUsageSummary]) -> bytes:
    """The JSON published on gpurm/telemetry/<node_id>."""
    by_index = {s.index: s for s in samples}
    rows = []
    for g in gpus:
        s = by_index.get(g.index)
        rows.append({
            "index": g.index, "uuid": g.uuid, "healthy": g.healthy, "health_reason": g.health_reason,
            "container": holders.get(g.index, ""),
            "util_pct": s.util_pct if s else None,
            "memory_used_mib": s.memory_used_mib if s else None,
            "memory_total_mib": s.memory_total_mib if s else None,
            "temperature_c": s.temperature_c if s else None,
            "power_w": round(s.power_w, 1) if s and s.power_w is not None else None,
        })
    containers = {
        cid: {"gpus": u.gpus, "util_avg_pct": None if u.util_avg_pct is None else round(u.util_avg_pct, 1),
              "memory_max_mib": u.memory_max_mib, "summary": u.text()}
        for cid, u in sorted(summaries.items())
    }
    return json.dumps({"node_id": node_id, "time_ms": time_ms, "gpus": rows, "containers": containers},
                      separators=(",", ":")).encode()
