"""Accounting (`gpurm acct`, like Slurm's sacct / sreport): what finished jobs used, grouped and summed. Pure.

A finished job's usage (`JobUsage`) comes from its records alone, so the figures survive RM restarts. A job that
left the RM's memory (rm/state/retention.py) is counted from the compact row written then (the store's `finished`
table, kept for good), the same `JobUsage`:

- GPU-seconds: over every learner container the job ran, in any attempt, its GPUs x its run time (the agent's
  start to its end). A shared-GPU job counts by its fraction (`share_milli`, the job's `gpu_amount`); an elastic
  job's grown learners count for as long as each ran. A job with no container records (a store older than them)
  falls back to its attempts: the learners' GPUs x the attempt's span.
- Queueing time: submit to the first learner running (jobs that never ran have none).
- Outcome: the job's final state; `preempted` counts jobs preempted at least once (`preemptions` every time).

A job is charged, whole, to the window and the day (UTC) in which it finished.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpurm.common.fields import parse_duration
from gpurm.common.model import Container, ContainerKind, Job, JobState

GROUPS = ("user", "queue", "day")


@dataclass(frozen=True)
class JobUsage:
    """The compact accounting record of one finished job."""

    job_id: str
    user: str
    queue: str
    state: str                 # SUCCEEDED, FAILED or KILLED
    submit_time: float
    finish_time: float
    gpu_s: float               # GPU-seconds its learners ran
    wait_s: float | None       # submit to the first learner running; None if it never ran
    preemptions: int
    attempts: int


def job_usage(job: Job, containers: Iterable[Container] = ()) -> JobUsage:
    """The usage of a finished job from its record and its containers (any order; AMs and other jobs' ignored)."""
    end_of_job = job.finish_time
    gpu_s = 0.0
    first_run = 0.0
    learners = [c for c in containers if c.job_id == job.job_id and c.kind is ContainerKind.LEARNER]
    for c in learners:
        if c.started <= 0:
            continue                                   # granted, never ran: held, not used
        end = c.finished if c.finished > 0 else end_of_job
        gpu_s += c.amount * max(0.0, end - c.started)
        first_run = c.started if not first_run else min(first_run, c.started)
    if not learners:
        share = job.spec.gpu_amount if job.spec.shared else 0.0
        for a in job.attempts:
            if a.start_time <= 0:
                continue
            end = a.end_time if a.end_time > 0 else end_of_job
            gpus = share if share else float(sum(len(ln.gpu_indices) for ln in a.learners))
            gpu_s += gpus * max(0.0, end - a.start_time)
    if not first_run and job.start_time > 0:
        first_run = job.start_time
    wait = max(0.0, first_run - job.submit_time) if first_run else None
    return JobUsage(job_id=job.job_id, user=job.user, queue=job.queue.removeprefix("root."), state=job.state.value,
                    submit_time=job.submit_time, finish_time=job.finish_time, gpu_s=round(gpu_s, 3), wait_s=wait,
                    preemptions=job.preemptions, attempts=len(job.attempts))


def usages(jobs: Iterable[Job], containers: Iterable[Container]) -> list[JobUsage]:
    """The usage of every finished job among `jobs`."""
    by_job: dict[str, list[Container]] = {}
    for c in containers:
        if c.kind is ContainerKind.LEARNER:
            by_job.setdefault(c.job_id, []).append(c)
    return [job_usage(j, by_job.get(j.job_id, ())) for j in jobs if j.state.terminal]


def with_retired(jobs: dict[str, Job], containers: Iterable[Container], retired: Iterable[JobUsage]) -> list[JobUsage]:
    """Every finished job's usage: those in memory from their records, those that left memory (rm/state/retention.py)
    from their compact rows (a row of a job still in memory is skipped: counted once)."""
    out = usages(jobs.values(), containers)
    out.extend(u for u in retired if u.job_id not in jobs)
    return out


@dataclass
class Row:
    """One group's sums. `key` holds the grouping fields asked for (user, queue, day), in that order."""

    key: dict[str, str]
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    killed: int = 0
    preempted: int = 0         # jobs preempted at least once
    preemptions: int = 0
    gpu_s: float = 0.0
    waited: int = 0            # jobs with a queueing time
    wait_total_s: float = 0.0
    wait_max_s: float = 0.0

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / 3600

    @property
    def wait_mean_s(self) -> float:
        return self.wait_total_s / self.waited if self.waited else 0.0

    def add(self, u: JobUsage) -> None:
        self.jobs += 1
        if u.state == JobState.SUCCEEDED.value:
            self.succeeded += 1
        elif u.state == JobState.FAILED.value:
            self.failed += 1
        elif u.state == JobState.KILLED.value:
            self.killed += 1
        self.preempted += 1 if u.preemptions else 0
        self.preemptions += u.preemptions
        self.gpu_s += u.gpu_s
        if u.wait_s is not None:
            self.waited += 1
            self.wait_total_s += u.wait_s
            self.wait_max_s = max(self.wait_max_s, u.wait_s)

    def as_dict(self) -> dict[str, object]:
        return {**self.key, "jobs": self.jobs, "succeeded": self.succeeded, "failed": self.failed,
                "killed": self.killed, "preempted": self.preempted, "preemptions": self.preemptions,
                "gpu_hours": round(self.gpu_hours, 4), "gpu_seconds": round(self.gpu_s, 1),
                "wait_mean_s": round(self.wait_mean_s, 1), "wait_max_s": round(self.wait_max_s, 1)}


@dataclass(frozen=True)
class Query:
    by: tuple[str, ...] = ()          # a subset of GROUPS; empty: one total row
    since: float | None = None        # finish time at or after (epoch seconds)
    until: float | None = None        # finish time before
    users: frozenset[str] = field(default_factory=frozenset)
    queues: frozenset[str] = field(default_factory=frozenset)   # leaf paths without `root.`, or their ancestors

    def problems(self) -> list[str]:
        out = [f"--by: unknown grouping {g!r}; choose from {', '.join(GROUPS)}" for g in self.by if g not in GROUPS]
        if len(set(self.by)) != len(self.by):
            out.append(f"--by: a grouping is named twice: {','.join(self.by)}")
        if self.since is not None and self.until is not None and self.until <= self.since:
            out.append("--until: must be after --since")
        return out

    def wants(self, u: JobUsage) -> bool:
        if self.since is not None and u.finish_time < self.since:
            return False
        if self.until is not None and u.finish_time >= self.until:
            return False
        if self.users and u.user not in self.users:
            return False
        return not self.queues or any(u.queue == q or u.queue.startswith(q + ".") for q in self.queues)


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def aggregate(records: Iterable[JobUsage], query: Query) -> list[Row]:
    """Sum the records the query selects into one row per group (ordered by the group's key); with no grouping, one
    total row (even when nothing matched)."""
    order = list(query.by)
    rows: dict[tuple[str, ...], Row] = {}
    for u in records:
        if not query.wants(u):
            continue
        fields = {"user": u.user, "queue": u.queue, "day": day_of(u.finish_time)}
        key = tuple(fields[g] for g in order)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(key={g: fields[g] for g in order})
        row.add(u)
    if not order:
        return [rows.get((), Row(key={}))]
    return [rows[k] for k in sorted(rows)]


def total(rows: Sequence[Row]) -> Row:
    """The sum of rows (a table's last line)."""
    out = Row(key={})
    for r in rows:
        out.jobs += r.jobs
        out.succeeded += r.succeeded
        out.failed += r.failed
        out.killed += r.killed
        out.preempted += r.preempted
        out.preemptions += r.preemptions
        out.gpu_s += r.gpu_s
        out.waited += r.waited
        out.wait_total_s += r.wait_total_s
        out.wait_max_s = max(out.wait_max_s, r.wait_max_s)
    return out


def parse_when(text: str, now: float) -> float:
    """A point in time for --since / --until: a duration back from now (`7d`, `12h`, `90m`), a date (`2026-11-01`,
    UTC midnight), a date and time (`2026-11-01T08:00`, UTC), or `now`. Raises ValueError naming the forms."""
    value = text.strip()
    if value == "now":
        return now
    if value and value[0].isdigit() and value[-1].isalpha() and "-" not in value:
        return now - parse_duration(value)
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            parsed = time.strptime(value, fmt)
        except ValueError:
            continue
        return float(calendar.timegm(parsed))
    raise ValueError(f"expected a duration back from now like 7d or 12h, a date like 2026-11-01 or "
                     f"2026-11-01T08:00 (UTC), or now; got {text!r}")


def by_fields(text: str) -> tuple[str, ...]:
    """`user,queue` -> ("user", "queue"); empty parts dropped."""
    return tuple(p.strip() for p in text.split(",") if p.strip())
