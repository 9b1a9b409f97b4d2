"""The NVML provider through a stand-in `pynvml` module: discovery and topology (8 GPUs in two NVLink islands
of 4, and an NVSwitch server), XID events, a GPU falling off the bus, ECC state, telemetry, and NVML missing.

Pure: the stand-in is handed to the provider; no library, socket or sleep."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from gpurm.nodeagent.discover import Discovery, as_json, as_text, islands_of
from gpurm.nodeagent.gpus import GpuDiscoveryError, GpuEvent, GpuEventKind
from gpurm.nodeagent.health import GpuHealthBook
from gpurm.nodeagent.nvml import NvmlProvider, cpulist, normalise_bus_id
from gpurm.nodeagent.telemetry import summarise
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.server import convert
from gpurm.rm.state.cluster import Cluster, Node

GIB = 1024**3
SWITCH_BUS = "00000000:F0:00.0"


class NVMLError(Exception):
    NAMES = {2: "Invalid Argument", 3: "Not Supported", 9: "Driver Not Loaded", 10: "Timeout",
             12: "NVML Shared Library Not Found", 15: "GPU is lost"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.NAMES.get(self.value, f"NVML error {self.value}")


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """Just enough of pynvml: an HGX-like board of `count` GPUs, NUMA halves, 24 CPUs per NUMA node."""

    NVMLError = NVMLError
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_NVLINK_MAX_LINKS = 18
    NVML_TEMPERATURE_GPU = 0
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, count: int = 8, island: int = 4, *, init_error: int | None = None,
                 nvswitch: bool = False) -> None:
        self.count = count
        self.island = island
        self.init_error = init_error
        self.nvswitch = nvswitch
        self.handles = [Handle(i) for i in range(count)]
        self.lost: set[int] = set()
        self.events: deque[Any] = deque()
        self.registered: dict[int, int] = {}
        self.remapped = {i: (0, 0, 0, 0) for i in range(count)}
        self.busy_util = {i: 0 for i in range(count)}
        self.procs: dict[int, list[tuple[int, int | None]]] = {}   # GPU -> (pid, bytes or None)
        self.shut = False

    def _h(self, h: Handle) -> int:
        if h.index in self.lost:
            raise NVMLError(15)
        return h.index

    @staticmethod
    def bus(i: int) -> str:
        return f"00000000:{0x18 + 0x10 * i:02X}:00.0"

    # -- init and devices
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        return self.handles[i]

    def nvmlDeviceGetIndex(self, h: Handle) -> int:
        return self._h(h)

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        return f"GPU-0000000{self._h(h)}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, h: Handle) -> bytes:
        self._h(h)
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Any:
        i = self._h(h)
        used = (2 + 10 * self.busy_util[i] // 100) * GIB
        return SimpleNamespace(total=80 * GIB, used=used, free=80 * GIB - used)

    def nvmlDeviceGetPciInfo(self, h: Handle) -> Any:
        return SimpleNamespace(busId=self.bus(self._h(h)).encode())

    def nvmlDeviceGetNumaNodeId(self, h: Handle) -> int:
        return 0 if self._h(h) < self.count // 2 else 1

    def nvmlDeviceGetCpuAffinity(self, h: Handle, words: int) -> list[int]:
        numa = 0 if self._h(h) < self.count // 2 else 1
        mask = ((1 << 24) - 1) << (24 * numa)
        return [mask >> (64 * w) & (2**64 - 1) for w in range(words)]

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        return [1, 1] if self._h(h) == self.count - 1 else [0, 0]

    # -- topology
    def _peers(self, i: int) -> list[int]:
        first = i // self.island * self.island
        return [j for j in range(first, first + self.island) if j != i]

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        self._h(h)
        if link >= 4 * (self.island - 1):
            raise NVMLError(2)  # past this GPU's last link
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Handle, link: int) -> Any:
        i = self._h(h)
        if self.nvswitch:
            return SimpleNamespace(busId=SWITCH_BUS.encode())
        return SimpleNamespace(busId=self.bus(self._peers(i)[link // 4]).encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Handle, link: int) -> int:
        self._h(h)
        return 2 if self.nvswitch else 0

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        i, j = self._h(a), self._h(b)
        return 40 if (i < self.count // 2) == (j < self.count // 2) else 50

    # -- events and memory health
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: Handle) -> int:
        self._h(h)
        return 0xFF

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: str) -> None:
        self.registered[self._h(h)] = types

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never blocks the agent
        if not self.events:
            raise NVMLError(10)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    def xid(self, i: int, xid: int) -> None:
        self.events.append(SimpleNamespace(device=Handle(i), eventType=0x8, eventData=xid))

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, error_type: int, counter: int) -> int:
        self._h(h)
        raise NVMLError(3)  # ECC off: not supported

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Handle) -> int:
        self._h(h)
        return 0

    def nvmlDeviceGetRemappedRows(self, h: Handle) -> tuple[int, int, int, int]:
        return self.remapped[self._h(h)]

    # -- telemetry
    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        return SimpleNamespace(gpu=self.busy_util[self._h(h)], memory=0)

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        return 35 + self._h(h)

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return 100_000 + 5_000 * self.busy_util[self._h(h)]  # milliwatts

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.procs.get(self._h(h), [])]


def provider(nv: FakeNvml | None = None) -> tuple[NvmlProvider, FakeNvml]:
    nv = nv or FakeNvml()
    return NvmlProvider(nv, cpus=48), nv


def test_discovery_two_nvlink_islands_of_four() -> None:
    p, nv = provider()
    gpus = p.discover()
    assert [g.index for g in gpus] == list(range(8))
    g0, g7 = gpus[0], gpus[7]
    assert g0.uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert g0.model == "NVIDIA H100 80GB HBM3"
    assert g0.memory_mib == 80 * 1024
    assert g0.pci_bus_id == "00000000:18:00.0"
    assert (g0.numa_node, g0.cpu_affinity) == (0, "0-23")
    assert (g7.numa_node, g7.cpu_affinity) == (1, "24-47")
    assert (g0.mig_enabled, g7.mig_enabled) == (False, True)
    assert all(g.healthy for g in gpus)
    links = {lk.peer: (lk.level, lk.nvlinks) for lk in g0.links}
    assert links == {1: (pb.LINK_NVLINK, 4), 2: (pb.LINK_NVLINK, 4), 3: (pb.LINK_NVLINK, 4),
                     4: (pb.LINK_SYSTEM, 0), 5: (pb.LINK_SYSTEM, 0), 6: (pb.LINK_SYSTEM, 0), 7: (pb.LINK_SYSTEM, 0)}
    assert islands_of(gpus) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nv.registered == {i: 0xA for i in range(8)}  # XID and double-bit ECC events on every GPU

    # What the RM makes of the registration: the same islands, for the AM's planner.
    reg = pb.RegisterNodeRequest(node_id="n1", host="h", agent_port=1, rack="r", gpus=[g.to_proto() for g in gpus])
    r = convert.registration_from_pb(reg)
    cluster = Cluster()
    cluster.upsert(Node(node_id="n1", host="h", port=1, rack="r", ib_domain="r", gpus={g.index: g for g in r.gpus}))
    assert cluster.nodes["n1"].islands == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert convert.node_view_to_pb(cluster.nodes["n1"]).islands[1].gpus == [4, 5, 6, 7]

    text = as_text(Discovery("nvml", gpus))
    assert "GPU0  X     NV4   NV4   NV4   SYS" in text
    assert text.rstrip().endswith("NVLink islands: [0,1,2,3] [4,5,6,7]")
    assert as_json(Discovery("nvml", gpus))["gpus"][0]["links"][0] == {"peer": 1, "level": "LINK_NVLINK",
                                                                         "nvlinks": 4}
    p.close()
    assert nv.shut


def test_nvswitch_server_is_one_island() -> None:
    p, _ = provider(FakeNvml(count=8, island=8, nvswitch=True))
    gpus = p.discover()
    assert islands_of(gpus) == [list(range(8))]
    assert {lk.nvlinks for lk in gpus[0].links} == {18}  # all 18 links (H100) go to the NVSwitches


def test_xid_79_takes_the_gpu_out_and_application_xids_do_not() -> None:
    p, nv = provider()
    gpus = p.discover()
    book = GpuHealthBook(gpus)
    assert p.poll_events() == []
    nv.xid(5, 13)  # graphics engine exception: the application's fault
    nv.xid(5, 79)
    nv.xid(5, 48)  # a consequence: the first cause stays
    events = p.poll_events()
    assert events == [GpuEvent(5, GpuEventKind.XID, xid=13), GpuEvent(5, GpuEventKind.XID, xid=79),
                      GpuEvent(5, GpuEventKind.XID, xid=48)]
    changes = book.observe(events, now=12.0)
    assert [(c.index, c.healthy, c.reason) for c in changes] == [(5, False, "XID 79 (GPU has fallen off the bus)")]
    assert changes[0].diagnostic == ("GPU 5 (GPU-00000005-aaaa-bbbb-cccc-dddddddddddd) failed: "
                                     "XID 79 (GPU has fallen off the bus)")
    assert (gpus[5].healthy, gpus[5].health_reason) == (False, "XID 79 (GPU has fallen off the bus)")
    assert [g.index for g in book.unhealthy()] == [5]
    assert book.observe(p.poll_events(), now=13.0) == []  # nothing new, and unhealthy is sticky


def test_gpu_lost_from_the_bus() -> None:
    p, nv = provider()
    gpus = p.discover()
    book = GpuHealthBook(gpus)
    nv.lost.add(2)
    samples = p.sample({})
    assert [s.index for s in samples] == [0, 1, 3, 4, 5, 6, 7]  # the lost GPU answers nothing
    events = p.poll_events()
    assert [(e.index, e.kind) for e in events] == [(2, GpuEventKind.LOST)]
    (change,) = book.observe(events, now=1.0)
    assert change.diagnostic == "GPU 2 (GPU-00000002-aaaa-bbbb-cccc-dddddddddddd) fell off the bus"
    assert p.poll_events() == []  # reported once; never queried again
    assert [s.index for s in p.sample({})] == [0, 1, 3, 4, 5, 6, 7]


def test_gpu_lost_at_discovery_is_registered_unhealthy() -> None:
    nv = FakeNvml()
    nv.lost.add(6)
    p, _ = provider(nv)
    gpus = p.discover()
    assert (gpus[6].healthy, gpus[6].health_reason) == (False, "fell off the bus")
    assert all(g.healthy for g in gpus if g.index != 6)
    assert all(lk.level == pb.LINK_LEVEL_UNSPECIFIED for lk in gpus[6].links)
    assert [(e.index, e.kind) for e in p.poll_events()] == [(6, GpuEventKind.LOST)]


def test_row_remapping_failure_is_an_ecc_fault() -> None:
    p, nv = provider()
    gpus = p.discover()
    nv.remapped[1] = (0, 3, 0, 1)
    nv.remapped[4] = (0, 1, 1, 0)
    changes = GpuHealthBook(gpus).observe(p.poll_events(), now=0.0)
    assert [(c.index, c.reason) for c in changes] == [(1, "row remapping failed"),
                                                      (4, "row remapping pending (reset needed)")]


def test_telemetry_values_and_container_summary() -> None:
    p, nv = provider()
    p.discover()
    nv.busy_util.update({0: 90, 1: 50})
    samples = p.sample({0: "c1", 1: "c1"})
    s0 = samples[0]
    assert (s0.util_pct, s0.memory_used_mib, s0.memory_total_mib, s0.temperature_c, s0.power_w) == (
        90, 11 * 1024, 80 * 1024, 35, 550.0)
    assert (samples[7].util_pct, samples[7].power_w) == (0, 100.0)
    summary = summarise(samples, {"c1": [0, 1], "c2": [7]})
    assert summary["c1"].util_avg_pct == 70
    assert summary["c1"].memory_max_mib == 11 * 1024
    assert summary["c1"].text() == "util 70% avg, mem 11.0/80.0 GiB max"
    assert summary["c2"].text() == "util 0% avg, mem 2.0/80.0 GiB max"


@pytest.mark.parametrize(("code", "expected"), [
    (12, "no GPUs: NVML is not available (libnvidia-ml.so not found); install the NVIDIA driver or set "
         "gpus: {fake: N} for a test node"),
    (9, "no GPUs: NVML is not available (the NVIDIA driver is not loaded); install the NVIDIA driver or set "
        "gpus: {fake: N} for a test node"),
])
def test_nvml_missing_is_one_clear_line(code: int, expected: str) -> None:
    with pytest.raises(GpuDiscoveryError) as info:
        NvmlProvider(FakeNvml(init_error=code))
    assert str(info.value) == expected
    assert "\n" not in str(info.value)


def test_helpers() -> None:
    assert cpulist([0b1111, 0]) == "0-3"
    assert cpulist([(1 << 63) | 1, 1]) == "0,63-64"
    assert cpulist([0]) == ""
    assert normalise_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert normalise_bus_id("0000:1a:00.0") == "0000:1a:00.0"


def test_process_memory_per_gpu_and_pid() -> None:
    p, nv = provider()
    p.discover()
    nv.procs = {2: [(100, 3 << 30), (101, None), (100, 1 << 30)], 3: [(200, 512 << 20)]}
    nv.lost.add(3)
    # pid 100 twice (two contexts) sums; a process whose memory the driver cannot tell is left out; a lost GPU and
    # one not asked about answer nothing.
    assert p.process_memory([2, 3]) == {2: {100: 4096}}
    assert p.process_memory([0]) == {0: {}}
