"""Read-only views of the core's records for the shell: job listings, per-queue job counts, why a job waits
(its AM's account, and the RM's when it holds the job back), and which container's log a request names.
Computed when asked; nothing here changes a record.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from gpurm.common.model import Container, Job, JobState
from gpurm.queues.tree import QueueTree
from gpurm.rm.sched.history import gpu_class
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.messages import AppState, ErrorCode, RequestError


def list_jobs(jobs: Mapping[str, Job], states: Iterable[JobState] = (), queue: str = "", user: str = "",
              limit: int = 0) -> list[Job]:
    """Jobs in submit order, filtered by state, queue (with or without `root.`) and user; the newest `limit`."""
    wanted = set(states)
    found = [j for j in jobs.values()
             if (not wanted or j.state in wanted) and (not queue or j.queue in (queue, f"root.{queue}"))
             and (not user or j.user == user)]
    found.sort(key=lambda j: j.seq)
    return found[-limit:] if limit > 0 else found


def queue_stats(jobs: Mapping[str, Job], tree: QueueTree) -> dict[str, tuple[int, int]]:
    """Per queue (ancestors included): (running jobs, queued jobs)."""
    return queue_stats_of(jobs.values(), tree)


def unfinished(jobs: Mapping[str, Job], ams: AMLauncher) -> Iterator[Job]:
    """The unfinished jobs, from the AM launcher's indexes (each has a live AM or waits for one) rather than a
    walk of every job ever submitted."""
    ids = dict.fromkeys(ams.with_am)
    for entries in ams.needs_am.values():
        for key in entries:
            ids[key[2]] = None
    for job_id in ids:
        job = jobs.get(job_id)
        if job is not None and not job.state.terminal:
            yield job


def queue_stats_of(jobs: Iterable[Job], tree: QueueTree) -> dict[str, tuple[int, int]]:
    """Per queue (ancestors included): (running jobs, queued jobs) of `jobs` (terminal ones are skipped)."""
    stats: dict[str, list[int]] = {}
    for job in jobs:
        if job.state.terminal:
            continue
        q = tree.by_path.get(job.queue)
        for a in q.ancestry() if q is not None else ():
            entry = stats.setdefault(a.path, [0, 0])
            entry[0 if job.state is JobState.RUNNING else 1] += 1
    return {k: (v[0], v[1]) for k, v in stats.items()}


def with_notes(reason: str, live: Iterable[Container]) -> str:
    """A waiting reason with what the job's starting containers' agents say first (an image being pulled)."""
    notes = list(dict.fromkeys(c.note for c in live if c.note))[:3]
    return "; ".join([*notes, *([reason] if reason else [])])


def why_waiting(job: Job, ams: AMLauncher, apps: Mapping[str, AppState],
                context: tuple[bool, int, dict[str, int]] | None = None) -> str:
    """Why an unfinished job waits: its AM's account, and the RM's when the RM holds it back. `context`: an
    `ams.wait_context()` shared by the jobs of one listing."""
    if job.state.terminal:
        return ""
    if job.job_id not in ams.with_am:
        return ams.queued_reason(job, context)
    app = apps.get(job.job_id)
    rm_reason = f"RM: {app.app.blocked}" if app is not None and app.app.blocked else ""
    return "; ".join(x for x in (job.waiting_reason, rm_reason) if x)


def log_container(containers: Mapping[str, Container], job: Job, am: bool, attempt: int, rank: int
                  ) -> tuple[str, str]:
    """(container id, node id) of the log a GetLogs request names: the AM of `attempt` (0: the current AM) or
    the learner of `rank` in job attempt `attempt` (0: the latest). RequestError says what exists instead."""
    if am:
        attempt_no = attempt or job.am_attempt
        cid = f"{job.job_id}-am{attempt_no}"
        c = containers.get(cid)
        if c is None:
            raise RequestError(ErrorCode.FAILED_PRECONDITION, f"{job.job_id} has no AM attempt {attempt_no}")
        return cid, c.node_id
    if not job.attempts:
        raise RequestError(ErrorCode.FAILED_PRECONDITION,
                           f"{job.job_id} has not started yet ({job.state.name}); no logs so far. "
                           f"`gpurm status {job.job_id}` says why")
    number = attempt or len(job.attempts)
    if not 1 <= number <= len(job.attempts):
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"attempt: {job.job_id} has attempts 1-{len(job.attempts)}, not {number}")
    for learner in job.attempts[number - 1].learners:
        if learner.rank == rank and learner.container_id:
            return learner.container_id, learner.node_id
    ranks = sorted(learner.rank for learner in job.attempts[number - 1].learners if learner.container_id)
    if not ranks:
        raise RequestError(ErrorCode.FAILED_PRECONDITION,
                           f"attempt {number} of {job.job_id} has no learner running yet; no logs so far")
    raise RequestError(ErrorCode.INVALID_ARGUMENT,
                       f"rank: attempt {number} of {job.job_id} has ranks {ranks[0]}-{ranks[-1]}, not {rank}")


SIZE_CLASSES = ("share", "1", "2-4", "5-8", "9-16", "17+")


@dataclass(frozen=True)
class SizeQueueing:
    """Queueing delay (submit to first start) of one size class."""

    size: str
    started: int
    mean_s: float
    p99_s: float
    waiting: int
    longest_wait_s: float


def queueing_by_size(jobs: Iterable[Job], now: float) -> list[SizeQueueing]:
    """Per size class (rm/sched/history.py gpu_class) over `jobs`: the started jobs' mean and p99 (nearest rank)
    delay, and how many wait for their first start now and the longest of those waits. Classes with no job left
    out."""
    delays: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    for job in jobs:
        size = gpu_class(job.spec.gpu_amount)
        if job.start_time:
            delays.setdefault(size, []).append(max(0.0, job.start_time - job.submit_time))
        elif not job.state.terminal:
            waits.setdefault(size, []).append(max(0.0, now - job.submit_time))
    out = []
    for size in SIZE_CLASSES:
        d, w = sorted(delays.get(size, ())), waits.get(size, [])
        if not d and not w:
            continue
        p99 = d[max(0, math.ceil(0.99 * len(d)) - 1)] if d else 0.0
        out.append(SizeQueueing(size, len(d), math.fsum(d) / len(d) if d else 0.0, p99, len(w), max(w, default=0.0)))
    return out
