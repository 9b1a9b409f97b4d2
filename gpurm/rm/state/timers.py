"""Time-driven work in the RM core (`tick`): lost nodes, grants never started, AMs that never registered or
went silent, stop orders repeated, preemption deadlines, and the preemption checks once a second; and what a
preemption sets on a job's containers (`preempt_job`) or a revoked grant (`revoke`). Functions of the core
(rm/state/core.py's RMCore, which calls them); pure, `now` passed in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.common.model import (
    Container,
    ContainerKind,
    ContainerPhase,
    ExitKind,
    ExitStatus,
    Job,
)
from gpurm.rm.sched import preemption
from gpurm.rm.state.stops import StopOrder

if TYPE_CHECKING:
    from gpurm.rm.state.core import RMCore

PREEMPT_CHECK_S = 1.0     # how often starvation is checked


def tick(core: RMCore, now: float) -> None:
    """Time-driven work: lost nodes, stuck AMs, grants never started, stop orders to repeat, preemption."""
    core.expire_nodes(now)
    if now >= core._next_preempt_check:
        core._next_preempt_check = now + PREEMPT_CHECK_S
        core.preempt(now)
        core.preempt_in_queue(now)
        core.preempt_borrowers(now)
        core.revoke_hoarded(now)
        if core.inqueue.freed_for and core.inqueue.expire_holds(now):
            core.pass_due = True
    s = core.settings
    for c in list(core.live.values()):
        if not c.phase.live:
            continue
        if c.stop_requested and core._never_started(c) \
                and now - max(c.created, core.recovered_at) > s.container_start_timeout_s:
            core._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics="stopped before it ever started"), now)
            continue
        if c.stop_requested:
            if core.stop_orders.resend_due(c.node_id, c.container_id, now, s.stop_resend_s):
                core.stop_orders.order(StopOrder(c.node_id, c.container_id, s.kill_grace_s, c.stop_reason))
            continue
        job = core.jobs.get(c.job_id)
        if c.preempt_deadline and now >= c.preempt_deadline:
            core._order_stop(c, s.kill_grace_s, f"preempted for queue {c.preempted_for.removeprefix('root.')}")
            continue
        if c.kind is ContainerKind.LEARNER and c.phase is ContainerPhase.ALLOCATED \
                and now - max(c.created, core.recovered_at) > s.container_start_timeout_s:
            core._order_stop(c, 0.0, "granted but never started")
            core._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=f"not started within "
                                         f"{s.container_start_timeout_s:g}s of its grant"), now)
        elif c.kind is ContainerKind.AM and job is not None and not job.state.terminal:
            app = core.apps.get(job.job_id)
            registered = app is not None and app.am_attempt == c.attempt and app.registered
            since = max(c.created, core.recovered_at)
            if not registered and now - since > s.am_register_timeout_s:
                core._order_stop(c, 0.0, "AM did not register in time")
                core._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=f"AM did not register within "
                                             f"{s.am_register_timeout_s:g}s", infra=True), now)
            elif registered and app is not None and now - app.last_seen > s.am_liveness_timeout_s:
                core._order_stop(c, 0.0, "AM stopped calling allocate")
                core._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=f"AM silent for "
                                             f"{s.am_liveness_timeout_s:g}s"), now)
        elif c.kind is ContainerKind.AM and job is not None and job.state.terminal \
                and now - job.finish_time > s.kill_grace_s + s.am_liveness_timeout_s:
            core._order_stop(c, s.kill_grace_s, "job finished")
    core.ams.launch(now)


def preempt_job(core: RMCore, job: Job, d: preemption.Decision, grace_s: float, now: float) -> None:
    deadline = now + grace_s
    ids = []
    for c in core.job_containers(job.job_id):
        if c.kind is ContainerKind.LEARNER and not c.preempt_deadline:
            c.preempt_deadline = deadline
            core.preempting[c.container_id] = None
            core._inqueue_touch(job)
            c.preempted_for = d.beneficiary
            core.reclaims.marked(d.beneficiary, c.gpus)
            core._container_changed(c)
            ids.append(c.container_id)
    app = core.apps.get(job.job_id)
    reason = f"preempted for queue {d.beneficiary.removeprefix('root.')}: {d.reason}"
    if app is not None:
        app.preempt_ids = ids
        app.preempt_deadline = deadline
        app.preempt_reason = reason
    job.waiting_reason = reason
    core._job_changed(job)


def revoke(core: RMCore, c: Container, diagnostics: str, now: float) -> None:
    core._order_stop(c, 0.0, "revoked")
    core._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=diagnostics), now)
