"""Records <-> protobuf messages, at the RM's edge (what the AM converts too is gpurm/common/convert.py)."""

from __future__ import annotations

from collections.abc import Iterable

from gpurm.am.placement import ServerView
from gpurm.common.convert import (
    CONTAINER_STATE_NAMES,
    FAILURE_FROM_PB,
    FAILURE_TO_PB,
    JOB_STATE_FROM_PB,
    JOB_STATE_TO_PB,
    learner_from_pb,
    learner_to_pb,
    ms,
)
from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import spec_to_proto
from gpurm.common.model import Attempt, Container, ContainerPhase, ExitKind, FailureKind, Job, JobState
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.cluster import SHARED, Node, NodeState
from gpurm.rm.state.messages import AttemptUpdate, ContainerReport, NodeRegistration

# The shared conversions are part of the RM's vocabulary too (callers write `convert.ms`, `convert.JOB_STATE_TO_PB`).
__all__ = [
    "CONTAINER_STATE_NAMES", "FAILURE_FROM_PB", "FAILURE_TO_PB", "JOB_STATE_FROM_PB", "JOB_STATE_TO_PB",
    "NODE_STATE_TO_PB", "ask_from_pb", "attempt_to_pb", "attempt_update_from_pb", "attempt_update_to_pb",
    "container_status_to_pb", "gpu_from_pb", "gpu_to_pb", "job_to_pb", "learner_from_pb", "learner_to_pb", "ms",
    "node_to_pb", "node_view_to_pb", "registration_from_pb", "report_from_pb",
]

NODE_STATE_TO_PB = {
    NodeState.RUNNING: pb.NODE_RUNNING, NodeState.UNHEALTHY: pb.NODE_UNHEALTHY, NodeState.LOST: pb.NODE_LOST,
    NodeState.DRAINING: pb.NODE_DRAINING, NodeState.DECOMMISSIONED: pb.NODE_DECOMMISSIONED,
}

def attempt_to_pb(a: Attempt) -> pb.Attempt:
    return pb.Attempt(attempt=a.number, state=JOB_STATE_TO_PB[a.state], start_ms=ms(a.start_time),
                      end_ms=ms(a.end_time), learners=[learner_to_pb(x) for x in a.learners],
                      failure=FAILURE_TO_PB[a.failure], cause=a.cause, exit_code=a.exit_code,
                      counts_as_failure=a.counts_as_failure, level=a.level, am_attempt=a.am_attempt)


def job_to_pb(job: Job, gpus_held: int = 0, live_containers: int = 0, preemptible: bool = False) -> pb.Job:
    return pb.Job(
        job_id=job.job_id, spec=spec_to_proto(job.spec), user=job.user, queue=job.queue,
        state=JOB_STATE_TO_PB[job.state], submit_ms=ms(job.submit_time), start_ms=ms(job.start_time),
        finish_ms=ms(job.finish_time), attempts=[attempt_to_pb(a) for a in job.attempts],
        diagnostics=job.diagnostics, exit_code=job.exit_code, am_attempt=job.am_attempt, am_node=job.am_node,
        gpus_held=gpus_held, preemptible=preemptible, preemptions=job.preemptions, failures=job.failures,
        live_containers=live_containers, waiting_reason=job.waiting_reason, attained_gpu_s=job.attained_gpu_s,
        target_gpus=job.target_gpus,
    )


def attempt_update_from_pb(msg: pb.AttemptReport) -> AttemptUpdate:
    return AttemptUpdate(
        number=msg.attempt, state=JOB_STATE_FROM_PB.get(msg.state, JobState.ALLOCATING),
        learners=[learner_from_pb(x) for x in msg.learners], waiting_reason=msg.waiting_reason[:2000],
        level=msg.level[:32], failure=FAILURE_FROM_PB.get(msg.failure, FailureKind.NONE), cause=msg.cause[:4000],
        exit_code=msg.exit_code, counts_as_failure=msg.counts_as_failure, start_time=msg.start_ms / 1000,
        end_time=msg.end_ms / 1000,
    )


def attempt_update_to_pb(u: AttemptUpdate) -> pb.AttemptReport:
    return pb.AttemptReport(
        attempt=u.number, state=JOB_STATE_TO_PB[u.state], learners=[learner_to_pb(x) for x in u.learners],
        waiting_reason=u.waiting_reason, level=u.level, failure=FAILURE_TO_PB[u.failure], cause=u.cause,
        exit_code=u.exit_code, counts_as_failure=u.counts_as_failure, start_ms=ms(u.start_time),
        end_ms=ms(u.end_time))


def ask_from_pb(msg: pb.ResourceAsk) -> Ask:
    return Ask(gpus=msg.gpus, count=max(msg.count, 1), node_id=msg.node_id, rack=msg.rack,
               preferred=tuple(msg.gpu_indices), elastic=msg.elastic, share_milli=max(msg.gpu_share_milli, 0))


def report_from_pb(msg: pb.ContainerStatus) -> ContainerReport:
    return ContainerReport(container_id=msg.container_id, state=CONTAINER_STATE_NAMES.get(msg.state, "STARTING"),
                           pid=msg.pid, exit_code=msg.exit_code, signal=msg.signal, stopped=msg.stopped,
                           diagnostics=msg.diagnostics[:2000], infra_failure=msg.infra_failure, job_id=msg.job_id,
                           user_error=msg.user_error)


def container_status_to_pb(c: Container) -> pb.ContainerStatus:
    if c.phase is ContainerPhase.RUNNING:
        state = pb.CONTAINER_RUNNING
    elif c.phase is ContainerPhase.ALLOCATED:
        state = pb.CONTAINER_STARTING
    elif c.exit.kind is ExitKind.FAILED_TO_START:
        state = pb.CONTAINER_FAILED_TO_START
    elif c.exit.kind in (ExitKind.LOST, ExitKind.EXPIRED):
        state = pb.CONTAINER_LOST
    else:
        state = pb.CONTAINER_EXITED
    return pb.ContainerStatus(
        container_id=c.container_id, job_id=c.job_id, state=state, pid=c.pid, exit_code=c.exit.exit_code,
        signal=c.exit.signal, stopped=c.exit.kind in (ExitKind.STOPPED, ExitKind.RELEASED),
        diagnostics=c.exit.describe() if c.exit.kind is not ExitKind.NONE else "",
        start_ms=ms(c.started), end_ms=ms(c.finished), gpu_indices=c.gpu_indices, node_id=c.node_id,
        infra_failure=c.exit.infra, user_error=c.exit.user_error,
        kind=pb.CONTAINER_AM if c.kind.name == "AM" else pb.CONTAINER_LEARNER,
    )


def gpu_from_pb(msg: pb.GpuInfo) -> GpuRecord:
    return GpuRecord(index=msg.index, uuid=msg.uuid, model=msg.model, memory_mib=msg.memory_mib,
                     pci_bus_id=msg.pci_bus_id, numa_node=msg.numa_node, cpu_affinity=msg.cpu_affinity,
                     mig_enabled=msg.mig_enabled, healthy=msg.healthy, health_reason=msg.health_reason[:500],
                     links=[(link.peer, int(link.level), link.nvlinks) for link in msg.links])


def gpu_to_pb(g: GpuRecord) -> pb.GpuInfo:
    return pb.GpuInfo(index=g.index, uuid=g.uuid, model=g.model, memory_mib=g.memory_mib, pci_bus_id=g.pci_bus_id,
                      numa_node=g.numa_node, cpu_affinity=g.cpu_affinity, mig_enabled=g.mig_enabled,
                      healthy=g.healthy, health_reason=g.health_reason,
                      links=[pb.GpuLink(peer=p, level=lvl, nvlinks=n) for p, lvl, n in g.links])  # type: ignore[arg-type]


def registration_from_pb(msg: pb.RegisterNodeRequest) -> NodeRegistration:
    return NodeRegistration(
        node_id=msg.node_id, host=msg.host, port=msg.agent_port, rack=msg.rack or "rack-0",
        ib_domain=msg.ib_domain or msg.rack or "rack-0", gpus=[gpu_from_pb(g) for g in msg.gpus], cpus=msg.cpus,
        memory_mib=msg.memory_mib, containers=[report_from_pb(c) for c in msg.containers],
        agent_version=msg.agent_version, agent_instance=msg.agent_instance, healthy=msg.healthy,
        health_report=msg.health_report[:2000], metrics_port=min(max(msg.metrics_port, 0), 65535),
        container_engine=_word(msg.container_engine), gpu_passing=_word(msg.gpu_passing),
        images=frozenset(image_names(msg.images)), follows_interval=msg.follows_interval)


MAX_NODE_IMAGES = 256   # images a node's list keeps (nodeagent/images.py reports at most as many)


def image_names(names: Iterable[str]) -> list[str]:
    """An agent's image names, checked: at most MAX_NODE_IMAGES of at most 256 printable characters."""
    return [n for n in list(names)[:MAX_NODE_IMAGES] if 0 < len(n) <= 256 and n.isprintable() and " " not in n]


def _word(text: str) -> str:
    """A short keyword an agent reports (engine, GPU passing): at most 32 letters, digits, '-' or '_'."""
    return "".join(ch for ch in text[:32] if ch.isalnum() or ch in "-_")


def node_to_pb(node: Node, with_gpus: bool = True) -> pb.NodeInfo:
    """`with_gpus` False: all but the GPUs (rm/server/viewcache.py adds them from its serialized copy)."""
    return pb.NodeInfo(
        node_id=node.node_id, host=node.host, agent_port=node.port, rack=node.rack, ib_domain=node.ib_domain,
        state=NODE_STATE_TO_PB[node.state],
        gpus=[gpu_to_pb(g) for _, g in sorted(node.gpus.items())] if with_gpus else [],
        gpus_total=len(node.gpus), gpus_free=node.free, cpus=node.cpus, memory_mib=node.memory_mib,
        last_heartbeat_ms=ms(node.last_heartbeat),
        containers=len({c for c in node.allocated.values() if c != SHARED}
                       | {c for holders in node.shared.values() for c in holders}),
        assignments=[pb.GpuAssignment(gpu_index=i, container_id=cid, job_id=cid.rsplit("-c", 1)[0],
                                      gpu_share_milli=node.shared.get(i, {}).get(cid, 0))
                     for i, holder in sorted(node.allocated.items())
                     for cid in (sorted(node.shared.get(i, {})) if holder == SHARED else [holder])],
        health_report=node.health_report, agent_version=node.agent_version, metrics_port=node.metrics_port,
        container_engine=node.container_engine, gpu_passing=node.gpu_passing, images=sorted(node.images))


def node_view_to_pb(node: Node, elastic: list[int] | None = None, reserved: ServerView | None = None) -> pb.NodeView:
    """A node as AMs plan on it; `reserved`: its planning view (rm/state/planview.py) where a reservation holds GPUs
    there, whose free GPUs then leave the reserved ones out."""
    if reserved is not None and reserved.reserved:
        return pb.NodeView(elastic_gpus=elastic or [], container_engine=node.container_engine,
                           images=sorted(node.images), node_id=node.node_id, rack=node.rack,
                           ib_domain=node.ib_domain, gpus_total=len(node.gpus),
                           free_gpus=[i for i in node.free_indices() if i not in set(reserved.reserved)],
                           state=NODE_STATE_TO_PB[node.state], gpus_healthy=node.healthy_gpus,
                           islands=[pb.NvlinkIsland(gpus=isl) for isl in node.islands],
                           reserved_gpus=list(reserved.reserved), reserved_for=reserved.reserved_for,
                           reserved_until_ms=ms(reserved.reserved_until))
    return pb.NodeView(elastic_gpus=elastic or [], container_engine=node.container_engine, images=sorted(node.images),
                       node_id=node.node_id, rack=node.rack, ib_domain=node.ib_domain, gpus_total=len(node.gpus),
                       free_gpus=node.free_indices(), state=NODE_STATE_TO_PB[node.state],
                       gpus_healthy=node.healthy_gpus,
                       islands=[pb.NvlinkIsland(gpus=isl) for isl in node.islands])
