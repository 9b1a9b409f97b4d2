"""Fair-share preemption: which starving queue may take GPUs back, and from which jobs. Pure.

A leaf queue is starved for its min share when it uses fewer GPUs than min(min_gpus, its demand), and starved for
its fair share when it uses fewer than threshold x min(instantaneous share, demand). Once a starvation has lasted
its timeout (`min_share_preemption_timeout`, `fair_share_preemption_timeout`), the queue may reclaim up to its
target from queues above their instantaneous share: whole jobs (a gang is useless in part), newest first, never
taking a victim queue below its share and never from a queue that is not preemptible. GPUs already being
reclaimed for the queue count toward its target, so one starvation is not answered twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurm.queues.fairshare import Shares
from gpurm.rm.queuebook import QueueBook


@dataclass
class Candidate:
    """A job that could be preempted: it holds GPUs in some leaf queue."""

    job_id: str
    queue: str
    gpus: int
    started: float     # newest first: the latest started loses first
    seq: int


@dataclass
class Decision:
    beneficiary: str          # the starving leaf queue
    victims: list[Candidate]
    reason: str

    @property
    def gpus(self) -> int:
        return sum(v.gpus for v in self.victims)


def update_starvation(book: QueueBook, shares: Shares, now: float) -> None:
    """Start or clear each leaf's starvation clocks."""
    for q in book.tree.leaves:
        used = book.used.get(q.path, 0)
        demand = book.demand.get(q.path, 0)
        s = book.starvation[q.path]
        min_target = min(q.min_gpus, demand)
        if used < min_target:
            s.min_since = now if s.min_since is None else s.min_since
        else:
            s.min_since = None
        fair_target = min(shares.instantaneous.get(q.path, 0), demand)
        if used < q.preemption.fair_share_threshold * fair_target:
            s.fair_since = now if s.fair_since is None else s.fair_since
        else:
            s.fair_since = None


def owed(book: QueueBook, shares: Shares, now: float, reclaiming: dict[str, int]) -> dict[str, tuple[int, str]]:
    """Starving leaf queues whose timeout has run out: the GPUs each is owed (beyond what is already being
    reclaimed for it) and why. Updates the starvation clocks first."""
    update_starvation(book, shares, now)
    inst = shares.instantaneous
    out: dict[str, tuple[int, str]] = {}
    for q in book.tree.leaves:
        s = book.starvation[q.path]
        if s.min_since is None and s.fair_since is None:
            continue
        p = q.preemption
        used = book.used.get(q.path, 0)
        demand = book.demand.get(q.path, 0)
        want = 0
        reasons = []
        if s.min_since is not None and p.min_share_timeout_s is not None and now - s.min_since >= p.min_share_timeout_s:
            want = max(want, min(q.min_gpus, demand) - used)
            reasons.append(f"below its min share ({used} of {q.min_gpus}) for {now - s.min_since:.0f}s")
        if s.fair_since is not None and p.fair_share_timeout_s is not None \
                and now - s.fair_since >= p.fair_share_timeout_s:
            want = max(want, min(inst.get(q.path, 0), demand) - used)
            reasons.append(f"below {p.fair_share_threshold:g} x its fair share ({used} of {inst.get(q.path, 0)}) for "
                           f"{now - s.fair_since:.0f}s")
        want -= reclaiming.get(q.path, 0)
        if want > 0:
            out[q.path] = (want, " and ".join(reasons))
    return out


def decide(book: QueueBook, shares: Shares, now: float, candidates: list[Candidate],
           reclaiming: dict[str, int]) -> list[Decision]:
    """Preemptions to start now. `reclaiming`: GPUs already being taken back, per beneficiary queue."""
    inst = shares.instantaneous
    decisions: list[Decision] = []
    taken: set[str] = set()
    left_over: dict[str, int] = {}       # victim queue -> GPUs it may still lose this round
    for path, (want, why) in owed(book, shares, now, reclaiming).items():
        q = book.tree.by_path[path]
        victims: list[Candidate] = []
        got = 0
        for c in sorted(candidates, key=lambda c: (-c.started, -c.seq)):
            if got >= want:
                break
            if c.job_id in taken or c.queue == q.path:
                continue
            victim_q = book.tree.by_path.get(c.queue)
            if victim_q is None or not victim_q.effective_preemptible:
                continue
            room = left_over.setdefault(c.queue, book.used.get(c.queue, 0) - inst.get(c.queue, 0))
            if c.gpus > room:
                continue          # taking this job would push its queue below its share
            left_over[c.queue] = room - c.gpus
            victims.append(c)
            taken.add(c.job_id)
            got += c.gpus
        if victims:
            decisions.append(Decision(q.path, victims, f"queue {q.short} was {why}"))
            # Answered: its clocks start again, so it is not answered twice before the GPUs reach it.
            s = book.starvation[path]
            s.min_since = now if s.min_since is not None else None
            s.fair_since = now if s.fair_since is not None else None
    return decisions
