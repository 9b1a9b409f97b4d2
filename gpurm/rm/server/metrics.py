"""The RM's Prometheus metrics (prometheus-client), served at `/metrics` on the RM's HTTP server.

Two kinds: what the RM's records say at scrape time (GPUs by state, nodes by state, jobs by state, each queue's
fair shares against its usage; preemptions and retries summed over the job records, so they survive an RM restart
and never count twice), and latencies the shell observes as they happen (scheduling passes, allocate calls, every
RPC by method and status, store commits). One registry per RM (no global state): two RMs in one process (tests)
never mix their numbers. Names follow Prometheus' conventions (`gpurm_` prefix, `_seconds`, `_total`); states are
spelled as in the CLI's JSON (`RUNNING`, `SUCCEEDED`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpurm.common.model import JobState
from gpurm.rm.state.cluster import SHARED, NodeState

if TYPE_CHECKING:
    from gpurm.rm.state.core import RMCore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Buckets from a sub-millisecond allocate to a multi-second pass on a big cluster.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   10.0)


def gpu_states(core: RMCore) -> Counter[str]:
    """GPUs of nodes not decommissioned by state: free, used (whole), shared, unhealthy, unavailable (on a node
    that is lost, draining or unhealthy as a whole)."""
    out: Counter[str] = Counter({"free": 0, "used": 0, "shared": 0, "unhealthy": 0, "unavailable": 0})
    for node in core.cluster.nodes.values():
        if node.state is NodeState.DECOMMISSIONED:
            continue
        for index, gpu in node.gpus.items():
            holder = node.allocated.get(index)
            if not gpu.healthy:
                out["unhealthy"] += 1
            elif holder == SHARED:
                out["shared"] += 1
            elif holder is not None:
                out["used"] += 1
            elif node.offering:
                out["free"] += 1
            else:
                out["unavailable"] += 1
    return out


class RecordsCollector(Collector):
    """What the RM's records say, read at scrape time."""

    def __init__(self, core: Callable[[], RMCore],
                 retired: Callable[[], Mapping[str, tuple[int, int]]] | None = None) -> None:
        self.core = core          # a callable: the shell replaces its core when it rolls back to the store
        # Jobs that left memory (rm/state/retention.py): (preemptions, retries) per queue, so the counters never drop.
        self.retired = retired or dict

    def collect(self) -> Iterator[Metric]:
        core = self.core()
        gpus = GaugeMetricFamily("gpurm_gpus", "GPUs by state", labels=["state"])
        for label, n in sorted(gpu_states(core).items()):
            gpus.add_metric([label], n)
        yield gpus
        nodes = GaugeMetricFamily("gpurm_nodes", "Nodes by state", labels=["state"])
        by_state = Counter(n.state.name for n in core.cluster.nodes.values())
        for state in NodeState:
            nodes.add_metric([state.name], by_state.get(state.name, 0))
        yield nodes
        yield CounterMetricFamily("gpurm_nodes_lost", "Nodes declared LOST since this RM started",
                                  value=core.lost_nodes)
        yield GaugeMetricFamily("gpurm_heartbeat_interval_seconds", "The heartbeat interval the RM names to its "
                                "agents (it grows with the fleet: heartbeat.max_rate)",
                                value=core.beats.terms.interval_s)
        yield GaugeMetricFamily("gpurm_node_expiry_seconds", "How long a node may be silent before it is LOST, now",
                                value=core.beats.expiry_s(time.time()))
        yield CounterMetricFamily("gpurm_containers_lost", "Containers ended as LOST (their node or agent lost "
                                  "them) since this RM started", value=core.lost_containers)
        yield CounterMetricFamily("gpurm_borrowing_preemptions", "Borrowers (jobs beyond their queue's steady share) "
                                  "preempted for better-ranked waiting jobs under a borrowing policy, since this RM "
                                  "started", value=core.borrow.preemptions)
        yield from self._jobs(core)
        yield from self._queues(core)

    def _jobs(self, core: RMCore) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("gpurm_jobs", "Jobs by state and queue", labels=["state", "queue"])
        preemptions = CounterMetricFamily("gpurm_preemptions", "Attempts preempted (fair share, in-queue)",
                                          labels=["queue"])
        retries = CounterMetricFamily("gpurm_retries", "Attempts that failed and were retried", labels=["queue"])
        states: Counter[tuple[str, str]] = Counter()
        preempted: Counter[str] = Counter()
        retried: Counter[str] = Counter()
        for job in core.jobs.values():
            states[(job.state.name, job.queue)] += 1
            preempted[job.queue] += job.preemptions
            retried[job.queue] += max(0, len(job.attempts) - 1 - job.preemptions)
        for queue, (p, r) in self.retired().items():
            preempted[queue] += p
            retried[queue] += r
        queues = sorted({q for _, q in states} | {q.path for q in core.queues.tree.leaves} | set(self.retired()))
        for queue in queues:
            for state in JobState:
                jobs.add_metric([state.name, queue], states.get((state.name, queue), 0))
            preemptions.add_metric([queue], preempted.get(queue, 0))
            retries.add_metric([queue], retried.get(queue, 0))
        yield jobs
        yield preemptions
        yield retries

    def _queues(self, core: RMCore) -> Iterator[Metric]:
        book = core.queues
        shares = book.shares(core.cluster.capacity)
        families = {
            "used": GaugeMetricFamily("gpurm_queue_used_gpus", "GPUs a queue uses (shares by fraction)",
                                      labels=["queue"]),
            "pending": GaugeMetricFamily("gpurm_queue_pending_gpus", "GPUs a queue's unfinished jobs still want",
                                         labels=["queue"]),
            "steady": GaugeMetricFamily("gpurm_queue_steady_share_gpus", "A queue's steady fair share",
                                        labels=["queue"]),
            "inst": GaugeMetricFamily("gpurm_queue_fair_share_gpus", "A queue's instantaneous fair share",
                                      labels=["queue"]),
            "min": GaugeMetricFamily("gpurm_queue_min_gpus", "A queue's guaranteed minimum", labels=["queue"]),
        }
        for q in book.tree.walk():
            if q.parent is None:
                continue
            used = book.used.get(q.path, 0.0)
            families["used"].add_metric([q.path], used)
            families["pending"].add_metric([q.path], max(0.0, book.demand.get(q.path, 0.0) - used))
            families["steady"].add_metric([q.path], shares.steady.get(q.path, 0))
            families["inst"].add_metric([q.path], shares.instantaneous.get(q.path, 0))
            families["min"].add_metric([q.path], q.min_gpus)
        yield from families.values()


def leader_gauge(registry: CollectorRegistry, leads: bool) -> Gauge:
    """`gpurm_rm_leader`: 1 on the RM that serves, 0 on a standby (rm/http/standby.py); over the RMs of a set the
    sum should always be 1."""
    gauge = Gauge("gpurm_rm_leader", "1 on the RM that leads (serves), 0 on a standby", registry=registry)
    gauge.set(1 if leads else 0)
    return gauge


def standby_metrics() -> bytes:
    """What a standby's /metrics answers: the leader gauge at 0."""
    registry = CollectorRegistry(auto_describe=True)
    leader_gauge(registry, False)
    return generate_latest(registry)


class RMMetrics:
    """The registry, its collector of records, and the latency histograms the shell observes."""

    def __init__(self, core: Callable[[], RMCore],
                 retired: Callable[[], Mapping[str, tuple[int, int]]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(RecordsCollector(core, retired))
        self.schedule_seconds = Histogram("gpurm_schedule_pass_seconds", "Scheduling pass duration",
                                          registry=self.registry, buckets=LATENCY_BUCKETS)
        self.allocate_seconds = Histogram("gpurm_allocate_seconds", "AM allocate call handling time",
                                          registry=self.registry, buckets=LATENCY_BUCKETS)
        self.rpc_seconds = Histogram("gpurm_rpc_seconds", "gRPC handling time by method and status",
                                     ["method", "code"], registry=self.registry, buckets=LATENCY_BUCKETS)
        self._rpc_children: dict[tuple[str, str], Histogram] = {}
        self.loop_lag_seconds = Histogram("gpurm_event_loop_lag_seconds", "How late the RM's event loop runs a "
                                          "timer (every request and heartbeat waits this long first)",
                                          registry=self.registry, buckets=LATENCY_BUCKETS)
        self.commit_seconds = Histogram("gpurm_store_commit_seconds", "Store commit time (a write the RM waits "
                                        "on before it answers)", registry=self.registry, buckets=LATENCY_BUCKETS)
        self.leader = leader_gauge(self.registry, True)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        child = self._rpc_children.get((method, code))
        if child is None:        # labels() takes a lock and builds its key each call: once per method and status
            child = self._rpc_children[(method, code)] = self.rpc_seconds.labels(method, code)
        child.observe(seconds)
        if method == "Allocate":
            self.allocate_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
