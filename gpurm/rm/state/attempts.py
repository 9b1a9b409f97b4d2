"""Job attempts as the RM records them: an AM's attempt report folded into the job (its attempts, learners,
failure and preemption counts, and the job's state while it runs), and a learner's record following its
container (pid, running, how it ended). The agent's word on a container beats the AM's older view of it.
Pure functions over the records; the core marks what changed.
"""

from __future__ import annotations

from gpurm.common.model import Attempt, Container, ContainerPhase, ExitKind, FailureKind, Job, JobState
from gpurm.rm.state.cluster import Node
from gpurm.rm.state.messages import AttemptUpdate

ENDED_AS = {ExitKind.FAILED_TO_START: "FAILED_TO_START", ExitKind.LOST: "LOST"}   # else EXITED


def apply_report(job: Job, report: AttemptUpdate, containers: dict[str, Container], nodes: dict[str, Node],
                 now: float) -> tuple[bool, bool]:
    """Fold an AM's report of one attempt into the job: (applied, whether its locality level may have moved: a new
    attempt or another level). A report of an attempt that cannot exist is ignored."""
    if report.number < 1 or report.number > len(job.attempts) + 1:
        return False, False
    attempt = job.attempts[report.number - 1] if report.number <= len(job.attempts) else None
    moved = attempt is None or bool(report.level and report.level != attempt.level)
    if attempt is None:
        attempt = Attempt(number=report.number, start_time=report.start_time or now, am_attempt=job.am_attempt)
        job.attempts.append(attempt)
    attempt.state = report.state
    attempt.waiting_reason = report.waiting_reason
    attempt.level = report.level or attempt.level
    attempt.failure = report.failure
    attempt.cause = report.cause
    attempt.exit_code = report.exit_code
    attempt.counts_as_failure = report.counts_as_failure
    attempt.end_time = report.end_time
    if report.learners:
        attempt.learners = report.learners
        for learner in attempt.learners:
            c = containers.get(learner.container_id)
            if c is not None:
                learner.pid = learner.pid or c.pid
                learner.preemptible = c.preemptible
                node = nodes.get(c.node_id)
                learner.host = learner.host or (node.host if node else "")
                if c.phase is ContainerPhase.COMPLETED:
                    # The agent's word on how it ended beats the AM's (older) view of it.
                    learner.state = ENDED_AS.get(c.exit.kind, "EXITED")
                    learner.exit_code, learner.signal = c.exit.exit_code, c.exit.signal
    job.failures = sum(1 for a in job.attempts if a.counts_as_failure)
    job.preemptions = sum(1 for a in job.attempts if a.failure is FailureKind.PREEMPTED)
    if not job.state.terminal and report.number == len(job.attempts):
        if report.state is JobState.RUNNING:
            job.state = JobState.RUNNING
            job.waiting_reason = ""
            if not job.start_time:
                job.start_time = now
        elif report.state is JobState.ALLOCATING:
            job.state = JobState.ALLOCATING
            job.waiting_reason = report.waiting_reason
    return True, moved


def follow_container(job: Job, c: Container) -> bool:
    """The learner record of container `c` (newest attempt first) takes its pid, start and end; whether found."""
    for attempt in reversed(job.attempts):
        for learner in attempt.learners:
            if learner.container_id == c.container_id:
                learner.pid = c.pid or learner.pid
                if c.phase is ContainerPhase.RUNNING:
                    learner.state = "RUNNING"
                elif c.phase is ContainerPhase.COMPLETED:
                    learner.state = ENDED_AS.get(c.exit.kind, "EXITED")
                    learner.exit_code = c.exit.exit_code
                    learner.signal = c.exit.signal
                return True
    return False
