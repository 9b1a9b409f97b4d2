"""In-queue preemption (Tiresias-style): inside a leaf with a preemptive policy (las, srtf), a waiting job that
outranks running ones takes their GPUs. Off unless `RMSettings.inqueue_preemption` (the simulator's las / srtf).

The simulator asks this every half minimum run while jobs wait, so each queue keeps what its last look found
(`InQueueLook`): most calls end there, or after ranking just the jobs that changed since. The core tells this
object which jobs changed (`touch`) and carries out the preemptions it decides (the `preempt` callback); the
records (jobs, live containers) are the core's dicts, read only here.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpurm.common.model import Container, ContainerKind, Job
from gpurm.queues.tree import Policy
from gpurm.rm.sched import preemption, priority
from gpurm.rm.sched.reservations import Reservations
from gpurm.rm.sched.scheduler import Scheduler
from gpurm.rm.sched.standing import Standings
from gpurm.rm.state.cluster import Cluster
from gpurm.rm.state.queuebook import QueueBook

# (victim job, the decision, grace seconds, now): the core sets the deadlines and tells the AM.
PreemptFn = Callable[[Job, preemption.Decision, float, float], None]


@dataclass
class InQueueLook:
    """What preempt_in_queue last found in one queue. Its answer can change only through the jobs changed since
    (`dirty`), jobs whose rank or age moves with the clock (`timers`: when, job), and, when it found outranking
    jobs but no room for them (`stuck`), GPUs coming idle."""

    worst: tuple[float, float] | None       # the worst rank of a running job old enough to be preempted
    best: tuple[float, float] | None        # the best rank of a waiting job (STARVED once starved)
    timers: list[tuple[float, str]]         # a heap: a young job grown old enough, a rank crossing a level,
                                            # a waiting job starving
    stuck: tuple[int, list[int]] | None = None   # the cluster's shape version and idle GPUs per server then
    dirty: dict[str, None] = field(default_factory=dict)

    def quiet_at(self, now: float) -> bool:
        """No timer has come due."""
        return not self.timers or self.timers[0][0] > now


class InQueuePreemption:
    def __init__(self, cluster: Cluster, queues: QueueBook, scheduler: Scheduler, standings: Standings,
                 jobs: dict[str, Job], live_by_job: dict[str, dict[str, Container]],
                 learners_live: dict[str, int], with_am_by_queue: dict[str, dict[str, None]],
                 nudged: dict[str, None], min_run_s: float, preempt: PreemptFn) -> None:
        self.cluster = cluster
        self.queues = queues
        self.scheduler = scheduler
        self.standings = standings
        self.jobs = jobs
        self.live_by_job = live_by_job
        self.learners_live = learners_live        # jobs running learners (the others wait)
        self.with_am_by_queue = with_am_by_queue  # per queue, unfinished jobs whose AM lives: who is weighed
        self.nudged = nudged                      # jobs whose next allocate reply says "plan now" (written here)
        self.min_run_s = min_run_s
        self.preempt = preempt
        self.looks: dict[str, InQueueLook] = {}
        # Waiting jobs a room is being made for -> their victims, while a victim still holds GPUs under its
        # preemption deadline (the grace). Such a job is not weighed again meanwhile: it still waits, and the GPUs
        # it is owed still look busy, so a look in the grace would make it a second room at the cost of more jobs.
        self.rooms_under_way: dict[str, list[str]] = {}
        # GPUs a room's victims freed, kept from those victims until the job the room was made for is granted them,
        # ends, or the hold runs out: job -> [(GPUs, until, victim)]. Its queue's hold (rm/sched/reclaim.py) does not
        # keep them from the victims, which are of that queue too: a victim's AM, asking again as soon as it stopped,
        # won them back before the beneficiary's AM had seen them free, was preempted again, and so on while that job
        # waited.
        self.freed_for: dict[str, list[tuple[int, float, str]]] = {}
        self._rooms_cache: tuple[int, list[tuple[str, str, int]]] | None = None
        # Servers drained for a starving job (rm/sched/reservations.py): what is held there is no room for others.
        self.reservations: Reservations | None = None

    def touch(self, job: Job) -> None:
        """The job's rank, run or locality level changed: its queue's next look must weigh it."""
        look = self.looks.get(job.queue)
        if look is not None:
            look.dirty[job.job_id] = None

    def clear(self) -> None:
        """Forget every look (the queue config, and so the policies, may have changed)."""
        self.looks.clear()

    def _room_shapes(self) -> list[tuple[str, str, int]]:
        """(server, domain, GPUs offered) of the servers on offer, cached until nodes or health change."""
        cluster = self.cluster
        if self._rooms_cache is None or self._rooms_cache[0] != cluster.shape_version:
            self._rooms_cache = (cluster.shape_version, [(n.node_id, n.ib_domain or n.rack, n.healthy_gpus)
                                                         for n in cluster.nodes.values() if n.offering])
        return self._rooms_cache[1]

    def rooms(self) -> list[priority.Room]:
        """The servers as in-queue preemption sees them, those drained for a reservation left out: a room made
        there would preempt jobs for GPUs the scheduler then keeps for the reserved job, idle on both counts."""
        free = self.cluster.free
        reserved = self.reservations.on_node if self.reservations is not None else {}
        return [priority.Room(node_id, domain, size, free(node_id)) for node_id, domain, size in self._room_shapes()
                if node_id not in reserved]

    def idle_on(self) -> list[int]:
        """Idle GPUs per server, in `rooms` order (valid while the shape version stays)."""
        free = self.cluster.free
        return [free(node_id) for node_id, _, _ in self._room_shapes()]

    def run(self, busy: set[str], now: float) -> list[tuple[str, str]]:
        """One round over the queues; `busy`: jobs already under a preemption deadline. Returns (victim,
        beneficiary) pairs, each already preempted through the callback."""
        busy = self._with_rooms_under_way(busy)
        idle = self.cluster.free_gpus
        servers: list[priority.Room] | None = None
        out: list[tuple[str, str]] = []
        idle_on: list[int] | None = None
        for queue, members in self.with_am_by_queue.items():
            if not members:
                continue
            leaf = self.queues.tree.by_path.get(queue)
            if leaf is None:
                continue
            policy = self.scheduler.policy_of(leaf)
            if not priority.preemptive(policy):
                continue
            look = self.looks.get(queue)
            if look is not None:
                if look.stuck is None and self._still_quiet(look, members, policy, busy, now):
                    continue
                if look.stuck is not None and not look.dirty and look.quiet_at(now):
                    if idle_on is None:
                        idle_on = self.idle_on()
                    shape, before = look.stuck
                    if shape == self.cluster.shape_version \
                            and all(a <= b for a, b in zip(idle_on, before, strict=True)):
                        continue             # no GPU came idle anywhere: still no room for any of them
            self.looks.pop(queue, None)
            look, old_enough, candidates = self._scan(members, policy, busy, now)
            if not candidates:
                self.looks[queue] = look
                continue
            if sum(s.gpus for s in candidates) <= idle:
                for s in candidates:         # they all fit in the idle GPUs: their AMs are told to look now
                    self.nudged[s.job_id] = None
                continue
            # A job below one GPU is no victim: stopping it frees a share, rarely a whole GPU.
            running = [self.standings.standing(self.jobs[j], now) for j in old_enough
                       if not self.jobs[j].spec.shared]
            if servers is None:
                servers = self.rooms()
            held: dict[str, dict[str, int]] = {}
            for r in running:
                where = held[r.job_id] = {}
                for c in self.live_by_job.get(r.job_id, {}).values():
                    if c.kind is ContainerKind.LEARNER:
                        where[c.node_id] = where.get(c.node_id, 0) + c.gpus
            levels: dict[str, str] = {}      # each beneficiary's locality level, as its AM last reported it
            for w in candidates:
                attempt = self.jobs[w.job_id].current_attempt
                levels[w.job_id] = attempt.level if attempt is not None else ""
            fits: list[str] = []
            min_run = self.min_run_s
            pairs = priority.in_queue_victims(policy, now, candidates, running, servers, held, min_run, levels, fits,
                                              self.standings.las_thresholds, self.standings.history)
            if not pairs and not fits:
                # With fewer idle GPUs, and running jobs that rank the same or better, no room appears that was
                # not there: only its jobs' changes, its timers or GPUs coming idle can change this answer. (This
                # call's preemptions only set deadlines: the idle GPUs are still as they were.)
                if idle_on is None:
                    idle_on = self.idle_on()
                look.stuck = (self.cluster.shape_version, idle_on)
                self.looks[queue] = look
                continue
            for job_id in fits:
                self.nudged[job_id] = None
            for _, b in pairs:
                self.nudged[b] = None
            for victim, beneficiary in pairs:
                d = preemption.Decision(queue, [], f"outranked by {beneficiary} ({policy.value}) in its own queue")
                self.preempt(self.jobs[victim], d, leaf.preemption.grace_s, now)
                self.rooms_under_way.setdefault(beneficiary, []).append(victim)
            out.extend(pairs)
        return out

    def freed(self, victim: str, gpus: int, until: float) -> None:
        """A container of `victim` stopped under its preemption deadline: if it was a victim of a room under way,
        its GPUs are kept from it for the room's job until `until`."""
        for job_id, victims in self.rooms_under_way.items():
            if victim in victims:
                self.freed_for.setdefault(job_id, []).append((gpus, until, victim))
                return

    def held_from(self, now: float) -> dict[str, tuple[str, int]]:
        """The GPUs kept from each victim while its holds last: victim -> (the job they are kept for, GPUs)."""
        out: dict[str, tuple[str, int]] = {}
        for job_id, holds in self.freed_for.items():
            for gpus, until, victim in holds:
                if until > now:
                    out[victim] = (job_id, out[victim][1] + gpus if victim in out else gpus)
        return out

    def expire_holds(self, now: float) -> bool:
        """Drop the holds that ran out; whether any did (their GPUs may go to the victims now)."""
        dropped = False
        for job_id, holds in list(self.freed_for.items()):
            left = [h for h in holds if h[1] > now]
            if len(left) != len(holds):
                dropped = True
                if left:
                    self.freed_for[job_id] = left
                else:
                    del self.freed_for[job_id]
        return dropped

    def drop_holds(self, job_id: str) -> bool:
        """The job ended: nothing is kept for it any more. Whether something was."""
        return self.freed_for.pop(job_id, None) is not None

    def granted(self, job_id: str, gpus: int) -> None:
        """The job was granted `gpus`: that much of what was kept for it is answered."""
        held = self.freed_for.get(job_id)
        while held and gpus > 0:
            g, until, victim = held[0]
            take = min(g, gpus)
            gpus -= take
            if take == g:
                held.pop(0)
            else:
                held[0] = (g - take, until, victim)
        if held is not None and not held:
            del self.freed_for[job_id]

    def _with_rooms_under_way(self, busy: set[str]) -> set[str]:
        """`busy` (jobs under a preemption deadline) plus the waiting jobs whose room is still being made. A job
        whose victims have all stopped is weighed again (touched): if it did not get their GPUs it may need a room
        once more."""
        if not self.rooms_under_way:
            return busy
        waiting, done = preemption.settle_rooms(self.rooms_under_way, busy)
        for job_id in done:
            job = self.jobs.get(job_id)
            if job is not None:
                self.touch(job)
        return busy | waiting if waiting else busy

    def _scan(self, members: Mapping[str, None], policy: Policy, busy: set[str],
              now: float) -> tuple[InQueueLook, list[str], list[priority.Standing]]:
        """One queue's jobs ranked: what the look finds, the running jobs old enough to be preempted, and the
        waiting jobs that outrank one of them."""
        look = InQueueLook(None, None, [])
        old_enough: list[str] = []
        waiting: list[tuple[priority.Standing, tuple[float, float]]] = []
        for job_id in members:
            if job_id in busy:
                continue
            if job_id in self.learners_live:
                if self._weigh_running(look, job_id, policy, now):
                    old_enough.append(job_id)
            else:
                waiting.append(self._weigh_waiting(look, job_id, policy, now))
        heapq.heapify(look.timers)
        worst = look.worst
        candidates = [] if worst is None else [s for s, r in waiting if r < worst]
        return look, old_enough, candidates

    def _weigh_running(self, look: InQueueLook, job_id: str, policy: Policy, now: float) -> bool:
        """Fold a running job into `look` (timers unsorted); whether it is old enough to be preempted."""
        rank2, changes_at, since = self.standings.running_rank(self.jobs[job_id], policy, now)
        if since < 0:
            return False                     # a gang still being granted: nothing started to preempt
        if changes_at != float("inf"):
            look.timers.append((changes_at, job_id))
        if now - since < self.min_run_s:
            look.timers.append((since + self.min_run_s, job_id))
            return False
        if look.worst is None or rank2 > look.worst:
            look.worst = rank2
        return True

    def _weigh_waiting(self, look: InQueueLook, job_id: str, policy: Policy,
                       now: float) -> tuple[priority.Standing, tuple[float, float]]:
        """Fold a waiting job into `look` (timers unsorted); its Standing and its rank now."""
        s, k, starve_at = self.standings.waiting_rank(self.jobs[job_id], policy)
        if now <= starve_at and starve_at != float("inf"):
            look.timers.append((starve_at, job_id))
        r = priority.STARVED if now > starve_at else priority.preempt_rank(policy, k)
        if look.best is None or r < look.best:
            look.best = r
        return s, r

    def _still_quiet(self, look: InQueueLook, members: Mapping[str, None], policy: Policy, busy: set[str],
                     now: float) -> bool:
        """Whether, after a look that found no waiting job outranking a running one old enough to be preempted,
        there is still none; if so the jobs changed since, and those whose timers came due, are folded into it.
        Only they need ranking: the others rank as that look found them. A job that left can only have made the
        worst running rank better and the best waiting rank worse, so the look errs towards looking again."""
        timers = look.timers
        while timers and timers[0][0] <= now:
            look.dirty[heapq.heappop(timers)[1]] = None
        if not look.dirty:
            return True
        trial = InQueueLook(look.worst, look.best, [])
        for job_id in look.dirty:
            if job_id not in members or job_id in busy:
                continue                     # a full look would skip it too
            if job_id in self.learners_live:
                self._weigh_running(trial, job_id, policy, now)
            else:
                self._weigh_waiting(trial, job_id, policy, now)
        if trial.worst is not None and trial.best is not None and trial.best < trial.worst:
            return False
        look.worst, look.best = trial.worst, trial.best
        for t in trial.timers:
            heapq.heappush(timers, t)
        look.dirty.clear()
        return True
