"""Read-only views of the core's records for the shell: job listings, per-queue job counts, and why a job waits
(its AM's account, and the RM's when it holds the job back). Computed when asked; nothing here changes a record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpurm.queues.tree import QueueTree
from gpurm.rm.amlaunch import AMLauncher
from gpurm.rm.messages import AppState
from gpurm.rm.model import Job, JobState


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
    stats: dict[str, list[int]] = {}
    for job in jobs.values():
        if job.state.terminal:
            continue
        q = tree.by_path.get(job.queue)
        for a in q.ancestry() if q is not None else ():
            entry = stats.setdefault(a.path, [0, 0])
            entry[0 if job.state is JobState.RUNNING else 1] += 1
    return {k: (v[0], v[1]) for k, v in stats.items()}


def why_waiting(job: Job, ams: AMLauncher, apps: Mapping[str, AppState]) -> str:
    """Why an unfinished job waits: its AM's account, and the RM's when the RM holds it back."""
    if job.state.terminal:
        return ""
    if job.job_id not in ams.with_am:
        return ams.queued_reason(job)
    app = apps.get(job.job_id)
    rm_reason = f"RM: {app.app.blocked}" if app is not None and app.app.blocked else ""
    return "; ".join(x for x in (job.waiting_reason, rm_reason) if x)
