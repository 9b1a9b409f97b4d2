"""Prometheus metrics: the RM's (records read at scrape time, latency histograms) and the agent's exporter (DCGM
names and labels, XID and ECC tallies). Rendered through prometheus-client's own text format and parsed back with
its parser; no sockets."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpurm.common.jobspec import JobSpec
from gpurm.nodeagent.gpus import GpuDevice, GpuEvent, GpuEventKind, GpuSample
from gpurm.nodeagent.metrics import AgentCollector, GpuReading, GpuTally
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.server.metrics import RMMetrics
from tests.unit.test_rm_core import cluster, launched, running

ROOT = Path(__file__).resolve().parents[2]


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_rm_reports_gpus_jobs_and_queues_from_its_records() -> None:
    core = cluster(2, gpus=4)
    job = core.submit(JobSpec(gpus=3, command=["x"]), "alice", 1.0)
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], 1.0)
    core.register_am(job.job_id, 1, 1.0)
    core.allocate(job.job_id, 1, 0, [Ask(gpus=3, node_id="n1")], [], [], 1.5)
    half = core.submit(JobSpec(gpus=1, command=["x"], gpu_share_milli=500), "bob", 2.0)
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], 2.0)
    core.register_am(half.job_id, 1, 2.0)
    core.allocate(half.job_id, 1, 0, [Ask(gpus=1)], [], [], 2.5)
    core.submit(JobSpec(gpus=8, command=["x"]), "carol", 3.0)
    metrics = RMMetrics(lambda: core)
    metrics.observe_rpc("Allocate", "OK", 0.003)
    metrics.observe_rpc("SubmitJob", "INVALID_ARGUMENT", 0.001)
    got = samples(metrics.render())
    assert got[("gpurm_gpus", (("state", "used"),))] == 3
    assert got[("gpurm_gpus", (("state", "shared"),))] == 1
    assert got[("gpurm_gpus", (("state", "free"),))] == 4
    assert got[("gpurm_nodes", (("state", "RUNNING"),))] == 2
    jobs = {labels: v for (name, labels), v in got.items() if name == "gpurm_jobs" and v}
    assert jobs == {(("queue", "root.default"), ("state", "ALLOCATING")): 2,
                    (("queue", "root.default"), ("state", "QUEUED")): 1}
    assert got[("gpurm_queue_used_gpus", (("queue", "root.default"),))] == 3.5
    assert got[("gpurm_queue_pending_gpus", (("queue", "root.default"),))] == 8.0
    assert got[("gpurm_queue_fair_share_gpus", (("queue", "root.default"),))] == 8
    assert got[("gpurm_preemptions_total", (("queue", "root.default"),))] == 0
    assert got[("gpurm_borrowing_preemptions_total", ())] == 0
    assert got[("gpurm_rpc_seconds_count", (("code", "INVALID_ARGUMENT"), ("method", "SubmitJob")))] == 1
    assert got[("gpurm_allocate_seconds_count", ())] == 1


def test_two_rms_never_mix_their_numbers() -> None:
    a, b = cluster(1, gpus=2), cluster(3, gpus=2)
    assert samples(RMMetrics(lambda: a).render())[("gpurm_gpus", (("state", "free"),))] == 2
    assert samples(RMMetrics(lambda: b).render())[("gpurm_gpus", (("state", "free"),))] == 6


def gpu(index: int, healthy: bool = True) -> GpuDevice:
    return GpuDevice(index=index, uuid=f"GPU-{index}", model="H100-80GB", memory_mib=81559,
                     pci_bus_id=f"0000:0{index}:00.0", healthy=healthy)


def test_the_agent_exports_dcgm_names_with_the_holding_job() -> None:
    tally = GpuTally()
    tally.observe([GpuEvent(1, GpuEventKind.XID, xid=79), GpuEvent(1, GpuEventKind.XID, xid=13),
                   GpuEvent(1, GpuEventKind.XID, xid=13), GpuEvent(0, GpuEventKind.ECC)])
    reading = GpuReading([GpuSample(0, 87, 40000, 81559, 71, 618.1), GpuSample(1, None, None, None, None, None)],
                         {0: "job-4-c7"}, {"job-4-c7": "job-4"}, Counter({"RUNNING": 1}))
    registry = CollectorRegistry()
    registry.register(AgentCollector("host-a", lambda: [gpu(0), gpu(1, healthy=False)], lambda: reading, tally,
                                     "node-7"))
    got = samples(generate_latest(registry))
    held = (("Hostname", "host-a"), ("UUID", "GPU-0"), ("gpu", "0"), ("gpurm_container", "job-4-c7"),
            ("gpurm_job", "job-4"), ("gpurm_node", "node-7"), ("modelName", "H100-80GB"))
    assert got[("DCGM_FI_DEV_GPU_UTIL", held)] == 87
    assert got[("DCGM_FI_DEV_FB_USED", held)] == 40000
    assert got[("DCGM_FI_DEV_FB_FREE", held)] == 41559
    assert got[("DCGM_FI_DEV_POWER_USAGE", held)] == 618.1
    idle = (("Hostname", "host-a"), ("UUID", "GPU-1"), ("gpu", "1"), ("gpurm_container", ""), ("gpurm_job", ""),
            ("gpurm_node", "node-7"), ("modelName", "H100-80GB"))
    assert ("DCGM_FI_DEV_GPU_UTIL", idle) not in got          # a GPU that reports nothing exports nothing
    assert got[("DCGM_FI_DEV_XID_ERRORS", idle)] == 13        # the last XID seen
    assert got[("gpurm_gpu_healthy", idle)] == 0 and got[("gpurm_gpu_healthy", held)] == 1
    node = ("gpurm_node", "node-7")
    assert got[("gpurm_gpu_xid_errors_total", (("Hostname", "host-a"), ("gpu", "1"), node, ("xid", "13")))] == 2
    assert got[("gpurm_gpu_ecc_events_total", (("Hostname", "host-a"), ("gpu", "0"), node))] == 1
    assert got[("gpurm_agent_containers", (("Hostname", "host-a"), node, ("state", "RUNNING")))] == 1


def test_the_grafana_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads((ROOT / "configs" / "grafana" / "gpurm-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    registry = CollectorRegistry()
    registry.register(AgentCollector("h", lambda: [gpu(0)], lambda: GpuReading([GpuSample(0, 1, 1, 2, 30, 70.0)]),
                                     GpuTally()))
    rm = RMMetrics(lambda: cluster(1, gpus=1))
    rm.observe_rpc("Allocate", "OK", 0.001)
    rm.schedule_seconds.observe(0.01)
    rm.commit_seconds.observe(0.01)
    exported = {s for text in (generate_latest(registry), rm.render())
                for s, _ in samples(text)} | {"gpurm_gpu_xid_errors_total"}   # a counter with no XID yet
    # Metric names, not the label names of `by (...)` groupings or `{label=...}` matchers.
    bare = [re.sub(r"by \([^)]*\)|\{[^}]*\}", "", e) for e in exprs]
    used = {name for e in bare for name in re.findall(r"\b(gpurm_[a-z_]+|DCGM_FI_[A-Z_]+)\b", e)}
    assert used and used <= exported, used - exported
