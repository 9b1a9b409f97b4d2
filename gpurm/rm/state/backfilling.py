"""Waiting jobs and backfill as the RM core runs them: who waits for GPUs (kept in the waiting book in each queue's
order as jobs change), the run-time estimates reservations and backfill work from (the learned history), and the
backfill walk after GPUs came free (rm/sched/backfill.py): which AMs are told to plan now, which jobs get a
reservation. Functions of the core (rm/state/core.py's RMCore, which calls them); pure, `now` passed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpurm.common.jobspec import LocalityLevel
from gpurm.common.model import ContainerKind, Job, JobState
from gpurm.rm.sched import priority
from gpurm.rm.sched.backfill import Waiter, walk

# Backfill judges a job by the median of what its history group ran beyond what it has run, not the mean: run
# times are heavy-tailed (Philly's: a mean over three times the median), and by the mean hardly a job fits before
# a reservation starts, so the GPUs of a draining server idle. Half the jobs backfilled by the median overrun it;
# the reservation's start then moves (rm/sched/reservations.py `ready`) and the others go on backfilling.
BACKFILL_QUANTILE: float | None = 0.5

if TYPE_CHECKING:
    from gpurm.rm.state.core import RMCore


def sync_waiting(core: RMCore, job: Job) -> None:
    """Put the job in the waiting book, at its rank, while it waits for GPUs (its registered AM's gang does not run);
    take it out (and end its reservation) when it does not. Nothing to keep without reservations."""
    if core.reservations.limit <= 0:
        return
    app = core.apps.get(job.job_id)
    waits = job.state is JobState.ALLOCATING and app is not None and app.registered \
        and app.am_attempt == job.am_attempt
    if not waits:
        core.told.pop(job.job_id, None)
        if job.job_id in core.waiting:
            core.waiting.discard(job.job_id)
        if job.job_id in core.reservations.by_job:
            core.reservations.release(job.job_id)
        return
    leaf = core.queues.tree.by_path.get(job.queue)
    if leaf is None:
        return
    policy = core.scheduler.policy_of(leaf)
    _, rank, starve_at = core.standings.waiting_rank(job, policy)
    core.waiting.put(job.job_id, job.queue, rank, starve_at)


def promote_starved(core: RMCore, now: float) -> None:
    """Waiting jobs the starvation guard promoted by now rank as starved in the waiting book from now on."""
    for job_id in core.waiting.due(now):
        job = core.jobs.get(job_id)
        leaf = core.queues.tree.by_path.get(job.queue) if job is not None else None
        if job is None or leaf is None:
            continue
        policy = core.scheduler.policy_of(leaf)
        rank = priority.rank(policy, now, core.settings.las_thresholds_gpu_s, core.history)(core.standing(job, now))
        core.waiting.put(job_id, job.queue, rank, float("inf"))


def expected_run_s(core: RMCore, job: Job) -> float:
    """How long the job is expected to run from its next start, as backfill judges it: the BACKFILL_QUANTILE of
    what its history group ran beyond what it has run already."""
    gpus = max(job.spec.gpu_amount, 1e-3)
    return core.history.remaining_s(core.standings.features(job), job.attained_gpu_s / gpus, BACKFILL_QUANTILE)


def ends(core: RMCore, node_id: str, now: float) -> list[tuple[float, tuple[int, ...]]]:
    """When the learners on a server are expected to end, with their GPUs: a learner under a preemption deadline
    by then; the others when what their job is expected to run beyond what it ran is over."""
    out: list[tuple[float, tuple[int, ...]]] = []
    for c in core.index.on_node(node_id):
        if c.kind is not ContainerKind.LEARNER or not c.phase.live or not c.gpu_indices:
            continue
        job = core.jobs.get(c.job_id)
        if job is None:
            continue
        if c.preempt_deadline:
            out.append((max(now, c.preempt_deadline), tuple(c.gpu_indices)))
            continue
        gpus = max(job.spec.gpu_amount, 1e-3)
        ran = job.attained_gpu_s / gpus + (now - c.started if c.started else 0.0)
        left = core.history.remaining_s(core.standings.features(job), ran)
        out.append((now + left, tuple(c.gpu_indices)))
    return out


def walk_due(core: RMCore) -> bool:
    """Whether anything a walk reads changed since the last: GPUs came free, the waiting jobs or reservations."""
    key = (core.cluster.releases, core.waiting.version, core.reservations.version, core.cluster.shape_version)
    return key != core.walked_at


def backfill(core: RMCore, now: float) -> list[str]:
    """The backfill walk (rm/sched/backfill.py): the jobs whose AMs are told to plan now (also put in `nudged`).
    A job is told again only once what it plans on changed (GPUs came free, reservations moved): an AM whose plan
    failed on the same view would fail again."""
    if core.reservations.limit <= 0:
        return []
    promote_starved(core, now)
    ready = set(core.reservations.ready(now)) if core.reservations.by_job else set()
    if not walk_due(core) and not ready:
        return []
    view = core.planview.current()
    book = core.queues
    shares = book.shares(core.cluster.capacity)
    inst, used = book.between(shares), book.used

    def neediness(queue: str) -> tuple[float, str]:
        share, u = inst.get(queue, 0), used.get(queue, 0)
        return ((u / share) if share > 0 else (float("inf") if u else 1e9), queue)

    leaves = sorted(core.waiting.leaves(), key=neediness)
    scan = core.backfill_settings.scan
    told = walk((_waiters(core, leaf, scan) for leaf in leaves), view, core.reservations, core.backfill_settings,
                ready, now, core.behind if core.behind.behind > 0 else None)
    core.walked_at = (core.cluster.releases, core.waiting.version, core.reservations.version,
                      core.cluster.shape_version)
    seen = (core.cluster.releases, core.reservations.version, core.cluster.shape_version)
    out = []
    for job_id in told:
        if core.told.get(job_id) != seen:
            core.told[job_id] = seen
            core.nudged[job_id] = None
            out.append(job_id)
    return out


def _waiters(core: RMCore, leaf: str, limit: int) -> Iterator[Waiter]:
    for job_id in core.waiting.in_order(leaf, limit):
        job = core.jobs.get(job_id)
        if job is None or job_id in core.asking:
            continue                # an AM that asks already is answered by the scheduling pass, not told to plan
        yield Waiter(job_id, job.spec.gpus, _level(job), job.idle_since, expected_run_s(core, job))


def _level(job: Job) -> LocalityLevel | None:
    """The locality level the job's AM plans at (None where no reservation can be made for it: a spread job, a
    share of one GPU)."""
    if job.spec.shared or job.spec.placement.value == "spread":
        return None
    attempt = job.current_attempt
    label = attempt.level if attempt is not None else ""
    if not label:
        return job.spec.locality.start_level
    try:
        return LocalityLevel.parse(label)
    except ValueError:
        return None
