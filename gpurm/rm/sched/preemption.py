"""Fair-share preemption: which starving queue may take GPUs back, and from which jobs. Pure.

A leaf queue is starved for its min share when it uses fewer GPUs than min(min_gpus, its demand), and starved for
its fair share when it uses fewer than threshold x min(instantaneous share, demand). Once a starvation has lasted
its timeout (`min_share_preemption_timeout`, `fair_share_preemption_timeout`), the queue may reclaim up to its
target from queues above their instantaneous share: whole jobs (a gang is useless in part), newest first, never
taking a victim queue below its share and never from a queue that is not preemptible. GPUs already being
reclaimed for the queue count toward its target, so one starvation is not answered twice. Under a borrowing policy
(rm/sched/borrowing.py) the steady share stands for the instantaneous one throughout (`QueueBook.between`), and
only borrowers are candidates.

Placement-aware (when the core passes a `Placement`): GPUs freed where the starving queue's waiting jobs cannot use
them would sit idle, or go back to the jobs that just lost them. So victims are chosen job by job, for the queue's
waiting jobs in order: for each, the cheapest victims (fewest GPUs, then newest) whose GPUs, with the idle ones,
form a room its AM can take at the locality level it is at (one server for a job that fits on one at `node` /
`packed`, the fewest servers in one rack / IB domain, ...: `priority.room_victims`). A job no such room can be
made for takes nobody's GPUs; a job that fits in idle GPUs needs no victim. If no waiting job can be placed,
nobody is preempted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpurm.queues.fairshare import Shares
from gpurm.rm.sched import priority
from gpurm.rm.state.queuebook import QueueBook


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


@dataclass
class Waiter:
    """A job of a starving queue that waits for GPUs: what it still needs and at which locality level its AM is."""

    job_id: str
    gpus: int
    level: str = ""       # its AM's level label (node, packed, rack, any); "" = strictest


@dataclass
class Placement:
    """Where GPUs are: the servers on offer (with idle GPUs), where each candidate job holds its GPUs (job ->
    server -> GPUs), and the waiting jobs of each queue in the order they would be served."""

    servers: Sequence[priority.Room]
    held: Mapping[str, Mapping[str, int]]
    waiting: Mapping[str, Sequence[Waiter]]


def update_starvation(book: QueueBook, shares: Shares, now: float) -> None:
    """Start or clear each leaf's starvation clocks."""
    fair = book.between(shares)
    for q in book.tree.leaves:
        used = book.used.get(q.path, 0)
        demand = book.demand.get(q.path, 0)
        s = book.starvation[q.path]
        min_target = min(q.min_gpus, demand)
        if used < min_target:
            s.min_since = now if s.min_since is None else s.min_since
        else:
            s.min_since = None
        fair_target = min(fair.get(q.path, 0), demand)
        if used < q.preemption.fair_share_threshold * fair_target:
            s.fair_since = now if s.fair_since is None else s.fair_since
        else:
            s.fair_since = None


def owed(book: QueueBook, shares: Shares, now: float, reclaiming: dict[str, int]) -> dict[str, tuple[int, str]]:
    """Starving leaf queues whose timeout has run out: the GPUs each is owed (beyond what is already being
    reclaimed for it) and why. Updates the starvation clocks first."""
    update_starvation(book, shares, now)
    inst = book.between(shares)
    out: dict[str, tuple[int, str]] = {}
    for q in book.tree.leaves:
        s = book.starvation[q.path]
        if s.min_since is None and s.fair_since is None:
            continue
        p = q.preemption
        used = book.used.get(q.path, 0)
        demand = book.demand.get(q.path, 0)
        want = 0.0
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
            out[q.path] = (math.ceil(want - 1e-9), " and ".join(reasons))
    return out


def decide(book: QueueBook, shares: Shares, now: float, candidates: list[Candidate],
           reclaiming: dict[str, int], placement: Placement | None = None) -> list[Decision]:
    """Preemptions to start now. `reclaiming`: GPUs already being taken back, per beneficiary queue. With a
    `placement`, only victims whose GPUs make a room a waiting job of the starving queue can use (module doc)."""
    inst = book.between(shares)
    decisions: list[Decision] = []
    taken: set[str] = set()
    left_over: dict[str, float] = {}     # victim queue -> GPUs it may still lose this round
    free = {r.node_id: r.free for r in placement.servers} if placement is not None else {}
    for path, (want, why) in owed(book, shares, now, reclaiming).items():
        q = book.tree.by_path[path]
        victims: list[Candidate] = []
        got = 0
        if placement is not None:
            victims = _placed_victims(book, inst, q.path, want, candidates, taken, left_over, placement, free)
            got = sum(v.gpus for v in victims)
            if victims:
                decisions.append(Decision(q.path, victims, f"queue {q.short} was {why}"))
                s = book.starvation[path]
                s.min_since = now if s.min_since is not None else None
                s.fair_since = now if s.fair_since is not None else None
            continue
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


def _placed_victims(book: QueueBook, inst: Mapping[str, int], path: str, want: int, candidates: list[Candidate],
                    taken: set[str], left_over: dict[str, float], placement: Placement,
                    free: dict[str, int]) -> list[Candidate]:
    """The victims for one starving queue, made room for job by job (module doc); updates `taken`, `left_over`
    and `free` (the rooms made are spoken for)."""
    by_id = {c.job_id: c for c in candidates}
    # Newest first, as without placement: among rooms of equal cost, the latest started loses.
    pool = [c for c in sorted(candidates, key=lambda c: (-c.started, -c.seq))
            if c.job_id not in taken and c.queue != path and _may_lose(book, c)]
    victims: list[Candidate] = []
    got = 0
    servers = placement.servers
    for w in placement.waiting.get(path, ()):
        if got >= want:
            break
        # It fits in idle GPUs at its level: no victim needed, and those GPUs are its.
        idle_room = priority.room_victims(w.gpus, w.level, servers, free, [], placement.held)
        if idle_room is not None:
            priority.occupy(free, [r for r in servers if r.node_id in idle_room[1]], w.gpus)
            got += w.gpus
            continue
        # The victims' queues must stay at or above their share: drop a would-be victim that would take its queue
        # below, and look again (each round removes one, so this ends).
        usable = [c for c in pool if c.job_id not in taken
                  and c.gpus <= left_over.get(c.queue, book.used.get(c.queue, 0) - inst.get(c.queue, 0))]
        while True:
            standings = [priority.Standing(c.job_id, c.seq, c.gpus) for c in usable]
            chosen = priority.room_victims(w.gpus, w.level, servers, free, standings, placement.held)
            if chosen is None:
                break
            ids, used_servers = chosen
            spend: dict[str, float] = {}
            over = ""
            for job_id in ids:
                c = by_id[job_id]
                spend[c.queue] = spend.get(c.queue, 0) + c.gpus
                room = left_over.get(c.queue, book.used.get(c.queue, 0) - inst.get(c.queue, 0))
                if spend[c.queue] > room:
                    over = job_id
                    break
            if over:
                usable = [c for c in usable if c.job_id != over]
                continue
            # A room may take back more than the queue is owed (a 16-GPU job owed 8): a room for less would be
            # useless, and the victims' queues stay at or above their shares. (Capping it at what is owed left big
            # jobs starving: on the Philly window, fifo's average JCT 10% worse.)
            freed = sum(by_id[j].gpus for j in ids)
            for job_id in ids:
                c = by_id[job_id]
                left_over[c.queue] = left_over.get(c.queue, book.used.get(c.queue, 0) - inst.get(c.queue, 0)) - c.gpus
                taken.add(job_id)
                victims.append(c)
                for node_id, g in placement.held.get(job_id, {}).items():
                    if node_id in free:
                        free[node_id] += g
            priority.occupy(free, [r for r in servers if r.node_id in used_servers], w.gpus)
            got += freed
            break
    return victims


def _may_lose(book: QueueBook, c: Candidate) -> bool:
    q = book.tree.by_path.get(c.queue)
    return q is not None and q.effective_preemptible


def settle_rooms(rooms: dict[str, list[str]], busy: set[str]) -> tuple[set[str], list[str]]:
    """Of the waiting jobs a room is being made for (-> their victims): those whose room is still being made (a
    victim in `busy`, under its preemption deadline), and those whose victims have all stopped, dropped from
    `rooms` (in its order)."""
    waiting: set[str] = set()
    done: list[str] = []
    for job_id, victims in list(rooms.items()):
        if any(v in busy for v in victims):
            waiting.add(job_id)
        else:
            del rooms[job_id]
            done.append(job_id)
    return waiting, done
