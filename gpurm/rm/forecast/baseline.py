"""The naive forecast the real one is measured against: a queued job starts after the jobs queued ahead of it in
its own leaf queue, one mean run time each (queue position x the mean run time of the jobs finished so far; an
hour while nothing has finished, the history's own fallback). Pure."""

from __future__ import annotations

import math

from gpurm.rm.forecast.snapshot import Snapshot

NO_HISTORY_S = 3600.0


def mean_run_s(snap: Snapshot) -> float:
    """The mean run time of every finished job the history learned (its whole-cluster group)."""
    for key, durations, _ in snap.history:
        if len(key) == 1 and durations:
            return math.fsum(durations) / len(durations)
    return NO_HISTORY_S


def position(snap: Snapshot, job_id: str) -> int:
    """How many queued jobs of the same leaf queue were submitted before it."""
    me = next(j for j in snap.jobs if j.job_id == job_id)
    return sum(1 for j in snap.jobs if not j.running and j.queue == me.queue and j.seq < me.seq)


def baseline_wait_s(snap: Snapshot, job_id: str) -> float:
    return position(snap, job_id) * mean_run_s(snap)
