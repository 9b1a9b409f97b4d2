"""An attempt's bookkeeping and the retry decision: starting an attempt, the attempt record's learners kept in step
with the runs, a learner's success, ending an attempt (stop what runs, give back what is held, record why), and
after the stopped learners are gone: a new attempt, or the job fails (`max_retries` spent, a user error that a
retry would repeat, or the same exit code twice within a minute of starting).

Functions of the `Master` (its fields are the state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.am.acquire import enter_level
from gpurm.am.levels import first_cap, first_level
from gpurm.am.records import AttemptRecord, Final, Phase, Run, Stop
from gpurm.common.model import FailureKind, JobState, Learner

if TYPE_CHECKING:
    from gpurm.am.master import Master

USER_ERROR_WINDOW_S = 60.0     # a failure this soon after start, twice with one exit code, is the user's
STOP_WAIT_S = 60.0             # how long to wait for stopped learners to be reported gone


def new_attempt(m: Master, number: int, now: float) -> None:
    """Start attempt `number`: no learners, no back-offs yet, planning at the first level (and cap)."""
    m.runs = {}
    m.attempts.append(AttemptRecord(number=number, start_time=now))
    m.dirty.add(number)
    m.backoffs = 0
    m.cap = first_cap(m) if m.spread else 0
    enter_level(m, first_level(m), now)


def sync_learners(m: Master) -> None:
    """The attempt record's learners, as the runs stand now (reported with the attempt)."""
    m.attempt.learners = [
        Learner(rank=r.rank, node_id=r.held.node_id, gpu_indices=list(r.held.gpu_indices),
                container_id=r.held.container_id, host=r.held.host, state=r.state, exit_code=r.exit_code,
                signal=r.signal, pid=r.pid, preemptible=r.held.preemptible)
        for r in sorted(m.runs.values(), key=lambda r: r.rank)]
    m.dirty.add(m.attempt.number)


def live_runs(m: Master) -> list[Run]:
    """The learners still starting or running."""
    return [r for r in m.runs.values() if r.live]


def learner_succeeded(m: Master, run: Run, now: float) -> None:
    """A learner exited with code 0: the job succeeded once none is left running."""
    if live_runs(m):
        return          # the others are still finishing
    attempt = m.attempt
    attempt.state, attempt.end_time, attempt.failure = JobState.SUCCEEDED, now, FailureKind.NONE
    m.dirty.add(attempt.number)
    m.final = Final(JobState.SUCCEEDED, f"all learners of attempt {attempt.number} exited with code 0")
    m.phase = Phase.DONE


def end_attempt(m: Master, kind: FailureKind, cause: str, exit_code: int, now: float,
                grace_s: float = 10.0, fatal: bool = False) -> None:
    """The attempt is over: stop what still runs, give everything back, then decide in after_stop (`fatal`:
    a user error that every retry would repeat; the job fails then)."""
    if m.phase is Phase.STOPPING or m.phase is Phase.DONE:
        return
    for run in live_runs(m):
        m.actions.append(Stop(run.held, grace_s, cause))
    m.releases.extend(m.held)
    m.held.clear()
    m.pending_end = (kind, cause, exit_code, fatal)
    m.phase = Phase.STOPPING
    m.stop_since = now
    attempt = m.attempt
    attempt.end_time = now
    attempt.failure, attempt.cause, attempt.exit_code = kind, cause, exit_code
    attempt.counts_as_failure = kind in (FailureKind.USER, FailureKind.INFRA)
    attempt.state = JobState.FAILED if attempt.counts_as_failure else JobState.KILLED
    m.dirty.add(attempt.number)


def after_stop(m: Master, now: float) -> None:
    # Whatever did not confirm its end in time is released anyway; the RM stops it.
    m.releases.extend(r.held.container_id for r in live_runs(m))
    assert m.pending_end is not None
    kind, cause, code, fatal = m.pending_end
    m.pending_end = None
    failures = [a for a in m.attempts if a.counts_as_failure]
    if kind is FailureKind.PREEMPTED:
        new_attempt(m, m.attempt.number + 1, now)
        return
    if fatal:
        fail(m, f"{cause}: a user error (it would fail the same way again), not retried", code)
        return
    if len(failures) > m.spec.max_retries:
        causes = "; ".join(f"attempt {a.number}: {a.cause}" for a in m.attempts if a.counts_as_failure)
        fail(m, f"failed {len(failures)} times (max_retries {m.spec.max_retries}): {causes}", code)
        return
    if is_user_error(m, failures):
        fail(m, f"{cause}; the same exit code ({code}) within a minute of starting in attempts "
                f"{failures[0].number} and {failures[1].number}: a user error, not retried", code)
        return
    new_attempt(m, m.attempt.number + 1, now)


def is_user_error(m: Master, failures: list[AttemptRecord]) -> bool:
    """The first two attempts failed with the same non-zero exit code, each within a minute of starting: a retry
    would only repeat it."""
    if len(failures) != 2 or m.attempts[0] is not failures[0]:
        return False
    a, b = failures
    quick = all(x.launched_at >= 0 and x.end_time - x.launched_at <= USER_ERROR_WINDOW_S for x in (a, b))
    return (quick and a.failure is FailureKind.USER and b.failure is FailureKind.USER
            and a.exit_code == b.exit_code and a.exit_code != 0)


def fail(m: Master, diagnostics: str, exit_code: int) -> None:
    """The job fails, not retried."""
    m.final = Final(JobState.FAILED, diagnostics, exit_code)
    m.phase = Phase.DONE
