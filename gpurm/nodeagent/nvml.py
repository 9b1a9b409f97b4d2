"""GPU discovery, health and telemetry through NVML (the `pynvml` module of the nvidia-ml-py package).

`NvmlProvider(nvml=module)` takes the module as an argument so tests can hand it a stand-in; by default it
imports pynvml. Discovery reports per GPU: index, UUID, name, memory, PCI bus id, NUMA node, CPU affinity, MIG
mode, and its link to every other GPU: NVLink (active links whose remote end is that GPU, or — on NVSwitch
systems — an NVSwitch both reach) else the PCIe/CPU level from nvmlDeviceGetTopologyCommonAncestor.

Health (`poll_events`): XID and double-bit ECC events from an NVML event set (waited on with a 0 ms timeout),
uncorrectable volatile ECC counts, retired pages pending, row remapping pending or failed; and any NVML query
answering NVML_ERROR_GPU_IS_LOST (during discovery, health checks or telemetry) reports the GPU as lost.
Queries a GPU does not support (ECC on a GeForce, row remapping before Ampere) are skipped from then on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpurm.nodeagent.gpus import GpuDevice, GpuDiscoveryError, GpuEvent, GpuEventKind, GpuLink, GpuSample
from gpurm.proto import gpurm_pb2 as pb

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# pynvml's values, used when a stand-in module leaves a constant out.
_DEFAULTS: dict[str, int] = {
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_NVLINK_MAX_LINKS": 18,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_DEVICE_MIG_ENABLE": 1,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_NVLINK_DEVICE_TYPE_GPU": 0,
    "NVML_NVLINK_DEVICE_TYPE_SWITCH": 2,
    "nvmlEventTypeXidCriticalError": 0x8,
    "nvmlEventTypeDoubleBitEccError": 0x2,
}
# nvmlDeviceGetTopologyCommonAncestor level -> LinkLevel
_TOPOLOGY = {0: pb.LINK_SINGLE, 10: pb.LINK_SINGLE, 20: pb.LINK_MULTIPLE, 30: pb.LINK_HOSTBRIDGE,
             40: pb.LINK_NODE, 50: pb.LINK_SYSTEM}
_SYSFS_PCI = Path("/sys/bus/pci/devices")
MAX_EVENTS_PER_POLL = 1000

NO_NVML_HINT = "install the NVIDIA driver or set gpus: {fake: N} for a test node"


class _Lost(Exception):
    """A query answered NVML_ERROR_GPU_IS_LOST (already recorded as an event)."""


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalise_bus_id(bus_id: str) -> str:
    """"00000000:18:00.0" and "0000:18:00.0" -> "0000:18:00.0" (lowercase, 4-digit domain: sysfs' form)."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def cpulist(words: list[int]) -> str:
    """NVML's CPU affinity bitmask (64-bit words, CPU 0 = bit 0 of word 0) as a cpulist: "0-23,48-71"."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]
    ranges: list[str] = []
    start = prev = None
    for c in cpus:
        if prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = c
    if start is not None:
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(ranges)


class NvmlProvider:
    """The GpuProvider of a real server. Safe to call from worker threads (one lock around NVML state)."""

    def __init__(self, nvml: Any = None, *, cpus: int = 0, sysfs_pci: Path = _SYSFS_PCI) -> None:
        if nvml is None:
            try:
                import pynvml

                nvml = pynvml
            except ImportError as exc:
                raise GpuDiscoveryError(
                    f"no GPUs: the pynvml module is missing ({exc}); install nvidia-ml-py, or set "
                    "gpus: {fake: N} for a test node") from None
        self.nv = nvml
        self.cpus = cpus
        self.sysfs_pci = sysfs_pci
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._devices: list[GpuDevice] = []
        self._lost: set[int] = set()
        self._pending: list[GpuEvent] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._event_set: Any = None
        self._closed = False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuDiscoveryError(self.init_problem(exc)) from None

    # ------------------------------------------------------------------ helpers

    def _const(self, name: str) -> int:
        return int(getattr(self.nv, name, _DEFAULTS[name]))

    def _code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def init_problem(self, exc: BaseException) -> str:
        """The one line an operator reads when nvmlInit fails."""
        code = self._code(exc)
        if code == self._const("NVML_ERROR_LIBRARY_NOT_FOUND"):
            return f"no GPUs: NVML is not available (libnvidia-ml.so not found); {NO_NVML_HINT}"
        if code == self._const("NVML_ERROR_DRIVER_NOT_LOADED"):
            return f"no GPUs: NVML is not available (the NVIDIA driver is not loaded); {NO_NVML_HINT}"
        if code == self._const("NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
            return ("no GPUs: NVML is not available (driver/library version mismatch: reboot or reload the "
                    "NVIDIA kernel module after a driver upgrade)")
        if code == self._const("NVML_ERROR_NO_PERMISSION"):
            return "no GPUs: NVML refused access (no permission to /dev/nvidia*); run the agent as root"
        return f"no GPUs: NVML failed to initialise ({exc}); {NO_NVML_HINT}"

    def _query(self, index: int, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args); a lost GPU is recorded (once) and raised as _Lost; other NVMLErrors pass through."""
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            code = self._code(exc)
            if code == self._const("NVML_ERROR_GPU_IS_LOST"):
                self._mark_lost(index, str(exc))
                raise _Lost from None
            if code == self._const("NVML_ERROR_RESET_REQUIRED") and index not in self._lost:
                self._lost.add(index)
                self._pending.append(GpuEvent(index, GpuEventKind.FAULT, detail="NVML: GPU requires reset"))
                raise _Lost from None
            raise

    def _try(self, index: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None when the GPU does not support it or it fails (a lost GPU raises _Lost)."""
        if (index, what) in self._unsupported:
            return None
        try:
            return self._query(index, fn, *args)
        except self.nv.NVMLError as exc:
            code = self._code(exc)
            if code in (self._const("NVML_ERROR_NOT_SUPPORTED"), self._const("NVML_ERROR_FUNCTION_NOT_FOUND")):
                self._unsupported.add((index, what))
            else:
                log.debug("GPU %d: %s failed: %s", index, what, exc)
            return None
        except AttributeError:  # an old pynvml without this function
            self._unsupported.add((index, what))
            return None

    def _mark_lost(self, index: int, detail: str = "") -> None:
        if index in self._lost:
            return
        self._lost.add(index)
        self._pending.append(GpuEvent(index, GpuEventKind.LOST, detail=f"NVML: {detail}" if detail else ""))
        log.error("GPU %d: NVML says the GPU is lost (fell off the bus)", index)

    # ------------------------------------------------------------------ discovery

    def discover(self) -> list[GpuDevice]:
        with self._lock:
            return self._discover()

    def _discover(self) -> list[GpuDevice]:
        nv = self.nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            raise GpuDiscoveryError(f"no GPUs: NVML cannot count the GPUs ({exc})") from None
        if count == 0:
            raise GpuDiscoveryError("no GPUs: NVML works but finds no GPU on this node; "
                                    "set gpus: {fake: 0} for a node without GPUs")
        self._handles, self._devices = [], []
        for i in range(count):
            self._devices.append(self._describe(i))
        self._links()
        self._register_events()
        return [GpuDevice(index=d.index, uuid=d.uuid, model=d.model, memory_mib=d.memory_mib,
                          pci_bus_id=d.pci_bus_id, numa_node=d.numa_node, cpu_affinity=d.cpu_affinity,
                          mig_enabled=d.mig_enabled, healthy=d.healthy, health_reason=d.health_reason,
                          links=list(d.links)) for d in self._devices]

    def _describe(self, i: int) -> GpuDevice:
        nv = self.nv
        dev = GpuDevice(index=i, uuid="", model="unknown", memory_mib=0, pci_bus_id="")
        try:
            handle = self._query(i, nv.nvmlDeviceGetHandleByIndex, i)
        except _Lost:
            handle = None
        except nv.NVMLError as exc:
            log.error("GPU %d: no NVML handle: %s", i, exc)
            handle = None
        self._handles.append(handle)
        if handle is None:
            dev.healthy, dev.health_reason = False, "NVML cannot open the GPU"
            if i in self._lost:
                dev.health_reason = "fell off the bus"
            return dev
        try:
            dev.uuid = _text(self._try(i, "uuid", nv.nvmlDeviceGetUUID, handle) or "")
            dev.model = _text(self._try(i, "name", nv.nvmlDeviceGetName, handle) or "unknown")
            mem = self._try(i, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
            dev.memory_mib = int(mem.total) // MIB if mem is not None else 0
            pci = self._try(i, "pci", nv.nvmlDeviceGetPciInfo, handle)
            dev.pci_bus_id = _text(pci.busId) if pci is not None else ""  # NVML's form: 00000000:18:00.0
            numa = self._try(i, "numa", getattr(nv, "nvmlDeviceGetNumaNodeId", None) or _missing, handle)
            dev.numa_node = int(numa) if numa is not None else self._sysfs_numa(dev.pci_bus_id)
            words = (self.cpus + 63) // 64 if self.cpus > 0 else 4
            mask = self._try(i, "affinity", nv.nvmlDeviceGetCpuAffinity, handle, words)
            dev.cpu_affinity = cpulist([int(w) for w in mask]) if mask is not None else ""
            mig = self._try(i, "mig", getattr(nv, "nvmlDeviceGetMigMode", None) or _missing, handle)
            dev.mig_enabled = bool(mig is not None and int(mig[0]) == self._const("NVML_DEVICE_MIG_ENABLE"))
        except _Lost:
            pass
        if i in self._lost:
            dev.healthy, dev.health_reason = False, "fell off the bus"
        return dev

    def _sysfs_numa(self, bus_id: str) -> int:
        if not bus_id:
            return -1
        try:
            value = int((self.sysfs_pci / normalise_bus_id(bus_id) / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return -1
        return value if value >= 0 else -1

    def _links(self) -> None:
        """Fill every device's links: NVLink peers (direct or through NVSwitches), else the PCIe level."""
        nv = self.nv
        n = len(self._devices)
        by_bus = {normalise_bus_id(d.pci_bus_id): d.index for d in self._devices if d.pci_bus_id}
        direct = [[0] * n for _ in range(n)]
        switch_links = [0] * n
        max_links = self._const("NVML_NVLINK_MAX_LINKS")
        switch_type = self._const("NVML_NVLINK_DEVICE_TYPE_SWITCH")
        for d in self._devices:
            h = self._handles[d.index]
            if h is None or d.index in self._lost:
                continue
            for link in range(max_links):
                try:
                    active = self._query(d.index, nv.nvmlDeviceGetNvLinkState, h, link)
                except _Lost:
                    break
                except nv.NVMLError:
                    # NOT_SUPPORTED: no NVLink at all; INVALID_ARGUMENT: past this GPU's last link.
                    if link == 0:
                        break
                    continue
                if not active:
                    continue
                try:
                    remote = self._query(d.index, nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                except (_Lost, nv.NVMLError):
                    continue
                peer = by_bus.get(normalise_bus_id(_text(remote.busId)))
                if peer is not None and peer != d.index:
                    direct[d.index][peer] += 1
                    continue
                kind = self._try(d.index, "nvlink_remote_type",
                                 getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None) or _missing, h, link)
                if kind is None or int(kind) == switch_type:
                    switch_links[d.index] += 1
        for d in self._devices:
            i = d.index
            h = self._handles[i]
            d.links = []
            for j in range(n):
                if j == i:
                    continue
                nvlinks = max(direct[i][j], direct[j][i])
                if not nvlinks and switch_links[i] and switch_links[j]:
                    nvlinks = min(switch_links[i], switch_links[j])
                if nvlinks:
                    d.links.append(GpuLink(j, pb.LINK_NVLINK, nvlinks))
                    continue
                level = pb.LINK_LEVEL_UNSPECIFIED
                hj = self._handles[j]
                if h is not None and hj is not None and i not in self._lost and j not in self._lost:
                    try:
                        raw = self._query(i, nv.nvmlDeviceGetTopologyCommonAncestor, h, hj)
                        level = _TOPOLOGY.get(int(raw), pb.LINK_LEVEL_UNSPECIFIED)
                    except (_Lost, nv.NVMLError) as exc:
                        log.debug("GPU %d-%d: no topology: %s", i, j, exc)
                d.links.append(GpuLink(j, level, 0))

    def _register_events(self) -> None:
        nv = self.nv
        wanted = self._const("nvmlEventTypeXidCriticalError") | self._const("nvmlEventTypeDoubleBitEccError")
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError) as exc:
            log.warning("NVML events unavailable (%s): XID errors will not be seen", exc)
            self._event_set = None
            return
        for d in self._devices:
            h = self._handles[d.index]
            if h is None or d.index in self._lost:
                continue
            try:
                supported = self._query(d.index, nv.nvmlDeviceGetSupportedEventTypes, h)
                types = int(supported) & wanted
                if types:
                    self._query(d.index, nv.nvmlDeviceRegisterEvents, h, types, self._event_set)
                else:
                    log.warning("GPU %d reports no XID events: its XID errors will not be seen", d.index)
            except _Lost:
                continue
            except (nv.NVMLError, AttributeError) as exc:
                log.warning("GPU %d: cannot watch XID events (%s)", d.index, exc)

    # ------------------------------------------------------------------ health

    def poll_events(self) -> list[GpuEvent]:
        with self._lock:
            if self._closed:
                return []
            self._drain_events()
            for d in self._devices:
                if d.index not in self._lost and self._handles[d.index] is not None:
                    try:
                        self._check_memory(d.index, self._handles[d.index])
                    except _Lost:
                        pass
            events, self._pending = self._pending, []
            return events

    def _drain_events(self) -> None:
        nv = self.nv
        if self._event_set is None:
            return
        xid_type = self._const("nvmlEventTypeXidCriticalError")
        dbe_type = self._const("nvmlEventTypeDoubleBitEccError")
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError as exc:
                if self._code(exc) != self._const("NVML_ERROR_TIMEOUT"):
                    log.warning("NVML event wait failed: %s", exc)
                return
            index = self._index_of(data.device)
            if index is None:
                log.warning("NVML event %#x (data %d) for a GPU this agent does not know", data.eventType,
                            data.eventData)
                continue
            etype = int(data.eventType)
            if etype & xid_type:
                self._pending.append(GpuEvent(index, GpuEventKind.XID, xid=int(data.eventData)))
            if etype & dbe_type:
                self._pending.append(GpuEvent(index, GpuEventKind.ECC, detail="double-bit ECC error"))

    def _index_of(self, handle: Any) -> int | None:
        for i, h in enumerate(self._handles):
            if h is handle:
                return i
        try:
            index = int(self.nv.nvmlDeviceGetIndex(handle))
        except (self.nv.NVMLError, AttributeError, TypeError):
            return None
        return index if 0 <= index < len(self._handles) else None

    def _check_memory(self, i: int, h: Any) -> None:
        nv = self.nv
        uncorrected = self._try(i, "ecc_uncorrected", nv.nvmlDeviceGetTotalEccErrors, h,
                                self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"), self._const("NVML_VOLATILE_ECC"))
        if uncorrected:
            self._pending.append(GpuEvent(i, GpuEventKind.ECC,
                                          detail=f"{int(uncorrected)} uncorrectable ECC errors since the last reset"))
        pending = self._try(i, "retired_pending", getattr(nv, "nvmlDeviceGetRetiredPagesPendingStatus", None)
                            or _missing, h)
        if pending is not None and int(pending) == self._const("NVML_FEATURE_ENABLED"):
            self._pending.append(GpuEvent(i, GpuEventKind.ECC, detail="retired pages pending (reset needed)"))
        rows = self._try(i, "remapped_rows", getattr(nv, "nvmlDeviceGetRemappedRows", None) or _missing, h)
        if rows is not None:
            _corr, _unc, is_pending, failed = (int(x) for x in rows)
            if failed:
                self._pending.append(GpuEvent(i, GpuEventKind.ECC, detail="row remapping failed"))
            elif is_pending:
                self._pending.append(GpuEvent(i, GpuEventKind.ECC, detail="row remapping pending (reset needed)"))

    # ------------------------------------------------------------------ telemetry

    def sample(self, busy: Mapping[int, str]) -> list[GpuSample]:
        del busy  # real GPUs know who uses them
        nv = self.nv
        out: list[GpuSample] = []
        with self._lock:
            if self._closed:
                return out
            for d in self._devices:
                h = self._handles[d.index]
                if h is None or d.index in self._lost:
                    continue
                i = d.index
                try:
                    util = self._try(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
                    mem = self._try(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
                    temp = self._try(i, "temperature", nv.nvmlDeviceGetTemperature, h,
                                     self._const("NVML_TEMPERATURE_GPU"))
                    power = self._try(i, "power", nv.nvmlDeviceGetPowerUsage, h)
                except _Lost:
                    continue
                out.append(GpuSample(
                    index=i,
                    util_pct=int(util.gpu) if util is not None else None,
                    memory_used_mib=int(mem.used) // MIB if mem is not None else None,
                    memory_total_mib=int(mem.total) // MIB if mem is not None else None,
                    temperature_c=int(temp) if temp is not None else None,
                    power_w=int(power) / 1000 if power is not None else None))  # NVML: milliwatts
        return out

    def process_memory(self, indices: Sequence[int]) -> dict[int, dict[int, int]]:
        nv = self.nv
        out: dict[int, dict[int, int]] = {}
        with self._lock:
            if self._closed:
                return out
            for i in indices:
                h = self._handles[i] if 0 <= i < len(self._handles) else None
                if h is None or i in self._lost:
                    continue
                try:
                    procs = self._try(i, "processes", nv.nvmlDeviceGetComputeRunningProcesses, h)
                except _Lost:
                    continue
                used: dict[int, int] = {}
                for p in procs or ():
                    mem = getattr(p, "usedGpuMemory", None)     # None where the driver cannot tell (MIG, Windows)
                    if mem is not None:
                        used[int(p.pid)] = used.get(int(p.pid), 0) + int(mem) // MIB
                out[i] = used
        return out

    def close(self) -> None:
        nv = self.nv
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._event_set is not None:
                try:
                    nv.nvmlEventSetFree(self._event_set)
                except (nv.NVMLError, AttributeError):
                    pass
                self._event_set = None
            try:
                nv.nvmlShutdown()
            except nv.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)


def _missing(*_args: Any) -> Any:
    raise AttributeError("this pynvml has no such function")
