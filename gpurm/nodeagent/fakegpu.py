"""A fake GPU provider: a deterministic, plausible server (DGX-like) for dev clusters, tests and demos.

Faults can be injected: `fail_gpus` (indices unhealthy from the start) and `fault_file`, read on every health
poll, one fault per line: `INDEX xid N`, `INDEX lost` (fell off the bus), `INDEX ecc`, or `INDEX any text`
(a fault with that text as the reason); `#` starts a comment. Telemetry is deterministic: an idle GPU shows
0% and a little memory, a GPU a container holds shows a utilization and memory derived from the container id.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpurm.nodeagent.gpus import GpuDevice, GpuDiscoveryError, GpuEvent, GpuEventKind, GpuLink, GpuSample
from gpurm.proto import gpurm_pb2 as pb

log = logging.getLogger(__name__)

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
                 cpus: int = 0, fail_gpus: Sequence[int] = (), fault_file: Path | None = None) -> None:
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
        self.fail_gpus = [i for i in fail_gpus if 0 <= i < count]
        self.fault_file = fault_file
        self._reported: set[str] = set()   # fault lines already turned into events
        self._lost: set[int] = set()
        self.samples = 0

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

    def poll_events(self) -> list[GpuEvent]:
        events: list[GpuEvent] = []
        for i in self.fail_gpus:
            key = f"fail_gpus:{i}"
            if key not in self._reported:
                self._reported.add(key)
                events.append(GpuEvent(i, GpuEventKind.FAULT, detail="injected fault (gpus.fail_gpus)"))
        if self.fault_file is None:
            return events
        try:
            text = self.fault_file.read_text()
        except FileNotFoundError:
            return events
        except OSError as exc:
            log.warning("gpus.fault_file %s: %s", self.fault_file, exc)
            return events
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line in self._reported:
                continue
            event = parse_fault(line, self.count)
            if event is None:
                log.warning("gpus.fault_file %s: ignoring %r (expected INDEX xid N | lost | ecc | TEXT)",
                            self.fault_file, line)
            else:
                events.append(event)
                if event.kind is GpuEventKind.LOST:
                    self._lost.add(event.index)
            self._reported.add(line)
        return events

    def sample(self, busy: Mapping[int, str]) -> list[GpuSample]:
        self.samples += 1
        out = []
        for i in range(self.count):
            if i in self._lost:
                continue  # a GPU off the bus answers nothing
            holder = busy.get(i)
            if holder is None:
                util, used = 0, min(self.memory_mib, 4)
            else:
                h = zlib.crc32(f"{holder}/{i}".encode())
                util = 55 + h % 41                              # 55-95 %
                used = self.memory_mib * (30 + (h >> 8) % 61) // 100  # 30-90 % of memory
            out.append(GpuSample(index=i, util_pct=util, memory_used_mib=used, memory_total_mib=self.memory_mib,
                                 temperature_c=32 + i % 4 + util * 45 // 100,
                                 power_w=round(70.0 + util * 6.3, 1)))
        return out

    def process_memory(self, indices: Sequence[int]) -> dict[int, dict[int, int]]:
        """Fake GPUs run no CUDA processes: nothing to report (shared GPUs' memory limits are not enforced)."""
        return {}

    def close(self) -> None:
        pass


def parse_fault(line: str, count: int) -> GpuEvent | None:
    """One fault_file line -> an event, or None when it is not one."""
    head, _, rest = line.partition(" ")
    try:
        index = int(head)
    except ValueError:
        return None
    if not 0 <= index < count:
        return None
    words = rest.split()
    if len(words) == 2 and words[0].lower() == "xid" and words[1].isdigit():
        return GpuEvent(index, GpuEventKind.XID, xid=int(words[1]))
    if words == ["lost"]:
        return GpuEvent(index, GpuEventKind.LOST, detail="injected (gpus.fault_file)")
    if words == ["ecc"]:
        return GpuEvent(index, GpuEventKind.ECC, detail="uncorrectable ECC errors (injected)")
    if not words:
        return None
    return GpuEvent(index, GpuEventKind.FAULT, detail=rest.strip())
