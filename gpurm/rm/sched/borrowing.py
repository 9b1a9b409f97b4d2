"""Borrowed capacity ordered by a policy: the queue tree's `borrowing: las | gittins | srtf` (DESIGN.md). Pure.

Under `borrowing: fair` (the default) GPUs beyond a queue's steady share go to the queue furthest below its
instantaneous share, as YARN's fair scheduler does, and nothing here runs. Under a policy:

- **Borrowers.** A leaf's running jobs, best-ranked first by the policy (las: level, then submit order; gittins:
  level, then index; srtf: the GPU-time left), fill its steady share; the jobs wholly beyond it are its borrowers
  (`borrowers`). A job inside its queue's steady share (even one that straddles it) is
  never a borrower; a `preemptible: false` queue has none.
- **Order.** The scheduling pass serves the jobs that start while their queue is below its steady share first
  (a gang straddling it included), neediest queue first (usage / steady share); then every queue's jobs that would
  start at or beyond it, cluster-wide in the policy's order, as one Tiresias queue (rm/sched/scheduler.py).
- **Preemption** (`BorrowPreemption.run`): a waiting job of any queue that outranks a borrower of any queue by the
  policy's preemption rank (a better las / gittins level, or less left under srtf: `priority.preempt_rank`; a job
  the starvation guard promoted outranks every level) takes its GPUs when the idle ones do not suffice, exactly as
  in-queue preemption does inside a queue (`priority.in_queue_victims`): whole jobs, only borrowers that ran at
  least the minimum run (rm.yaml `preemption.in_queue_min_run`), with the victim queue's `preemption_grace`, and
  only where the freed GPUs with the idle ones make a room the waiting job's AM can use at its locality level. One
  room per waiting job while its victims stop. A queue below its steady share takes GPUs back first, whatever the
  ranks: its best-ranked waiting jobs that would start below the share outrank every borrower. The GPUs freed are
  held for the waiting job's queue until it is granted them (rm/sched/reclaim.py's ledger, as for fair-share
  preemption). Each preemption is counted.
- **Guarantees** do not change: fair-share and min-share preemption (rm/sched/reclaim.py, rm/sched/preemption.py)
  give a queue below its steady (instead of instantaneous) or min share its GPUs back, from borrowers only.

The records (jobs, live containers, the jobs with an AM per queue) are the core's dicts, read only here; the core
carries out the preemptions through the `preempt` callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpurm.common.model import Container, ContainerKind, Job
from gpurm.queues.tree import Policy
from gpurm.rm.sched import preemption, priority
from gpurm.rm.sched.standing import Standings
from gpurm.rm.state.cluster import Cluster
from gpurm.rm.state.queuebook import QueueBook

Rank = tuple[float, float, int]
PreemptFn = Callable[[Job, preemption.Decision, float, float], None]   # (victim, decision, grace, now)


@dataclass(frozen=True)
class Runner:
    """A job holding GPUs, as borrowing weighs it."""

    job_id: str
    queue: str
    gpus: int          # GPUs its live learners hold
    rank: Rank         # by the borrowing policy: lower keeps the share first
    since: float = 0.0    # when its run started


def borrowers(book: QueueBook, steady: Mapping[str, int], running: Iterable[Runner]) -> set[str]:
    """The jobs running on borrowed GPUs: per preemptible leaf, its jobs best-ranked first fill its steady share,
    and those wholly beyond it are borrowers."""
    by_queue: dict[str, list[Runner]] = {}
    for r in running:
        by_queue.setdefault(r.queue, []).append(r)
    out: set[str] = set()
    for queue, members in by_queue.items():
        leaf = book.tree.by_path.get(queue)
        if leaf is None or not leaf.effective_preemptible:
            continue
        share = steady.get(queue, 0)
        held = 0
        for r in sorted(members, key=lambda r: (r.rank, r.job_id)):
            if held >= share:
                out.add(r.job_id)
            held += r.gpus
    return out


class BorrowPreemption:
    def __init__(self, cluster: Cluster, queues: QueueBook, standings: Standings, jobs: dict[str, Job],
                 live_by_job: dict[str, dict[str, Container]], learners_live: dict[str, int],
                 with_am_by_queue: dict[str, dict[str, None]], nudged: dict[str, None],
                 rooms: Callable[[], list[priority.Room]], min_run_s: float, preempt: PreemptFn) -> None:
        self.cluster = cluster
        self.queues = queues
        self.standings = standings
        self.jobs = jobs
        self.live_by_job = live_by_job
        self.learners_live = learners_live        # jobs running learners (the others wait)
        self.with_am_by_queue = with_am_by_queue  # per queue, unfinished jobs whose AM lives
        self.nudged = nudged                      # jobs whose next allocate reply says "plan now" (written here)
        self.rooms = rooms                        # the servers as preemption sees them (the in-queue's, cached)
        self.min_run_s = min_run_s
        self.preempt = preempt
        self.preemptions = 0                      # borrowers preempted since this RM started
        # Waiting jobs a room is being made for -> their victims, while a victim still holds GPUs under its
        # deadline: not weighed again meanwhile (as in rm/sched/inqueue.py).
        self.rooms_under_way: dict[str, list[str]] = {}
        self.last_now = 0.0

    @property
    def policy(self) -> Policy | None:
        return self.queues.borrowing

    def held(self, job_id: str) -> dict[str, int]:
        """Where a job's live learners hold GPUs: server -> GPUs."""
        where: dict[str, int] = {}
        for c in self.live_by_job.get(job_id, {}).values():
            if c.kind is ContainerKind.LEARNER:
                where[c.node_id] = where.get(c.node_id, 0) + c.gpus
        return where

    def running(self, now: float) -> list[Runner]:
        """The running jobs of the queues above their steady share (only they can have borrowers), ranked by the
        borrowing policy: las by level (`Standings.running_rank`, cached), srtf by the GPU-time left (the same),
        gittins by level then index (the scheduling pass's order); then submit order."""
        policy = self.policy
        if policy is None:
            return []
        steady = self.queues.shares(self.cluster.capacity).steady
        used = self.queues.used
        tree = self.queues.tree
        lending: dict[str, bool] = {}
        # las and srtf rank a running job by what preemption weighs (cached), gittins by its index inside a level too
        key = priority.rank(policy, now, self.standings.las_thresholds, self.standings.history) \
            if policy is Policy.GITTINS else None
        out = []
        for job_id in self.learners_live:
            job = self.jobs.get(job_id)
            if job is None or job.state.terminal:
                continue
            queue = job.queue
            lends = lending.get(queue)
            if lends is None:
                leaf = tree.by_path.get(queue)
                lends = lending[queue] = leaf is not None and leaf.effective_preemptible \
                    and used.get(queue, 0) > steady.get(queue, 0)
            if not lends:
                continue
            rank, _, since = self.standings.running_rank(job, policy, now)
            if since < 0:
                continue                  # a gang still being granted: nothing started
            full = (rank[0], rank[1], job.seq) if key is None else key(self.standings.standing(job, now))
            out.append(Runner(job_id, queue, self.standings.running_gpus(job), full, since))
        return out

    def borrowers(self, now: float | None = None) -> set[str]:
        """The jobs running on borrowed GPUs now (`now` None: as of the last look)."""
        if self.policy is None:
            return set()
        now = self.last_now if now is None else now
        steady = self.queues.shares(self.cluster.capacity).steady
        return borrowers(self.queues, steady, self.running(now))

    def run(self, busy: set[str], now: float) -> list[tuple[str, str]]:
        """One look: (victim, beneficiary) pairs, each already preempted through the callback. `busy`: jobs under
        a preemption deadline."""
        policy = self.policy
        self.last_now = now
        if policy is None:
            return []
        busy = self._with_rooms_under_way(busy)
        running = self.running(now)
        steady = self.queues.shares(self.cluster.capacity).steady
        lenders = borrowers(self.queues, steady, running)
        pool = [r for r in running if r.job_id in lenders and r.job_id not in busy
                and now - r.since >= self.min_run_s and not self.jobs[r.job_id].spec.shared]
        if not pool:
            return []
        worst = max(priority.preempt_rank(policy, r.rank) for r in pool)
        used = self.queues.used
        candidates: list[priority.Standing] = []
        guaranteed: set[str] = set()
        levels: dict[str, str] = {}
        for queue, members in self.with_am_by_queue.items():
            leaf = self.queues.tree.by_path.get(queue)
            if leaf is None:
                continue
            share = steady.get(queue, 0)
            below: list[tuple[Rank, priority.Standing]] = []     # ranked, while the queue is below its share
            for job_id in members:
                if job_id in self.learners_live or job_id in busy:
                    continue
                job = self.jobs[job_id]
                if self.queues.over_cap(leaf, job.user, job.spec.gpu_amount):
                    continue
                s, k, starve_at = self.standings.waiting_rank(job, policy)
                attempt = job.current_attempt
                levels[job_id] = attempt.level if attempt is not None else ""
                if used.get(queue, 0) < share:
                    below.append((k if now <= starve_at else (-1.0, -1.0, k[2]), s))
                elif (priority.STARVED if now > starve_at else priority.preempt_rank(policy, k)) < worst:
                    candidates.append(s)
            if below:
                # The queue's best-ranked waiting jobs that would start below its steady share (as the scheduling
                # pass serves them first) take GPUs back from borrowers first, whatever their rank (its guarantee);
                # the rest by their rank.
                cum = used.get(queue, 0)
                for k, s in sorted(below, key=lambda ks: ks[0]):
                    if cum < share:
                        cum += s.gpus
                        guaranteed.add(s.job_id)
                        candidates.append(s)
                    elif (priority.STARVED if k[0] < 0 else priority.preempt_rank(policy, k)) < worst:
                        candidates.append(s)
        if not candidates:
            return []
        if sum(s.gpus for s in candidates) <= self.cluster.free_gpus:
            for s in candidates:        # they all fit in the idle GPUs: their AMs are told to look now
                self.nudged[s.job_id] = None
            return []
        held = {r.job_id: self.held(r.job_id) for r in pool}
        victims = [self.standings.standing(self.jobs[r.job_id], now) for r in pool]
        fits: list[str] = []
        pairs = priority.in_queue_victims(policy, now, candidates, victims, self.rooms(), held,
                                          self.min_run_s, levels, fits, self.standings.las_thresholds,
                                          self.standings.history, first=guaranteed)
        for job_id in fits:
            self.nudged[job_id] = None
        for victim, beneficiary in pairs:
            self.nudged[beneficiary] = None
            job = self.jobs[victim]
            leaf = self.queues.tree.by_path.get(job.queue)
            grace = leaf.preemption.grace_s if leaf is not None else 0.0
            target = self.jobs[beneficiary].queue
            why = (f"queue {target.removeprefix('root.')} takes its steady share back for {beneficiary}"
                   if beneficiary in guaranteed else f"outranked by {beneficiary} ({policy.value}) on borrowed GPUs")
            d = preemption.Decision(target, [], why)
            self.preempt(job, d, grace, now)
            self.rooms_under_way.setdefault(beneficiary, []).append(victim)
            self.preemptions += 1
        return pairs

    def _with_rooms_under_way(self, busy: set[str]) -> set[str]:
        """`busy` plus the waiting jobs whose room is still being made (a victim still under its deadline)."""
        if not self.rooms_under_way:
            return busy
        waiting, _ = preemption.settle_rooms(self.rooms_under_way, busy)
        return busy | waiting if waiting else busy
