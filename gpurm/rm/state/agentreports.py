"""What agents tell the RM core: a node's registration (what it runs reconciled with the records), heartbeats
and the container reports they carry, a container's end (`complete`: GPUs, queue usage, reclaim ledger, its AM's
state and its job), node expiry and loss. Functions of the core (rm/state/core.py's RMCore, which calls them); pure,
`now` passed in."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpurm.common.model import (
    Container,
    ContainerKind,
    ContainerPhase,
    ExitKind,
    ExitStatus,
    JobState,
)
from gpurm.rm.sched import priority
from gpurm.rm.sched.reclaim import RECLAIM_HOLD_S
from gpurm.rm.state import attempts
from gpurm.rm.state.cluster import Node
from gpurm.rm.state.messages import (
    ContainerReport,
    HeartbeatAction,
    JobChanged,
    NodeRegistration,
)
from gpurm.rm.state.stops import StopOrder

if TYPE_CHECKING:
    from gpurm.rm.state.core import RMCore

log = logging.getLogger(__name__)


def register_node(core: RMCore, reg: NodeRegistration, session: str, now: float) -> list[StopOrder]:
    """Add or re-add a node; reconcile what it runs with the RM's records. Returns containers to stop."""
    node = core.nodes.admit(reg, session, now, core.index.on_node(reg.node_id), core.beats.terms.expiry_s)
    stops: list[StopOrder] = []
    reported = {r.container_id for r in reg.containers}
    for r in reg.containers:
        stop = core._apply_report(node, r, now)
        if stop is not None:
            stops.append(stop)
    for c in core.index.on_node(reg.node_id):
        if c.container_id in reported:
            continue
        if c.phase is ContainerPhase.RUNNING or c.started:
            core._complete(c, ExitStatus(ExitKind.LOST, diagnostics=f"agent on {reg.node_id} restarted "
                                         "without it", infra=True), now)
    core.stop_orders.drop_node(reg.node_id)
    for c in core.index.on_node(reg.node_id):
        if c.stop_requested:
            stops.append(StopOrder(c.node_id, c.container_id, core.settings.kill_grace_s, c.stop_reason))
    log.info("node %s registered (%s:%d, rack %s, %d GPUs, %d containers)", reg.node_id, reg.host, reg.port,
             node.rack, len(node.gpus), len(reg.containers))
    core.ams.launch(now)
    return stops


def node_heartbeat(core: RMCore, node_id: str, session: str, reports: Iterable[ContainerReport], now: float,
                   healthy: bool = True, health_report: str = "",
                   gpu_health: Iterable[tuple[int, bool, str]] = ()) -> HeartbeatAction:
    node = core.nodes.beat(node_id, session, now, healthy, health_report, gpu_health)
    if node is None:
        return HeartbeatAction.REREGISTER
    for r in reports:
        stop = core._apply_report(node, r, now)
        if stop is not None:
            core.stop_orders.order(stop)
    return HeartbeatAction.OK


def apply_report(core: RMCore, node: Node, r: ContainerReport, now: float) -> StopOrder | None:
    c = core.containers.get(r.container_id)
    if c is None or c.node_id != node.node_id:
        if r.live:
            return StopOrder(node.node_id, r.container_id, 0.0, "the RM does not know this container")
        return None
    if not c.phase.live:
        if r.live:
            return StopOrder(node.node_id, r.container_id, 0.0, c.stop_reason or "container already ended")
        return None
    if r.live:
        note = r.diagnostics[:300] if r.state == "STARTING" else ""
        if note != c.note:              # an image being pulled: `gpurm status` and the job's events show it
            c.note = note
            core._container_changed(c)
            core.outbox.append(JobChanged(c.job_id))
        if r.state == "RUNNING" and c.phase is not ContainerPhase.RUNNING:
            c.phase = ContainerPhase.RUNNING
            core.unstarted.pop(c.container_id, None)
            core._note_run_start(c, now)
            c.started = now
            core._runs_changed(c.job_id)
            c.pid = r.pid
            core._container_changed(c)
            core._update_learner(c)
        return None
    if r.state == "FAILED_TO_START":
        # An AM the agent refused for the job's own sake (its user may not run there) is the job's fault.
        # A learner the agent could not start is the node's fault unless the agent saw the job's own
        # (command not found, workdir missing): that one fails the job instead of moving it elsewhere.
        infra = (r.infra_failure or c.kind is not ContainerKind.AM) and not r.user_error
        exit_status = ExitStatus(ExitKind.FAILED_TO_START, diagnostics=r.diagnostics, infra=infra,
                                 user_error=r.user_error)
    elif r.state == "LOST":
        exit_status = ExitStatus(ExitKind.LOST, diagnostics=r.diagnostics, infra=True)
    else:
        kind = ExitKind.STOPPED if (r.stopped or c.stop_requested) else ExitKind.EXITED
        exit_status = ExitStatus(kind, r.exit_code, r.signal, r.diagnostics, r.infra_failure,
                                 user_error=r.user_error and kind is ExitKind.EXITED)
    if not c.started:
        c.started = now
    core._complete(c, exit_status, now)
    return None


def note_run_start(core: RMCore, c: Container, now: float) -> None:
    """A job's first learner to start after it ran nothing: if the LAS starvation guard is what let it run,
    its service counts afresh from here (the promotion sticks; see `priority`)."""
    job = core.jobs.get(c.job_id)
    if job is None or c.kind is not ContainerKind.LEARNER or any(
            x.started for x in core.live_by_job.get(c.job_id, {}).values()
            if x.kind is ContainerKind.LEARNER and x is not c):
        return
    served = job.attained_gpu_s - job.las_base_gpu_s
    if priority.las_promoted(now, job.idle_since, served, job.spec.gpus, core.settings.las_thresholds_gpu_s):
        job.las_base_gpu_s = job.attained_gpu_s          # (the standing caches key on it)
        core.dirty.jobs.add(job.job_id)


def expire_nodes(core: RMCore, now: float) -> list[str]:
    # After a restart, a node the store knew has until `resync_until` to register again (rm/state/resync.py):
    # a big fleet's agents come back over a spread, and none of them is lost for being in its tail. The expiry
    # follows the heartbeat interval in force, which grows with the fleet (rm/state/heartbeats.py).
    core.pace_beats(now)
    lost = core.nodes.late(now, core.beats.expiry_s(now), now < core.resync_until)
    for node_id in lost:
        core.mark_node_lost(node_id, f"missed {core.settings.missed_beats} heartbeats", now)
    return lost


def mark_node_lost(core: RMCore, node_id: str, why: str, now: float) -> None:
    core.nodes.lose(node_id, why)
    core.lost_nodes += 1
    core.stop_orders.drop_node(node_id)
    for c in core.index.on_node(node_id):
        core._complete(c, ExitStatus(ExitKind.LOST, diagnostics=f"node {node_id} lost ({why})", infra=True),
                       now)


def complete(core: RMCore, c: Container, exit_status: ExitStatus, now: float) -> None:
    if not c.phase.live:
        return
    c.phase = ContainerPhase.COMPLETED
    c.finished = now
    c.exit = exit_status
    if exit_status.kind is ExitKind.LOST:
        core.lost_containers += 1
    core.index.unindex_live(c)
    if c.gpus:
        core.pass_due = True
    core.cluster.release(c.node_id, c.gpu_indices, c.container_id)
    core.elastic.ended(c)
    job_of = core.jobs.get(c.job_id)
    if c.kind is ContainerKind.LEARNER and job_of is not None:
        core.queues.charge(job_of.queue, job_of.user, -c.amount)
    core.reclaims.ended(c, now)
    if c.preempt_deadline and c.gpus and core.inqueue.rooms_under_way:
        core.inqueue.freed(c.job_id, c.gpus, now + RECLAIM_HOLD_S)
    core._container_changed(c)
    core.stop_orders.ended(c.container_id)
    job = core.jobs.get(c.job_id)
    if job is None:
        return
    if c.started and c.gpus:
        job.attained_gpu_s += max(0.0, c.finished - c.started) * c.gpus
        core.dirty.jobs.add(job.job_id)
    if c.kind is ContainerKind.AM:
        core._am_ended(job, c, now)
    else:
        core._update_learner(c)
        app = core.apps.get(job.job_id)
        if app is not None:
            app.app.held_gpus = max(0, app.app.held_gpus - c.gpus)
            # Reclaimed before the AM ever saw the grant: just drop the grant.
            before = len(app.pending_grants)
            app.pending_grants = [g for g in app.pending_grants if g.container_id != c.container_id]
            if len(app.pending_grants) == before:
                app.completed.append(c)
    if c.kind is ContainerKind.LEARNER and c.preempt_deadline and job.state is JobState.RUNNING:
        # Its gang is broken: the job waits for its next attempt (the AM's report may come later).
        job.state = JobState.ALLOCATING
        core._job_changed(job)
    if c.kind is ContainerKind.LEARNER and not any(x.kind is ContainerKind.LEARNER
                                                     for x in core.job_containers(job.job_id)):
        job.idle_since = now
    if core.live_count(c.job_id) == 0 or job.state.terminal:
        core._job_changed(job)


def update_learner(core: RMCore, c: Container) -> None:
    job = core.jobs.get(c.job_id)
    if job is not None and attempts.follow_container(job, c):
        core._job_changed(job)
