"""`Waker`: which AMs the engine drives, so that only the AMs that can act are. The RM's scheduling pass wakes
the AMs it granted to, and those whose plan a grant took (the servers each acquiring AM waits on); GPUs coming
free wake the idle AMs (planning or backing off, holding and asking nothing) that might now fit, in the order
the RM serves them, and the running elastic jobs that want to grow; an AM's own deadline (a locality level
timing out, a back-off ending) wakes it through a TIMER event, unless it is stuck at its last level (`stuck`: its
plan there fails in the view; then only GPUs coming free can move it, and catching up skips the cycles it slept
through). None of this decides anything: the same AMs, in the same order, act as if every AM were driven at every
step."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from gpurm.am.placement import View
from gpurm.am.records import Phase
from gpurm.rm.sched import priority
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.sortedkeys import SortedKeys
from gpurm.sim.clock import TIMER, EventQueue
from gpurm.sim.clusterview import SharedView
from gpurm.sim.simam import SimAM

WAKE_SCAN = 256                # idle AMs looked at per queue when GPUs come free
IdleKey = tuple[tuple[float, float, int], int, str]   # an idle AM: (its job's rank, GPUs, job id)


class Waker:
    def __init__(self, core: RMCore, ams: dict[str, SimAM], dirty: dict[str, None], queue: EventQueue,
                 views: SharedView) -> None:
        self.core = core
        self.ams = ams
        self.dirty = dirty          # the AMs to drive next (shared with the engine, which drives them)
        self.queue = queue
        self.views = views
        # (GPUs, job id) of idle AMs: planning or backing off, holding and asking nothing. They get no timer
        # events; GPUs coming free wake them, and they catch up on their timers first (Master.catch_up).
        # Per leaf queue, in the queue's policy order: (rank, GPUs, job id). See wake_planners.
        self.idle: dict[str, SortedKeys[IdleKey]] = {}
        self.idle_key: dict[str, tuple[str, IdleKey]] = {}
        # The same, less the dormant AMs: backing off with a timer armed for the back-off's end. Waking passes over
        # them (nothing to catch up, nothing to arm), so while a queue's list is within WAKE_SCAN the pass reads
        # this one instead: the same AMs, in the same order, that would act.
        self.idle_active: dict[str, SortedKeys[IdleKey]] = {}
        self.dormant: dict[str, None] = {}
        # Servers each acquiring AM (holding nothing) waits on: a grant there may have taken them from it.
        self.asked_on: dict[str, dict[str, None]] = {}
        self.asking_nodes: dict[str, tuple[str, ...]] = {}
        self._woken_at_release = -1
        # Running elastic jobs below their target: driven again whenever GPUs come free, to ask for growth.
        self.growers: dict[str, None] = {}
        self._grown_at_release = -1
        # True: time and drive stuck AMs like any idle AM (as before `stuck`); what checks that leaving them
        # untimed changes no decision compares the two (tests/unit/test_sim_stuck.py).
        self.time_stuck = False

    def run_pass(self, now: float) -> None:
        """The RM's scheduling pass; AMs granted something, or whose plan a grant took, get driven."""
        grants = self.core.schedule(now)
        for grant in grants:
            self.dirty[grant.job_id] = None
        self.wake_nudged()
        if grants:
            view = self.views.current()
            for node_id in {g.node_id: None for g in grants}:
                for job_id in self.asked_on.get(node_id, ()):
                    master = self.ams[job_id].master
                    if job_id not in self.dirty and master.plan_taken_in(view):
                        # The grant took GPUs from under its plan. Every grant of earlier passes has reached its
                        # AM already, so this pass was the RM's answer to its asks: nothing. That is what its
                        # next allocate reply would say; tell it so now and let it look (one drive, not two).
                        master.on_reply()
                        self.dirty[job_id] = None

    def wake_nudged(self) -> None:
        """Drive the AMs the RM told to plan now: a reservation of theirs is ready (their next allocate reply
        says so)."""
        for job_id in self.core.take_told():
            am = self.ams.get(job_id)
            if am is not None and not am.done:
                self.dirty[job_id] = None

    def wake_growers(self) -> None:
        """After GPUs came free, drive the running elastic jobs that want to grow (their AMs ask, the RM grants
        only what nobody waits for)."""
        core = self.core
        releases = core.cluster.releases
        if not self.growers or releases == self._grown_at_release:
            return
        self._grown_at_release = releases
        free = core.cluster.free_gpus
        if free <= 0 or any(a.registered and a.app.asks and not a.app.blocked for a in core.asking.values()):
            return                       # nothing idle, or a job waits: the RM would grant no growth now
        budget = core.growth_budget()
        # The longest unserved first, until what they want adds up to what growth may take (not one per free
        # GPU: a herd of AMs asking for the same GPUs): woken ones go to the back.
        for job_id in list(self.growers):
            if budget <= 0:
                break
            del self.growers[job_id]
            self.growers[job_id] = None
            self.dirty[job_id] = None
            m = self.ams[job_id].master
            budget -= max(1, m.target - m.live_gpus)

    def wake_planners(self, now: float) -> None:
        """After GPUs came free, wake idle AMs that might now fit, in the order the RM serves them (neediest queue
        first, then the queue's policy), until their sizes add up to twice what is free: the RM would refuse the
        rest anyway, and waking every waiting AM for one free GPU makes a thundering herd. Taking GPUs never
        makes a plan possible that was not, so nothing is woken without a release. An AM stuck in the new view
        (`stuck`) is not driven, only counted: it would plan and fail."""
        releases = self.core.cluster.releases
        if not self.idle or releases == self._woken_at_release:
            return
        self._woken_at_release = releases
        view = self.views.current()
        free = view.total_free
        if free <= 0:
            return
        budget = 2 * free
        woken = 0
        for entry in self._wake_order():
            gpus, job_id = entry[1], entry[2]
            if gpus > free:
                continue
            am = self.ams[job_id]
            m = am.master
            # A timer already armed for its next deadline, still ahead: catching up and arming are no-ops.
            armed = am.wake_at is not None and am.wake_at > now and m.next_deadline() == am.wake_at
            if not armed:
                m.catch_up(now)
            if m.phase is Phase.PLANNING and not view.cannot_fit(gpus, m.level):
                # Its plan on this view may still fail (the aggregates are not the plan): then driving it would
                # only fail again. It counts against the budget all the same, so the others woken stay the same.
                if not self.stuck(am, view.for_job(job_id, now, m.expected_run_s)):
                    self.dirty[job_id] = None
                woken += gpus
                if woken >= budget:
                    return
            elif not armed and not self.stuck(am, view.for_job(job_id, now, m.expected_run_s)):
                self.arm_timer(am, now)      # it fits somewhere now: its timers (relaxing) can lead there
                self.sync_dormant(am)

    @property
    def ranked_preemption(self) -> bool:
        """Whether the RM preempts by rank: in-queue preemption (las, srtf, gittins) or a borrowing policy."""
        return self.core.settings.inqueue_preemption or self.core.queues.borrowing is not None

    def stuck(self, am: SimAM, view: View) -> bool:
        """Whether an idle AM's timers can only lead it through plans that fail until GPUs come free: it is at its
        last level and its plan there fails in `view`, the view it would plan on (Master.stuck). Such an AM gets no
        timer, as one that waits for more GPUs than are free gets none: a release wakes it (wake_planners), and
        catching up skips the cycles it slept through. Its timers would have driven it only to fail again.
        Not while the RM preempts by rank (in-queue preemption, a borrowing policy): there the settles those
        drives brought (the RM's time-driven looks, the attempt reports marking jobs changed) moved its decisions
        (the golden las and srtf replays: 2% of the jobs), so its AMs keep their timers. Nor an AM that learns how
        fast GPUs come free from the views it is shown (CostRelax.use_rate): what it learns would change. Nor while
        the RM reserves GPUs (`reservations`): a reservation given up frees GPUs in the views without a release."""
        if self.time_stuck or self.ranked_preemption or self.core.settings.reservations > 0:
            return False
        m = am.master
        return (m.relax is None or not m.relax.use_rate) and m.stuck(view)

    def _entries(self, queue: str) -> list[IdleKey]:
        """The idle AMs of a queue that waking looks at, in its order (the first WAKE_SCAN; the active ones only
        while that is all of them). A copy: waking changes which AMs are dormant."""
        members = self.idle[queue]
        return list(self.idle_active[queue]) if len(members) <= WAKE_SCAN else members.head(WAKE_SCAN)

    def _wake_order(self) -> Iterator[IdleKey]:
        """Idle AMs in the order the RM serves them. `borrowing: fair`: the neediest queue first (usage /
        instantaneous share), then the queue's policy. Under a borrowing policy: first what fits within each queue's
        steady share (the neediest queue first), then every queue's AMs together in rank order, as the scheduling
        pass serves borrowers (rm/sched/scheduler.py). Each queue's entries are read when first reached."""
        book = self.core.queues
        shares = book.shares(self.core.cluster.capacity)
        fair = book.between(shares)
        used = book.used

        def neediness(queue: str) -> tuple[float, str]:
            share, u = fair.get(queue, 0), used.get(queue, 0)
            return ((u / share) if share > 0 else (float("inf") if u else 1e9), queue)

        queues = sorted((q for q, members in self.idle.items() if members), key=neediness)
        if book.borrowing is None:
            for queue in queues:
                yield from self._entries(queue)
            return
        lists = {queue: self._entries(queue) for queue in queues}
        seen: set[str] = set()
        for queue in queues:
            room = fair.get(queue, 0) - used.get(queue, 0)
            for entry in lists[queue]:
                if room <= 0:
                    break
                if entry[1] <= room:
                    room -= entry[1]
                    seen.add(entry[2])
                    yield entry
        for entry in heapq.merge(*lists.values()):
            if entry[2] not in seen:
                yield entry

    def set_idle(self, am: SimAM, now: float, idle: bool) -> None:
        old = self.idle_key.pop(am.job_id, None)
        if old is not None:
            self.idle[old[0]].discard(old[1])
            if am.job_id in self.dormant:
                del self.dormant[am.job_id]
            else:
                self.idle_active[old[0]].discard(old[1])
        if idle:
            job = self.core.jobs[am.job_id]
            leaf = self.core.queues.tree.by_path[job.queue]
            rank = priority.rank(self.core.scheduler.policy_of(leaf), now, self.core.settings.las_thresholds_gpu_s,
                                 self.core.standings.history)(self.core.standing(job, now))
            key = (rank, am.trace.gpus, am.job_id)
            self.idle.setdefault(job.queue, SortedKeys()).add(key)
            self.idle_active.setdefault(job.queue, SortedKeys()).add(key)
            self.idle_key[am.job_id] = (job.queue, key)
            self.sync_dormant(am)

    def sync_dormant(self, am: SimAM) -> None:
        """Keep an idle AM's place among the dormant ones (see idle_active) up to date after its timer or state
        changed."""
        entry = self.idle_key.get(am.job_id)
        if entry is None:
            return
        m = am.master
        dormant = am.wake_at is not None and m.phase is Phase.BACKOFF and m.backoff_until == am.wake_at
        if dormant != (am.job_id in self.dormant):
            if dormant:
                self.dormant[am.job_id] = None
                self.idle_active[entry[0]].discard(entry[1])
            else:
                del self.dormant[am.job_id]
                self.idle_active[entry[0]].add(entry[1])

    def track_asks(self, job_id: str, nodes: tuple[str, ...]) -> None:
        old = self.asking_nodes.pop(job_id, ())
        if not old and not nodes:
            return
        for n in old:
            waiting = self.asked_on.get(n)
            if waiting is not None:
                waiting.pop(job_id, None)
        if nodes:
            self.asking_nodes[job_id] = nodes
            for n in nodes:
                self.asked_on.setdefault(n, {})[job_id] = None

    def arm_timer(self, am: SimAM, now: float) -> None:
        deadline = am.master.next_deadline()
        if deadline is None:
            am.wake_at = None                     # a timer still queued is stale now (running: nothing to time)
            return
        if deadline <= now:
            raise RuntimeError(f"AM of {am.job_id} ({am.master.phase.name}) wants waking at {deadline}, "
                               f"not after now ({now})")
        if deadline != am.wake_at:
            am.wake_at = deadline
            self.queue.push(deadline, TIMER, (am.job_id, deadline))
