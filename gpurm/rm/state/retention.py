"""Retention of finished jobs (rm.yaml `retention:`), like Slurm's MinJobAge and slurmdbd's purge. Pure: no clock,
no store; the shell (rm/server/finished.py, from the daemon's tick loop) runs a pass and writes what it returns.

Two limits, both counted from a job's finish time:

- `memory` (default 1h): a finished job (SUCCEEDED, FAILED, KILLED) whose containers have all ended leaves the
  RM's memory: `RMCore.jobs`, its containers and every index over them, and the submit-id dedupe map. Its record
  moves, in the same store transaction, from the `jobs` / `containers` tables (which the RM loads at start-up)
  to the `retired` table (never loaded; read on demand by `gpurm status JOB`), and one compact accounting row
  (`finished`) is written for `gpurm acct`. What the job taught gittins stays: its learned size is in the row
  and is fed back on every restore. The queue book is untouched (a finished job holds nothing in it).
- `store` (default 30d, at least `memory`): the job's detail (`retired`) is deleted; its `finished` row stays for
  good, so `gpurm acct` totals never change. `gpurm status JOB` then says the job was retired and points to
  `gpurm acct`.

A re-submit with the submit id of a job that left memory is a new job: the dedupe window for client retries is
the memory retention (clients retry for minutes, far inside it).

Each pass does bounded work: finished jobs wait in a heap by finish time, so a pass looks at the expired ones
only (O(expired log n)), at most `batch` of them; a job whose containers have not all ended yet (a lost node's,
say) waits in a short list and is looked at again on later passes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpurm.common.model import Container, Job, JobState
from gpurm.rm.accounting import JobUsage, job_usage

NEVER = float("inf")
DEFAULT_MEMORY_S = 3600.0
DEFAULT_STORE_S = 30 * 86400.0
DEFAULT_BATCH = 500           # jobs retired per pass at most (a pass runs every tick, twice a second; ~0.1 s)
PURGE_EVERY_S = 60.0          # how often the store's old detail is looked for (it is a write: not every tick)
MIN_MEMORY_S = 60.0           # below this a client's retry with the same submit id could start the job twice


@dataclass
class RetentionSettings:
    """rm.yaml `retention:`. `memory_s` / `store_s`: NEVER keeps jobs (in memory / in the store) for good."""

    memory_s: float = DEFAULT_MEMORY_S
    store_s: float = DEFAULT_STORE_S
    batch: int = DEFAULT_BATCH

    @property
    def enabled(self) -> bool:
        return self.memory_s != NEVER


@dataclass
class RetiredJob:
    """A job leaving memory: its records (for the store's `retired` table) and its accounting row."""

    job: Job
    containers: list[Container]
    usage: JobUsage
    size_gpu_s: float | None          # what gittins learned from it (None: killed, not learned from)


@dataclass
class Pass:
    """What one retention pass decided."""

    retired: list[RetiredJob] = field(default_factory=list)
    purge_before: float | None = None       # delete stored detail of jobs finished before this (None: keep)


class Retention:
    """Which finished jobs are due to leave memory, in finish order."""

    def __init__(self, settings: RetentionSettings) -> None:
        self.settings = settings
        self._heap: list[tuple[float, int, str]] = []   # (finish time, seq, job id) of finished jobs in memory
        self._noted: set[str] = set()
        self._blocked: dict[str, None] = {}             # expired, but with containers still live
        self._core_id = 0                                # which core the heap describes (a rollback makes anew)
        self._next_purge = 0.0
        # Jobs out of memory, per queue: (preemptions, retries), for the RM's counters (rm/server/metrics.py). Loaded
        # from the store at start (SqliteStore.retired_counts), then kept up to date by `apply`.
        self.retired_counts: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._heap) + len(self._blocked)

    def note(self, job: Job) -> None:
        """A job changed; if it has finished, it is a candidate from now on (once)."""
        if job.state.terminal and job.job_id not in self._noted:
            self._noted.add(job.job_id)
            heapq.heappush(self._heap, (job.finish_time, job.seq, job.job_id))

    def reset(self, jobs: Iterable[Job]) -> None:
        """Start over from a core's jobs (after a restore or a rollback): O(n) heapify."""
        self._noted = set()
        self._blocked = {}
        self._heap = []
        for job in jobs:
            if job.state.terminal:
                self._noted.add(job.job_id)
                self._heap.append((job.finish_time, job.seq, job.job_id))
        heapq.heapify(self._heap)

    def follow(self, core: Any) -> None:
        """Rebuild from `core` if it is not the one the heap describes (a restore, a rollback)."""
        if id(core) != self._core_id:
            self._core_id = id(core)
            self.reset(core.jobs.values())

    def due(self, jobs: dict[str, Job], live_by_job: dict[str, Any], now: float) -> list[str]:
        """The ids of jobs to retire now, oldest first, at most `batch`."""
        if not self.settings.enabled:
            return []
        cutoff = now - self.settings.memory_s
        out: list[str] = []
        limit = self.settings.batch
        for job_id in list(self._blocked):
            if len(out) >= limit:
                return out
            job = jobs.get(job_id)
            if job is None:
                del self._blocked[job_id]
            elif not live_by_job.get(job_id):
                del self._blocked[job_id]
                out.append(job_id)
        heap = self._heap
        while heap and heap[0][0] <= cutoff and len(out) < limit:
            _, _, job_id = heapq.heappop(heap)
            job = jobs.get(job_id)
            if job is None or not job.state.terminal:
                self._noted.discard(job_id)
                continue
            if live_by_job.get(job_id):
                self._blocked[job_id] = None       # looked at again next pass, until its containers end
                continue
            out.append(job_id)
        return out

    def plan(self, core: Any, now: float) -> Pass:
        """One pass over `core` (an RMCore), changing nothing: the jobs due to leave memory with their records and
        accounting rows, and (at most every PURGE_EVERY_S, or with jobs to retire anyway) the store's purge
        limit. Write it, then `apply` it; if the write fails, `give_back` it."""
        self.follow(core)
        p = Pass()
        for job_id in self.due(core.jobs, core.live_by_job, now):
            job = core.jobs[job_id]
            containers = core.index.of_job(job_id, live_only=False)
            p.retired.append(RetiredJob(job, containers, job_usage(job, containers), learned_size(job, containers)))
        if self.settings.store_s != NEVER and (p.retired or now >= self._next_purge):
            p.purge_before = now - self.settings.store_s
            self._next_purge = now + PURGE_EVERY_S
        return p

    def apply(self, core: Any, p: Pass) -> None:
        """The pass was written: its jobs leave the core."""
        for r in p.retired:
            forget_job(core, r.job.job_id)
            self._noted.discard(r.job.job_id)
            job = r.job
            preemptions, retries = self.retired_counts.get(job.queue, (0, 0))
            self.retired_counts[job.queue] = (preemptions + job.preemptions,
                                              retries + max(0, len(job.attempts) - 1 - job.preemptions))

    def give_back(self, p: Pass) -> None:
        """The pass could not be written: its jobs stay candidates, the purge is tried again next pass."""
        for r in p.retired:
            heapq.heappush(self._heap, (r.job.finish_time, r.job.seq, r.job.job_id))
        self._next_purge = 0.0

    def purged(self, count: int) -> None:
        """The purge deleted `count` details: a full batch means more are due, next pass."""
        if count >= self.settings.batch:
            self._next_purge = 0.0


def learned_size(job: Job, containers: Iterable[Container]) -> float | None:
    """The size gittins learned from a job (`RMCore._learn_size`): attained GPU-seconds, for jobs that ended on
    their own. Its containers have all ended by now, so none is counted to `now`."""
    del containers
    if job.state in (JobState.SUCCEEDED, JobState.FAILED):
        return job.attained_gpu_s
    return None


def forget_job(core: Any, job_id: str) -> None:
    """Drop a finished job whose containers have all ended from every structure of the core that names it."""
    job: Job = core.jobs.pop(job_id)
    if job.submit_id and core.submit_ids.get(job.submit_id) == job_id:
        del core.submit_ids[job.submit_id]
    index = core.index
    for cid in index.by_job.pop(job_id, []):
        c = index.containers.pop(cid, None)
        index.live.pop(cid, None)
        index.unstarted.pop(cid, None)
        index.preempting.pop(cid, None)
        core.stop_orders.sent.pop(cid, None)
        if c is not None:
            core.stop_orders.pending.get(c.node_id, {}).pop(cid, None)
    index.live_by_job.pop(job_id, None)
    index.learners_live.pop(job_id, None)
    core.standings.forget(job_id)
    core.nudged.pop(job_id, None)
    core.told.pop(job_id, None)
    core.waiting.discard(job_id)
    core.apps.pop(job_id, None)
    core.asking.pop(job_id, None)
    core.new_askers.pop(job_id, None)
    core.elastic.drop_job(job_id)
