"""The allocate protocol between an AM and the RM core: the per-AM state (`AppState`, made afresh after an RM
or AM restart with the ends and grants the AM may have missed), registration, each Allocate call (releases, attempt
reports, asks shaped and less the grants not yet seen, a retry by `response_id` answered from the last reply),
grants a held reply picks up, and the AM's finish. Functions of the core (rm/state/core.py's RMCore, which calls
them); pure, `now` passed in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.common.model import (
    Container,
    ContainerKind,
    ContainerPhase,
    ExitKind,
    ExitStatus,
    Job,
    JobState,
)
from gpurm.rm.sched.elastic import Growth
from gpurm.rm.sched.scheduler import App, Ask, Grant, shaped_asks, subtract_grants
from gpurm.rm.state import attempts
from gpurm.rm.state.messages import (
    AllocateResult,
    AppState,
    AttemptUpdate,
    ErrorCode,
    RequestError,
)

if TYPE_CHECKING:
    from gpurm.rm.state.core import RMCore


def app(core: RMCore, job_id: str, am_attempt: int) -> tuple[Job, AppState]:
    job = core.get_job(job_id)
    if am_attempt != job.am_attempt:
        raise RequestError(ErrorCode.FAILED_PRECONDITION,
                           f"am_attempt: {am_attempt} is not the current AM attempt ({job.am_attempt}) of "
                           f"{job_id}; this AM must exit")
    app = core.apps.get(job_id)
    if app is None or app.am_attempt != am_attempt:
        if job.state.terminal:
            raise RequestError(ErrorCode.FAILED_PRECONDITION, f"job {job_id} is already {job.state.name}")
        held = sum(c.gpus for c in core.job_containers(job_id) if c.kind is ContainerKind.LEARNER)
        app = AppState(App(job.job_id, job.queue, job.user, job.seq, held_gpus=held), am_attempt)
        # Ends that happened while no AM state existed (an RM restart, an AM restart) are delivered now;
        # the AM ignores ends it already knows, so repeating one is harmless.
        app.completed = core._ended_learners(job)
        # Grants the AM may never have seen (the reply was lost with a former RM, or went to a former AM):
        # offered again, so it uses or releases them; an AM ignores a grant it already holds.
        app.pending_grants = core._unlaunched_grants(job)
        core.apps[job_id] = app
    return job, app


def unlaunched_grants(core: RMCore, job: Job) -> list[Grant]:
    launched = {ln.container_id for ln in job.current_attempt.learners} if job.current_attempt else set()
    return [Grant(job.job_id, c.container_id, c.node_id, list(c.gpu_indices), c.preemptible)
            for c in core.job_containers(job.job_id)
            if core._never_started(c) and not c.stop_requested and c.container_id not in launched]


def ended_learners(core: RMCore, job: Job) -> list[Container]:
    attempt = job.current_attempt
    if attempt is None:
        return []
    found = (core.containers.get(ln.container_id) for ln in attempt.learners)
    return [c for c in found if c is not None and not c.phase.live]


def register_am(core: RMCore, job_id: str, am_attempt: int, now: float) -> tuple[Job, list[Container]]:
    """Register the job's current AM. Returns the job and its learner containers: those still running (to
    adopt) and those of the current attempt that ended (so a restarted AM learns how)."""
    job, app = core._app(job_id, am_attempt)
    if job.state.terminal:
        raise RequestError(ErrorCode.FAILED_PRECONDITION, f"job {job_id} is already {job.state.name}")
    core._mark_registered(job, app, now)
    if job.state is JobState.QUEUED:
        job.state = JobState.ALLOCATING
    job.waiting_reason = "its AM is planning a placement"
    core._job_changed(job)
    live = [c for c in core.job_containers(job_id) if c.kind is ContainerKind.LEARNER]
    return job, live + core._ended_learners(job)


def mark_registered(core: RMCore, job: Job, app: AppState, now: float) -> None:
    app.registered = True
    app.last_seen = now
    if app.am_attempt not in job.am_registered:
        job.am_registered.append(app.am_attempt)
        core._job_changed(job)


def allocate(core: RMCore, job_id: str, am_attempt: int, response_id: int, asks: list[Ask], releases: list[str],
             reports: list[AttemptUpdate], now: float, schedule: bool = True) -> AllocateResult:
    """Apply an AM's call and answer it. `schedule=False` leaves the scheduling pass to the caller (the
    daemon coalesces passes under load); grants made by a later pass go out with the next call."""
    job = core.get_job(job_id)
    if job.state.terminal and job.am_attempt == am_attempt:
        return AllocateResult(response_id, [], [], kill_requested=True)
    app_or_none = core.apps.get(job_id)
    if app_or_none is not None and app_or_none.am_attempt == am_attempt == job.am_attempt:
        app = app_or_none                 # the usual call: what _app would answer, without looking twice
    else:
        job, app = core._app(job_id, am_attempt)
    core._mark_registered(job, app, now)   # an AM that allocates has registered, even with a former RM
    if app.last_response is not None and response_id + 1 == app.response_id:
        return app.last_response          # a retry of the last call: same answer, nothing done twice
    if response_id != app.response_id:
        app.response_id = response_id     # the RM restarted since the AM's last call
    for cid in releases:
        core._release(job, cid, now)
    for report in reports:
        core._apply_attempt(job, report, now)
    if reports:
        # A report may name learners this RM did not know of (it restarted before the AM's report reached
        # it) whose ends it has already seen: those ends are owed to the AM too.
        queued = {c.container_id for c in app.completed} | app.delivered
        app.completed += [c for c in core._ended_learners(job) if c.container_id not in queued]
    asks = shaped_asks(asks, job.spec.gpu_share_milli)
    unseen = [(g.node_id, core.cluster.nodes[g.node_id].rack, len(g.gpu_indices)) for g in app.pending_grants]
    growth = [a for a in asks if a.elastic]
    if growth or job_id in core.elastic.growth:
        asks = [a for a in asks if not a.elastic]      # a rigid job's elastic asks are ignored
        growth = subtract_grants(growth, unseen) if growth and job.spec.elastic else []
        core.elastic.set_growth(Growth(job_id, job.queue, job.user, job.seq, growth))
        core.pass_due = core.pass_due or bool(growth)
    new_asks = subtract_grants(asks, unseen) if asks else []
    if new_asks != app.app.asks and new_asks:
        core.new_askers[job_id] = None
    app.app.asks = new_asks
    if app.app.asks:
        core.asking[job_id] = app
    else:
        core.asking.pop(job_id, None)
    if schedule:
        core.schedule(now)
    app.response_id += 1
    plan_now = job_id in core.nudged
    core.nudged.pop(job_id, None)
    result = AllocateResult(app.response_id, app.pending_grants, app.completed,
                            kill_requested=job.kill_requested, preempt_ids=app.preempt_ids,
                            preempt_deadline=app.preempt_deadline, preempt_reason=app.preempt_reason,
                            plan_now=plan_now, target_gpus=job.target_gpus,
                            expected_run_s=core.expected_run_s(job) if job.state is JobState.ALLOCATING else 0.0)
    app.delivered.update(c.container_id for c in app.completed)
    app.pending_grants, app.completed, app.preempt_ids = [], [], []
    app.last_response = result
    return result


def waits_for_pass(core: RMCore, job_id: str) -> bool:
    """Whether the AM's last call brought asks no pass has looked at yet (its reply may wait for the next)."""
    return job_id in core.new_askers and job_id in core.asking


def late_grants(core: RMCore, job_id: str, am_attempt: int, response_id: int) -> list[Grant]:
    """Grants made since the reply `response_id` was built, moved into that reply when the AM has made no
    call since (the shell held the reply for the next pass: a new ask is answered by the pass that serves
    it, not at the AM's next poll). A retry of that call gets them too."""
    app = core.apps.get(job_id)
    if app is None or app.am_attempt != am_attempt or app.response_id != response_id \
            or app.last_response is None or not app.pending_grants:
        return []
    grants, app.pending_grants = app.pending_grants, []
    app.last_response.grants.extend(grants)
    return grants


def release(core: RMCore, job: Job, container_id: str, now: float) -> None:
    c = core.containers.get(container_id)
    if c is None or c.job_id != job.job_id or not c.phase.live:
        return
    if c.phase is ContainerPhase.ALLOCATED and not c.pid:
        # Never seen running: free it now, and tell the agent so a racing start is refused.
        core._order_stop(c, 0.0, "released by its AM")
        core._complete(c, ExitStatus(ExitKind.RELEASED), now)
        app = core.apps.get(job.job_id)
        if app is not None:
            app.completed = [x for x in app.completed if x.container_id != container_id]
        return
    core._order_stop(c, core.settings.kill_grace_s, "released by its AM")


def apply_attempt(core: RMCore, job: Job, report: AttemptUpdate, now: float) -> None:
    applied, moved = attempts.apply_report(job, report, core.containers, core.cluster.nodes, now)
    if moved:
        core._inqueue_touch(job)         # its locality level decides what room helps it
    if applied:
        core._job_changed(job)


def finish_am(core: RMCore, job_id: str, am_attempt: int, final: JobState, diagnostics: str, exit_code: int,
              reports: list[AttemptUpdate], now: float) -> Job:
    job = core.get_job(job_id)
    if job.state.terminal:
        return job
    if am_attempt != job.am_attempt:
        raise RequestError(ErrorCode.FAILED_PRECONDITION,
                           f"am_attempt: {am_attempt} is not the current AM attempt of {job_id}")
    if not final.terminal:
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"final_state: must be SUCCEEDED, FAILED or KILLED, got {final.name}")
    for report in reports:
        core._apply_attempt(job, report, now)
    job.final_reported = True
    core._finish_job(job, final, diagnostics, now, exit_code)
    return job
