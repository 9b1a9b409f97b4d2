"""The backfill walk: after GPUs came free (or the waiting jobs changed), who is told to plan now, and who gets a
reservation. Slurm's backfill scheduler, on the RM's order. Pure: the core hands in the waiting jobs in order, the
planning view and the reservations.

The walk goes through the waiting jobs in the order the scheduler serves them (rm/sched/waiting.py: the neediest
queue first, each queue in its policy's order), at most `scan` of each queue:

- a job holding a reservation whose GPUs are all free is told to plan now (its AM sees them as its own);
- a job that fits now, at its locality level, on GPUs free to it (reserved ones only where it would vacate them
  before the reservation needs them) gets no reservation: its AM finds the GPUs when it next plans (the daemon's
  AMs poll; the simulator wakes idle AMs when GPUs come free, sim/waking.py);
- a job that does not fit and has waited `reserve_after_s` gets a reservation while fewer than the limit are held
  (rm/sched/reservations.py): the first such jobs in the order, so no size starves behind a stream of small jobs.

"Told to plan now" is the allocate reply's `plan_now`: an AM waiting in back-off (or, in the simulator, asleep)
plans at once. Nothing here grants anything: the scheduling pass does, and it keeps reserved GPUs for their holder.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpurm.am.placement import View, plan
from gpurm.common.jobspec import LocalityLevel
from gpurm.rm.sched.reservations import Reservations

SCAN = 64                  # waiting jobs looked at per queue and walk


@dataclass(frozen=True)
class Waiter:
    """A waiting job as the walk sees it."""

    job_id: str
    gpus: int
    level: LocalityLevel | None      # where its AM plans; None: no reservation can be made for it (spread, shares)
    waiting_since: float
    expected_run_s: float            # the history's estimate of its run (backfill: will it vacate in time?)


@dataclass
class WalkSettings:
    reserve_after_s: float = 0.0     # a job waits this long before it may get a reservation
    scan: int = SCAN


def walk(queues: Iterable[Iterator[Waiter]], view: View, reservations: Reservations, settings: WalkSettings,
         ready: set[str], now: float) -> list[str]:
    """The jobs to tell to plan now (those whose reservations are ready); reservations are made (and dropped where
    their job's level moved) on the way. `queues`: each queue's waiting jobs in order, the neediest queue first;
    `ready`: the jobs whose reservations are ready (`Reservations.ready`)."""
    free = view.total_free
    told: list[str] = []
    for members in queues:
        for k, w in enumerate(members):
            if k >= settings.scan:
                break
            held = reservations.by_job.get(w.job_id)
            if held is not None and held.level is not w.level:
                reservations.release(w.job_id)          # its AM relaxed: the reservation no longer fits its plans
                held = None
            if held is not None:
                if w.job_id in ready:
                    told.append(w.job_id)
                continue
            if w.gpus <= free + len(_usable_reserved(view, w, now)) and _fits(view, w, now):
                continue                                # it fits: its AM finds the GPUs when it next plans
            if w.level is not None and now - w.waiting_since >= settings.reserve_after_s \
                    and len(reservations.by_job) < reservations.limit:
                reservations.reserve(w.job_id, w.gpus, w.level, now)
        if len(reservations.by_job) >= reservations.limit and not reservations.by_job.keys() & ready:
            break
    return told


def _usable_reserved(view: View, w: Waiter, now: float) -> list[int]:
    return [i for s in view.reserved_on.values() if s.usable_by(w.job_id, now, w.expected_run_s) for i in s.reserved]


def _fits(view: View, w: Waiter, now: float) -> bool:
    mine = view.for_job(w.job_id, now, w.expected_run_s)
    if w.level is None:
        return mine.total_free >= w.gpus
    return plan(w.gpus, mine, w.level) is not None
