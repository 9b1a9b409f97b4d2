"""The agent's Prometheus exporter: per-GPU telemetry and health, named as NVIDIA's DCGM exporter names them.

Each agent serves `/metrics` on its own port (`metrics.listen` in the agent config; the RM learns the port at
registration and `gpurm nodes -o json` shows it). With mTLS configured the exporter serves HTTPS and asks for a
client certificate signed by the cluster's CA, like every other gpurm endpoint; without, it listens on loopback
by default. Values are read at scrape time from the agent's latest telemetry reading (`AgentMonitor`), so a scrape
never touches NVML itself.

DCGM's names: DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_FREE (MiB), DCGM_FI_DEV_GPU_TEMP
(C), DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_XID_ERRORS (the last XID seen), with DCGM's labels `gpu`, `UUID`,
`modelName`, `Hostname`, plus gpurm's `gpurm_node` (the node id) and `gpurm_job` and `gpurm_container` for the
container holding the GPU (not
`job`: Prometheus keeps that label for the scrape job). gpurm's own:
gpurm_gpu_healthy, gpurm_gpu_xid_errors_total (by XID), gpurm_gpu_ecc_events_total, gpurm_agent_containers.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpurm.common.tls import TLSConfig
from gpurm.nodeagent.gpus import GpuDevice, GpuEvent, GpuEventKind, GpuSample

log = logging.getLogger(__name__)

DCGM_LABELS = ["gpu", "UUID", "modelName", "Hostname", "gpurm_node", "gpurm_job", "gpurm_container"]


@dataclass
class GpuTally:
    """What the exporter counts between readings: XIDs by GPU and code, the last XID per GPU, ECC events."""

    xids: Counter[tuple[int, int]] = field(default_factory=Counter)
    last_xid: dict[int, int] = field(default_factory=dict)
    ecc: Counter[int] = field(default_factory=Counter)

    def observe(self, events: Sequence[GpuEvent]) -> None:
        for ev in events:
            if ev.kind is GpuEventKind.XID:
                self.xids[(ev.index, ev.xid)] += 1
                self.last_xid[ev.index] = ev.xid
            elif ev.kind is GpuEventKind.ECC:
                self.ecc[ev.index] += 1


@dataclass
class GpuReading:
    """The latest telemetry: samples, who holds each GPU (container id) and each container's job."""

    samples: list[GpuSample] = field(default_factory=list)
    holders: dict[int, str] = field(default_factory=dict)
    jobs: dict[str, str] = field(default_factory=dict)
    containers: Counter[str] = field(default_factory=Counter)     # live containers by state


class AgentCollector(Collector):
    def __init__(self, hostname: str, gpus: Callable[[], Sequence[GpuDevice]], reading: Callable[[], GpuReading],
                 tally: GpuTally, node_id: str = "") -> None:
        self.hostname = hostname
        self.node_id = node_id or hostname
        self.gpus = gpus
        self.reading = reading
        self.tally = tally

    def collect(self) -> Iterator[Metric]:
        reading = self.reading()
        devices = {g.index: g for g in self.gpus()}
        by_index = {s.index: s for s in reading.samples}

        def labels(index: int) -> list[str]:
            g = devices.get(index)
            cid = reading.holders.get(index, "")
            return [str(index), g.uuid if g else "", g.model if g else "", self.hostname, self.node_id,
                    reading.jobs.get(cid, ""), cid]

        gauges: dict[str, tuple[str, Callable[[GpuSample], float | None]]] = {
            "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %)", lambda s: s.util_pct),
            "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB)", lambda s: s.memory_used_mib),
            "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB)",
                                    lambda s: None if s.memory_total_mib is None or s.memory_used_mib is None
                                    else s.memory_total_mib - s.memory_used_mib),
            "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C)", lambda s: s.temperature_c),
            "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W)", lambda s: s.power_w),
        }
        for name, (doc, read) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=DCGM_LABELS)
            for index, sample in sorted(by_index.items()):
                value = read(sample)
                if value is not None:
                    family.add_metric(labels(index), float(value))
            yield family
        last = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered",
                                 labels=DCGM_LABELS)
        healthy = GaugeMetricFamily("gpurm_gpu_healthy", "1 while the GPU is in service, 0 once taken out",
                                    labels=DCGM_LABELS)
        for index in sorted(devices):
            last.add_metric(labels(index), float(self.tally.last_xid.get(index, 0)))
            healthy.add_metric(labels(index), 1.0 if devices[index].healthy else 0.0)
        yield last
        yield healthy
        xids = CounterMetricFamily("gpurm_gpu_xid_errors", "XID errors the driver reported, by GPU and XID",
                                   labels=["gpu", "xid", "Hostname", "gpurm_node"])
        for (index, xid), n in sorted(self.tally.xids.items()):
            xids.add_metric([str(index), str(xid), self.hostname, self.node_id], n)
        yield xids
        ecc = CounterMetricFamily("gpurm_gpu_ecc_events", "Uncorrectable ECC events (errors, retired pages "
                                  "pending, row remapping failures)", labels=["gpu", "Hostname", "gpurm_node"])
        for index in sorted(devices):
            ecc.add_metric([str(index), self.hostname, self.node_id], self.tally.ecc.get(index, 0))
        yield ecc
        containers = GaugeMetricFamily("gpurm_agent_containers", "Containers the agent knows by state",
                                       labels=["state", "Hostname", "gpurm_node"])
        for state, n in sorted(reading.containers.items()):
            containers.add_metric([state, self.hostname, self.node_id], n)
        yield containers


class MetricsServer:
    """The exporter's HTTP(S) server, in its own thread (prometheus-client's): `port` is the port it got."""

    def __init__(self, collector: AgentCollector, listen: str, tls: TLSConfig | None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(collector)
        host, _, port = listen.rpartition(":")
        kwargs: dict[str, Any] = {}
        if tls is not None:
            kwargs = {"certfile": str(tls.cert), "keyfile": str(tls.key), "client_cafile": str(tls.ca),
                      "client_auth_required": True}
        try:
            self._server, self._thread = start_http_server(int(port), host.strip("[]") or "127.0.0.1",
                                                           registry=self.registry, **kwargs)
        except OSError as exc:
            raise OSError(f"metrics.listen {listen}: cannot listen there ({exc.strerror or exc}); choose another "
                          "port in the agent config, or 0 for any free port") from None
        self.port = int(self._server.server_port)
        log.info("metrics for Prometheus at %s://%s:%d/metrics", "https" if tls else "http", host or "127.0.0.1",
                 self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
