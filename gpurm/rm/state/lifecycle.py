"""A job's life in the RM core: submit, kill and `gpurm scale`, the end of a job (finished, failed, killed) and
what it leaves (the size gittins learns), its AM's start, a failed AM launch, an AM's end and its restart or the job's
failure. Functions of the core (rm/state/core.py's RMCore, which calls them); pure, `now` passed in."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import (
    Container,
    ContainerKind,
    ExitKind,
    ExitStatus,
    FailureKind,
    Job,
    JobState,
)
from gpurm.rm.sched.history import Finished
from gpurm.rm.state import admission
from gpurm.rm.state.messages import (
    ErrorCode,
    LaunchAM,
    RequestError,
)

if TYPE_CHECKING:
    from gpurm.rm.state.core import RMCore

log = logging.getLogger(__name__)


def submit(core: RMCore, spec: JobSpec, user: str, now: float, submit_id: str = "", groups: Iterable[str] = (),
           check_acl: bool = True) -> Job:
    if submit_id and submit_id in core.submit_ids:
        return core.jobs[core.submit_ids[submit_id]]
    queue = admission.admit(core.queues.tree, spec, user, groups, core.cluster.total_gpus, check_acl)
    seq = core.next_job_seq
    core.next_job_seq += 1
    core.dirty.meta = True
    job = Job(job_id=f"job-{seq}", spec=spec, user=user, queue=queue, submit_time=now, seq=seq,
              submit_id=submit_id, waiting_reason="waiting for its AM to start", idle_since=now)
    core.jobs[job.job_id] = job
    if submit_id:
        core.submit_ids[submit_id] = job.job_id
    core.queues.want(queue, spec.gpu_amount)
    core.ams.want(job)
    core._job_changed(job)
    if now - core.launched_at >= core.settings.am_launch_coalesce_s:
        core.launched_at = now
        core.ams.launch(now)
    else:
        core.launch_due = True      # a burst of submits: the daemon's pass loop launches for all of them at once
    return job


def kill(core: RMCore, job_id: str, user: str, reason: str, now: float, groups: Iterable[str] = (),
         rm_admin: bool = False) -> Job:
    job = core.get_job(job_id)
    if not core.may_kill(job, user, groups, rm_admin):
        raise RequestError(ErrorCode.PERMISSION_DENIED,
                           f"{user} may not kill {job_id}: only its owner ({job.user}), the admins of queue "
                           f"{job.queue.removeprefix('root.')} and RM admins may")
    if job.state.terminal:
        return job
    job.kill_requested = True
    why = f"killed by {user}" + (f": {reason}" if reason else "")
    attempt = job.current_attempt
    if attempt is not None and not attempt.state.terminal:
        attempt.state = JobState.KILLED
        attempt.failure = FailureKind.KILLED
        attempt.cause = why
        attempt.end_time = now
    core._finish_job(job, JobState.KILLED, why, now)
    return job


def scale(core: RMCore, job_id: str, gpus: int, user: str, now: float, groups: Iterable[str] = (),
          rm_admin: bool = False) -> Job:
    """`gpurm scale`: set an elastic job's target size, between its minimum and maximum. Its AM grows or
    shrinks toward it on its next call."""
    job = core.get_job(job_id)
    if not core.may_kill(job, user, groups, rm_admin):
        raise RequestError(ErrorCode.PERMISSION_DENIED,
                           f"{user} may not scale {job_id} (only its owner or an admin of its queue)")
    if job.state.terminal:
        raise RequestError(ErrorCode.FAILED_PRECONDITION, f"{job_id} has ended ({job.state.name})")
    if not job.spec.elastic:
        raise RequestError(ErrorCode.FAILED_PRECONDITION,
                           f"{job_id} is not elastic (gpus: {job.spec.gpus}); submit with --gpus MIN:MAX")
    if not job.spec.gpus <= gpus <= job.spec.max_gpus:
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"gpus: must be between the job's min {job.spec.gpus} and max {job.spec.max_gpus}, "
                           f"got {gpus}")
    job.target_gpus = gpus
    core._job_changed(job)
    return job


def finish_job(core: RMCore, job: Job, state: JobState, diagnostics: str, now: float, exit_code: int = 0) -> None:
    job.state = state
    job.finish_time = now
    job.diagnostics = diagnostics
    job.exit_code = exit_code
    job.waiting_reason = ""
    if state in (JobState.SUCCEEDED, JobState.FAILED):
        core._learn_size(job, now)
    core.queues.want(job.queue, -job.spec.gpu_amount)
    core.standings.forget(job.job_id)
    if core.inqueue.drop_holds(job.job_id):
        core.pass_due = True             # what was held for it may go to others now
    if job.admitted:
        core.queues.activate(job.queue, -1)
    core.ams.drop(job)
    core._am_gone(job)
    app = core.apps.pop(job.job_id, None)
    core.asking.pop(job.job_id, None)
    core.elastic.drop_job(job.job_id)
    if app is not None:
        app.app.asks = []
    for c in core.job_containers(job.job_id):
        # The AM of a job that finished normally exits by itself; everything else is stopped now.
        if c.kind is ContainerKind.AM and job.final_reported:
            continue
        # A grant not yet seen running may be starting right now (the AM launches before the agent says
        # so): its GPUs stay held until the agent reports it, or the start timeout takes it back.
        core._order_stop(c, core.settings.kill_grace_s, diagnostics or state.name.lower())
    core._job_changed(job)


def learn_size(core: RMCore, job: Job, now: float) -> None:
    """The history learns from jobs that ended on their own: the GPU-seconds it attained, its learners still
    running counted to now. A rebuilt Gittins table moves ranks: every queue's in-queue look is weighed afresh."""
    live = sum(c.gpus * (now - c.started) for c in core.live_by_job.get(job.job_id, {}).values()
               if c.kind is ContainerKind.LEARNER and c.started)
    version = core.history.version
    whole = core.history.finished(finished_record(job, job.attained_gpu_s + live))
    if whole or (core.history.version != version and core.ranks_by_history):
        core.inqueue.clear()


def finished_record(job: Job, size_gpu_s: float) -> Finished:
    """What a job that ended on its own teaches the history (rm/sched/history.py)."""
    return Finished(job.queue, job.user, job.spec.name, job.spec.gpu_amount, size_gpu_s)


def start_am(core: RMCore, job: Job, node_id: str, now: float) -> None:
    core.ams.drop(job)
    core._am_up(job)
    if not job.admitted:
        job.admitted = True
        core.queues.activate(job.queue, 1)
    job.am_attempt += 1
    c = Container(container_id=f"{job.job_id}-am{job.am_attempt}", job_id=job.job_id,
                  kind=ContainerKind.AM, node_id=node_id, gpu_indices=[], attempt=job.am_attempt,
                  created=now, user=job.user)
    core._add_container(c)
    job.am_container = c.container_id
    job.am_node = node_id
    if job.state is JobState.QUEUED:
        job.waiting_reason = f"starting its AM on {node_id}"
    core._job_changed(job)
    core.outbox.append(LaunchAM(job.job_id, c.container_id, node_id, job.am_attempt))


def am_launch_failed(core: RMCore, container_id: str, reason: str, now: float, agent_unreachable: bool = False,
                     job_fault: bool = False) -> None:
    """The shell could not start an AM container (agent unreachable, refused the token ...). An unreachable
    agent is the node's fault, not the job's: the node gets no AM until it is heard from again, and the
    failure does not count against the job's AM launch retries. `job_fault`: the agent refused the job itself
    (its user may not run there): the job fails at once, no retry can help."""
    c = core.containers.get(container_id)
    if c is None or not c.phase.live:
        return
    node = core.cluster.nodes.get(c.node_id)
    if agent_unreachable and node is not None:
        if node.unreachable_since is None:
            log.warning("node %s: agent unreachable (%s); no AM goes there until it is heard from", node.node_id,
                        reason)
        node.unreachable_since = now
        job = core.jobs.get(c.job_id)
        if job is not None and not job.state.terminal:
            job.am_launch_failures -= 1      # _am_ended counts it; this one was not the job's doing
    core._complete(c, ExitStatus(ExitKind.FAILED_TO_START, diagnostics=reason, infra=not job_fault), now)


def am_ended(core: RMCore, job: Job, c: Container, now: float) -> None:
    if job.am_container == c.container_id:
        job.am_container = ""
        core._am_gone(job)
    core.apps.pop(job.job_id, None)
    core.asking.pop(job.job_id, None)
    core.elastic.drop_job(job.job_id)
    if job.state.terminal or job.final_reported:
        return
    if c.attempt not in job.am_registered:
        if c.exit.kind is ExitKind.FAILED_TO_START and not c.exit.infra:
            core._fail_job(job, f"its AM could not start: {c.exit.describe()}", now, FailureKind.AM)
            return
        job.am_launch_failures += 1
        if job.am_launch_failures >= core.settings.am_launch_retries:
            core._fail_job(job, f"could not start the AM {job.am_launch_failures} times; last: "
                                f"{c.exit.describe()}", now, FailureKind.AM)
            return
        log.warning("AM %s of %s did not come up (%s); retrying", c.container_id, job.job_id,
                    c.exit.describe())
        job.waiting_reason = f"its AM did not start ({c.exit.describe()}); retrying"
    elif not c.exit.infra and (failed := _am_failures(core, job)) >= core.settings.am_max_attempts:
        core._fail_job(job, f"the AM failed {failed} times; last: {c.exit.describe()}", now, FailureKind.AM)
        return
    else:
        # A new AM adopts the learners that still run (work-preserving AM restart).
        log.warning("AM of %s ended (%s); starting AM attempt %d", job.job_id, c.exit.describe(),
                    job.am_attempt + 1)
        job.waiting_reason = f"AM attempt {job.am_attempt} ended ({c.exit.describe()}); restarting the AM"
    core.ams.want(job)
    core._job_changed(job)
    core.ams.launch(now)


def _am_failures(core: RMCore, job: Job) -> int:
    """The job's registered AMs that ended by their own fault: one its server took down with it (a lost node, the
    agent's fence) does not count against am.max_attempts, as YARN-614 has it."""
    return sum(1 for x in core.job_containers(job.job_id, live_only=False)
               if x.kind is ContainerKind.AM and not x.phase.live and x.attempt in job.am_registered
               and not x.exit.infra)


def fail_job(core: RMCore, job: Job, why: str, now: float, kind: FailureKind) -> None:
    attempt = job.current_attempt
    if attempt is not None and not attempt.state.terminal:
        attempt.state = JobState.FAILED
        attempt.failure = kind
        attempt.cause = why
        attempt.end_time = now
        attempt.counts_as_failure = True
    core._finish_job(job, JobState.FAILED, why, now, exit_code=0)
