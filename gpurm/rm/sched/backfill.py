"""The backfill walk: after GPUs came free (or the waiting jobs changed), who is told to plan now, and who gets a
reservation. Slurm's backfill scheduler, on the RM's order. Pure: the core hands in the waiting jobs in order, the
planning view and the reservations.

The walk goes through the waiting jobs in the order the scheduler serves them (rm/sched/waiting.py: the neediest
queue first, each queue in its policy's order), at most `scan` of each queue:

- a job holding a reservation whose GPUs are all free is told to plan now (its AM sees them as its own);
- a job that fits now, at its locality level, on GPUs free to it (reserved ones only where it would vacate them
  before the reservation needs them) gets no reservation: its AM finds the GPUs when it next plans (the daemon's
  AMs poll; the simulator wakes idle AMs when GPUs come free, sim/waking.py);
- a job that does not fit, has waited `reserve_after_s` and is starving (rm/sched/behind.py: it has waited a
  multiple of what the one-GPU jobs recently queued) gets a reservation while fewer than the limit are held
  (rm/sched/reservations.py): the first such jobs in the order, so no size starves behind a stream of small
  jobs, while a job that merely does not fit yet costs nobody a draining server.

"Told to plan now" is the allocate reply's `plan_now`: an AM waiting in back-off (or, in the simulator, asleep)
plans at once. Nothing here grants anything: the scheduling pass does, and it keeps reserved GPUs for their holder.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpurm.am.placement import View, plan
from gpurm.common.jobspec import LocalityLevel
from gpurm.rm.sched.behind import Behind
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
         ready: set[str], now: float, behind: Behind | None = None) -> list[str]:
    """The jobs to tell to plan now (those whose reservations are ready); reservations are made (and dropped where
    their job's level moved) on the way. `queues`: each queue's waiting jobs in order, the neediest queue first;
    `ready`: the jobs whose reservations are ready (`Reservations.ready`); `behind`: when given, only a job that
    is starving by it (rm/sched/behind.py) may get a reservation: the first such jobs in the order that do not
    fit (the order the scheduler serves them in, as before: the neediest queue's first)."""
    told: list[str] = []
    wanting: list[Waiter] = []
    room = reservations.limit - len(reservations.by_job)
    for members in queues:
        for k, w in enumerate(members):
            if k >= settings.scan:
                break
            held = reservations.by_job.get(w.job_id)
            if held is not None and held.level is not w.level:
                if w.level is not None and w.level > held.level:
                    # Its AM relaxed: servers that suit a stricter level suit this one, and what has drained
                    # there is kept rather than started again elsewhere.
                    held.level = w.level
                else:
                    reservations.release(w.job_id)      # its plans no longer fit the reservation's servers
                    room += 1
                    held = None
            if held is not None:
                if w.job_id in ready:
                    told.append(w.job_id)
                continue
            if room <= 0 or w.level is None or w.gpus <= 1:
                continue                                # (any GPU that frees fits a one-GPU job: no locality wait)
            waited = now - w.waiting_since
            if waited >= settings.reserve_after_s and (behind is None or behind.starving(waited)):
                wanting.append(w)
        if room <= 0 and not reservations.by_job.keys() & ready:
            break
    if room <= 0 or not wanting:
        return told
    free = view.total_free
    for w in wanting:
        if w.level is None or (w.gpus <= free + len(_usable_reserved(view, w, now)) and _fits(view, w, now)):
            continue                                    # it fits: its AM finds the GPUs when it next plans
        if reservations.reserve(w.job_id, w.gpus, w.level, now) is not None:
            room -= 1
            if room <= 0:
                break
    return told


def _usable_reserved(view: View, w: Waiter, now: float) -> list[int]:
    return [i for s in view.reserved_on.values() if s.usable_by(w.job_id, now, w.expected_run_s) for i in s.reserved]


def _fits(view: View, w: Waiter, now: float) -> bool:
    mine = view.for_job(w.job_id, now, w.expected_run_s)
    if w.level is None:
        return mine.total_free >= w.gpus
    return plan(w.gpus, mine, w.level) is not None
