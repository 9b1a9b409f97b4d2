"""The discrete-event simulator: the real RMCore (queues, scheduler, preemption) and one real AM `Master` per job,
driven on a virtual clock. Nothing here decides who gets GPUs; it only plays the parts of the agents (processes
start at once, end when their work is done or when told to stop) and of the AM shells (call allocate, launch what
the Master launches).

Time advances from event to event: job arrivals, learners finishing, injected failures, AM timers (a locality
level timing out, a back-off ending), preemption deadlines, and starvation checks. After each event the engine
*settles*: it runs the RM's scheduling pass and drives every AM that has news until nothing moves.

Speed: only the AMs that can act are driven. Grants, ends and preemption notices name their jobs; an AM still
planning is woken only when enough GPUs may have come free for it (an index of planning AMs by size), and the
planner answers most "does anything fit" questions from the view's aggregates alone. The shared view is updated
from the servers that changed, and waking skips AMs that are only waiting out a back-off with its timer armed.
None of this changes what the RM or any AM decides: the same inputs give the same results as driving every AM.

Why it is over 500 lines: it plays every part the daemons play (agents, AM shells, the RM's timers) inside one
event loop whose handlers share the job table and the event heap; what stands alone is out: the run-time model
(runtime.py), the traces (trace.py), the metrics (metrics.py), the cluster shapes (clusterspec.py).
"""

from __future__ import annotations

import dataclasses
import enum
import gc
import heapq
import logging
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from gpurm.am.master import AttemptRecord, Ended, Held, Launch, Master, Phase, Stop
from gpurm.am.placement import ServerView, View, fewest_of
from gpurm.am.relax import CostRelax
from gpurm.queues.tree import Policy, QueueTree
from gpurm.rm import priority
from gpurm.rm.cluster import GpuRecord
from gpurm.rm.core import RMCore
from gpurm.rm.jobspec import JobSpec, Locality, LocalityMode
from gpurm.rm.messages import AttemptUpdate, ContainerReport, LaunchAM, NodeRegistration, RequestError, RMSettings
from gpurm.rm.model import Container, ContainerKind, ExitKind, JobState
from gpurm.rm.scheduler import Ask
from gpurm.rm.sortedkeys import SortedKeys
from gpurm.sim.clusterspec import SimServer
from gpurm.sim.metrics import JobResult, Timeline
from gpurm.sim.runtime import RuntimeConfig, checkpointed, elastic_speedup, rate, sensitivity_of
from gpurm.sim.trace import Trace, TraceJob

log = logging.getLogger(__name__)

# Event kinds, in the order they are handled when simultaneous.
FINISH, FAIL, ARRIVE, TIMER, CHECK = range(5)
SETTLE_LIMIT = 10000           # rounds of driving AMs after one event (a bug guard: real settles take a few)
WAKE_SCAN = 256                # idle AMs looked at per queue when GPUs come free
IdleKey = tuple[tuple[float, float, int], int, str]   # an idle AM: (its job's rank, GPUs, job id)
# The virtual clock the cores see starts here, not at 0: the RM's records use 0.0 for "never" (a learner that
# started at 0.0 would look unstarted), as real clocks never read 0. Everything reported is counted from the
# trace's first submission again. A power of two, so adding it keeps the trace's times exact.
ORIGIN = float(2**20)


class RelaxPolicy(enum.Enum):
    """How every job's AM trades waiting for locality against running spread (`gpurm sim --relax`)."""

    TIMEOUT = "timeout"       # the AM's default: wait `locality.timeout` at each level, then relax one level
    COST = "cost"             # relax by expected cost (am/relax.py), the trace's duration as the expected run time
    NEVER = "never"           # every job `locality: strict`: never relax past the best level the cluster allows
    IMMEDIATE = "immediate"   # every job `locality: any`: no waiting for locality at all


@dataclass
class SimOptions:
    policy: Policy | None = None           # every leaf uses this policy (None: the queue config's)
    failures_per_1000_gpu_h: float = 0.0   # injected infrastructure failures (Poisson, per learner GPU-hour)
    seed: int = 0
    max_acquiring_per_queue: int = 10**9   # the RM's AM admission cap per queue (off by default: see docs/sim.md)
    max_retries: int = 3
    inqueue_min_run_s: float = 300.0
    locality: Locality = field(default_factory=Locality)   # every job's locality settings (the RM's defaults)
    # The `placement` run-time model's constants (sim/runtime.py); None: the `ideal` model (full speed anywhere,
    # instant checkpoints), exactly the behaviour before the model existed.
    runtime: RuntimeConfig | None = None
    relax: RelaxPolicy = RelaxPolicy.TIMEOUT


@dataclass
class Run:
    """One attempt's learners while they run."""

    token: int
    start: float
    containers: dict[str, str]           # container -> node
    ended: bool = False
    finish_seq: int = 0                  # the FINISH event still valid (placement: re-timed when the rate changes)
    # The `placement` model only (see sim/runtime.py):
    rate: float = 1.0                    # work (full-speed seconds) per second now
    productive_from: float = 0.0         # the restart cost paid, work begins here
    accounted_at: float = 0.0            # work is counted up to here
    work: float = 0.0                    # work done by this attempt
    nodes: tuple[str, ...] = ()          # its servers, when more than one (they share network links)
    racks: int = 1
    gpus: int = 0                        # elastic jobs: the GPUs its learners hold now
    # (time, work, rate from then): every rate change, to find the work saved at the last checkpoint.
    breaks: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass
class SimAM:
    job_id: str                          # the RM's job id
    trace: TraceJob
    master: Master
    am_attempt: int
    am_container: str
    am_node: str
    response_id: int = 0
    progress_s: float = 0.0              # work done (seconds at full speed), kept across attempts (checkpoints)
    run: Run | None = None
    wake_at: float | None = None
    first_start: float | None = None
    done: bool = False
    # The `placement` model only:
    sensitivity: float = 0.0
    restart_after: str = ""              # "preemption" / "failure": the next attempt pays the restart cost
    run_s: float = 0.0                   # productive seconds run (all attempts)
    slow_s: float = 0.0                  # the integral of 1 / rate over them (run_s x the mean slowdown)
    lost_preemption_gpu_s: float = 0.0   # GPU-time lost to preemption: work since the checkpoint, restarts
    lost_failure_gpu_s: float = 0.0      # the same for failed attempts


@dataclass
class SimResult:
    results: list[JobResult]
    timeline: Timeline
    capacity: int
    wall_s: float
    events: int
    settles: int
    preemptions: int
    extra: dict[str, object] = field(default_factory=dict)


class Engine:
    def __init__(self, trace: Trace, servers: list[SimServer], tree: QueueTree, options: SimOptions) -> None:
        self.trace = trace
        self.options = options
        modes = {RelaxPolicy.NEVER: LocalityMode.STRICT, RelaxPolicy.IMMEDIATE: LocalityMode.ANY}
        mode = modes.get(options.relax)
        self.forced_mode = mode        # `--relax never|immediate`: every job's mode, its own (trace) mode too
        self.locality = options.locality if mode is None else dataclasses.replace(options.locality, mode=mode)
        policy = options.policy
        settings = RMSettings(
            heartbeat_interval_s=1e15, missed_beats=1, container_start_timeout_s=1e15, am_register_timeout_s=1e15,
            am_liveness_timeout_s=1e15, max_active_ams=10**9, max_acquiring_per_queue=options.max_acquiring_per_queue,
            kill_grace_s=0.0, inqueue_preemption=policy is None or priority.preemptive(policy),
            inqueue_min_run_s=options.inqueue_min_run_s)
        self.core = RMCore(settings, tree)
        self.core.scheduler.policy_override = policy
        for server in servers:
            self.core.register_node(NodeRegistration(server.node_id, "sim", 1, server.rack, server.rack,
                                                     [GpuRecord(i) for i in range(server.gpus)]), server.node_id, 0.0)
        self.core.take_outbox()
        self.capacity = sum(s.gpus for s in servers)
        self.servers = servers
        self.events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.ams: dict[str, SimAM] = {}
        self.by_trace: dict[str, str] = {}
        self._pending_trace: dict[str, TraceJob] = {}    # submitted, AM not started yet
        self.dirty: dict[str, None] = {}
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
        self.beneficiary: dict[str, str] = {}     # in-queue preemption victim -> the job it makes room for
        self.results: list[JobResult] = []
        self.rejected: list[str] = []
        self.timeline = Timeline(times=[], allocated=[], per_queue={q.path: [] for q in tree.leaves})
        self._last_used: tuple[float, ...] | None = None
        self._view: View | None = None
        self._view_version = -1
        self._server_views: dict[str, ServerView] = {}
        self._token = 0
        self._check_at: float | None = None
        self._woken_at_release = -1
        # Running elastic jobs below their target: driven again whenever GPUs come free, to ask for growth.
        self.growers: dict[str, None] = {}
        self._grown_at_release = -1
        self.rng = random.Random(options.seed)
        self.n_events = 0
        self.n_settles = 0
        # The `placement` model: the running multi-server jobs on each server, and the shape of the cluster.
        self.runtime = options.runtime
        self.on_server: dict[str, dict[str, None]] = {}
        self.rack_of = {s.node_id: s.rack for s in servers}
        rack_gpus: dict[str, int] = {}
        for s in servers:
            rack_gpus[s.rack] = rack_gpus.get(s.rack, 0) + s.gpus
        self._rack_sizes = sorted(rack_gpus.values(), reverse=True)

    # ------------------------------------------------------------ event queue

    def push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, kind, self._seq, payload))

    def run(self, progress: Callable[[float, int, int], None] | None = None) -> SimResult:
        # The replay allocates millions of short-lived records and keeps every job's: the cyclic collector's full
        # passes over that heap cost a sixth of the run and find next to nothing. Off while replaying.
        gc_was_on = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            if gc_was_on:
                gc.enable()

    def _run(self, progress: Callable[[float, int, int], None] | None) -> SimResult:
        t0 = time.perf_counter()
        for job in self.trace.jobs:
            self.push(job.submit_s + ORIGIN, ARRIVE, job)
        done_before = 0
        last_report = t0
        while self.events:
            now, kind, _, payload = heapq.heappop(self.events)
            self.n_events += 1
            moved = self.handle(now, kind, payload)
            # Take every event of the same instant before settling: fewer, fuller passes.
            while self.events and self.events[0][0] == now:
                _, kind, _, payload = heapq.heappop(self.events)
                self.n_events += 1
                moved = self.handle(now, kind, payload) or moved
            if moved:
                self.settle(now)
            if progress is not None and time.perf_counter() - last_report > 0.5:
                last_report = time.perf_counter()
                if len(self.results) != done_before:
                    done_before = len(self.results)
                progress(now - ORIGIN, len(self.results), len(self.trace.jobs))
        self.finish_unfinished()
        self.timeline.close_below(self.timeline.times[-1] if self.timeline.times else 0.0)
        wall = time.perf_counter() - t0
        return SimResult(self.results, self.timeline, self.capacity, wall, self.n_events, self.n_settles,
                         sum(r.preemptions for r in self.results))

    def handle(self, now: float, kind: int, payload: object) -> bool:
        """Apply one event; False when it turned out to change nothing (a stale timer), so no settle is due."""
        if kind == ARRIVE:
            assert isinstance(payload, TraceJob)
            self.arrive(payload, now)
        elif kind == FINISH:
            job_id, token, seq = cast(tuple[str, int, int], payload)
            self.learners_done(job_id, token, seq, now)
        elif kind == FAIL:
            job_id, token, node = cast(tuple[str, int, str], payload)
            self.learner_failed(job_id, token, node, now)
        elif kind == TIMER:
            job_id, at = cast(tuple[str, float], payload)
            am = self.ams.get(job_id)
            if am is None or am.done or am.wake_at != at:
                return False
            am.wake_at = None
            self.sync_dormant(am)
            if am.master.idle and self.view().total_free < am.trace.gpus:
                return False                      # nothing fits any more: back to waiting for a release
            self.dirty[job_id] = None
        elif kind == CHECK:
            if payload != self._check_at:
                return False                      # a later-scheduled check replaced this one
            self._check_at = None
            grow = bool(self.core.elastic.growth) and self.core.elastic.hold_over(now)
            if not self.check_preemption(now) and not grow:
                self.schedule_check(now)          # nothing came due: no settle, just the next check
                return False
        return True

    # ------------------------------------------------------------ jobs arriving, AMs starting

    def arrive(self, tj: TraceJob, now: float) -> None:
        spec = JobSpec(gpus=tj.gpus, command=["sim"], name=tj.name or tj.job_id, queue=tj.queue,
                       max_retries=self.options.max_retries, locality=self.job_locality(tj), placement=tj.placement,
                       max_gpus=tj.max_gpus, gpu_share_milli=tj.gpu_share_milli)
        try:
            # ACLs are not checked: a trace's users are not this cluster's users.
            job = self.core.submit(spec, tj.user or "sim", now, submit_id=tj.job_id, check_acl=False)
        except RequestError as exc:
            # The queue config refuses it (a size above a queue's max_gpus ...): the RM would answer the submit
            # with this error, so the job never runs.
            log.debug("job %s rejected: %s", tj.job_id, exc)
            self.rejected.append(tj.job_id)
            self.results.append(JobResult(tj.job_id, tj.queue, tj.gpus, tj.submit_s, None, None, tj.duration_s,
                                          0, 0, 0, 0, 0, 0.0, "REJECTED"))
            return
        job.expected_gpu_s = tj.duration_s * tj.gpus
        self.by_trace[job.job_id] = tj.job_id
        self._pending_trace[job.job_id] = tj

    def job_locality(self, tj: TraceJob) -> Locality:
        """The run's locality settings, with the trace job's own (jsonl `locality`) in their place."""
        if tj.locality is None:
            return self.locality
        own = tj.locality.over(self.options.locality)
        return own if self.forced_mode is None else dataclasses.replace(own, mode=self.forced_mode)

    def start_ams(self, now: float) -> None:
        outbox = self.core.take_outbox()
        if not outbox:
            return
        for effect in [e for e in outbox if type(e) is LaunchAM]:
            tj = self._pending_trace.pop(effect.job_id)
            self.report(effect.node_id, [ContainerReport(effect.container_id, "RUNNING", pid=1)], now)
            job, _ = self.core.register_am(effect.job_id, effect.am_attempt, now)
            seed = zlib.crc32(f"{self.options.seed}:{tj.job_id}".encode())
            sensitivity = (sensitivity_of(tj.job_id, tj.name, tj.sensitivity, self.runtime, self.options.seed,
                                          tj.locality.mode if tj.locality is not None else None)
                           if self.runtime is not None else 0.0)
            # The simulator's cost-based AM knows each job's run time from the trace (an oracle, like srtf).
            # Its slowdowns come from the run-time model's constants (the defaults under `ideal`).
            relax = (CostRelax(tj.duration_s, sensitivity=sensitivity if self.runtime is not None else 1.0,
                               config=self.runtime or RuntimeConfig())
                     if self.options.relax is RelaxPolicy.COST else None)
            master = Master(job.spec, now, rng=random.Random(seed), relax=relax)
            am = SimAM(effect.job_id, tj, master, effect.am_attempt, effect.container_id, effect.node_id)
            am.sensitivity = sensitivity
            self.ams[effect.job_id] = am
            master.on_view(self.view(), now)
            self.dirty[effect.job_id] = None

    # ------------------------------------------------------------ the cluster view, shared by every AM

    def view(self) -> View:
        cluster = self.core.cluster
        if self._view is None or cluster.version != self._view_version:
            changed = []
            added = False
            for node_id in sorted(cluster.take_changed()):
                n = cluster.nodes[node_id]
                added = added or node_id not in self._server_views
                elastic = self.core.elastic.reclaimable(node_id) if self.core.elastic.on_node else []
                # GPUs held by elastic growth count as free to plan on (the RM takes them back for a waiting ask).
                free = tuple(sorted({*n.free_indices(), *elastic})) if elastic else tuple(n.free_indices())
                sv = ServerView(node_id, n.rack, n.healthy_gpus, free, tuple(tuple(i) for i in n.islands),
                                n.ib_domain, tuple(elastic))
                self._server_views[node_id] = sv
                changed.append(sv)
            if self._view is None or added:
                self._view = View(self._server_views[k] for k in sorted(self._server_views))
            else:
                self._view = self._view.updated(changed)    # the same View, built from the changes alone
            self._view_version = cluster.version
        return self._view

    # ------------------------------------------------------------ settling

    def settle(self, now: float) -> None:
        self.n_settles += 1
        self.start_ams(now)
        for _ in range(SETTLE_LIMIT):
            self.wake_growers()
            self.wake_planners(now)
            self.run_pass(now)
            if not self.dirty:
                break
            batch, self.dirty = list(self.dirty), {}
            for job_id in batch:
                am = self.ams.get(job_id)
                if am is not None and not am.done:
                    self.drive(am, now)
            self.apply_stop_orders(now)
            self.start_ams(now)
        else:
            raise RuntimeError(f"the simulation did not settle at t={now}: {len(self.dirty)} AMs still moving")
        self.record_usage(now)
        self.schedule_check(now)

    def run_pass(self, now: float) -> None:
        """The RM's scheduling pass; AMs granted something, or whose plan a grant took, get driven."""
        grants = self.core.schedule(now)
        for grant in grants:
            self.dirty[grant.job_id] = None
        if grants:
            view = self.view()
            for node_id in {g.node_id: None for g in grants}:
                for job_id in self.asked_on.get(node_id, ()):
                    master = self.ams[job_id].master
                    if job_id not in self.dirty and master.plan_taken_in(view):
                        # The grant took GPUs from under its plan. Every grant of earlier passes has reached its
                        # AM already, so this pass was the RM's answer to its asks: nothing. That is what its
                        # next allocate reply would say; tell it so now and let it look (one drive, not two).
                        master.on_reply()
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
        makes a plan possible that was not, so nothing is woken without a release."""
        releases = self.core.cluster.releases
        if not self.idle or releases == self._woken_at_release:
            return
        self._woken_at_release = releases
        view = self.view()
        free = view.total_free
        if free <= 0:
            return
        book = self.core.queues
        shares = book.shares(self.core.cluster.capacity)
        inst = shares.instantaneous

        def neediness(queue: str) -> tuple[float, str]:
            share, used = inst.get(queue, 0), book.used.get(queue, 0)
            return ((used / share) if share > 0 else (float("inf") if used else 1e9), queue)

        budget = 2 * free
        woken = 0
        for queue in sorted((q for q, members in self.idle.items() if members), key=neediness):
            # Nothing below changes the idle index, so it is read in place (the first WAKE_SCAN entries). The loop
            # changes which AMs are dormant, so it reads a copy when it reads the list of active ones.
            members = self.idle[queue]
            entries = list(self.idle_active[queue]) if len(members) <= WAKE_SCAN else members.head(WAKE_SCAN)
            for entry in entries:
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
                    self.dirty[job_id] = None
                    woken += gpus
                    if woken >= budget:
                        return
                elif not armed:
                    self.arm_timer(am, now)      # it fits somewhere now: its timers (relaxing) can lead there
                    self.sync_dormant(am)

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
                                 self.core.standings.gittins)(self.core.standing(job, now))
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

    def drive(self, am: SimAM, now: float) -> None:
        m = am.master
        if am.job_id in self.idle_key:
            self.set_idle(am, now, False)
        m.catch_up(now)
        m.on_view(self.view(), now)              # the current view, and a step
        planned = m.asks()
        asks = [Ask(gpus=g, node_id=n, preferred=idx) for n, g, idx in planned]
        if am.trace.max_gpus:
            asks += [Ask(gpus=g, node_id=n, preferred=idx, elastic=True) for n, g, idx in m.growth_asks(now)]
        self.track_asks(am.job_id, tuple(n for n, _, _ in planned) if not m.held else ())
        reports = [_update(a) for a in m.take_reports(None)] if m.dirty else []
        r = self.core.allocate(am.job_id, am.am_attempt, am.response_id, asks, m.take_releases(), reports, now,
                               schedule=False)
        am.response_id = r.response_id
        if asks:
            self.run_pass(now)       # an RM under light load answers asks at once: later AMs see the grants
        for g in r.grants:
            node = self.core.cluster.nodes[g.node_id]
            m.on_grant(Held(g.container_id, g.node_id, node.rack, node.host, 1, tuple(g.gpu_indices),
                            preemptible=g.preemptible), now)
        if r.preempt_ids:          # the notice before the ends, as the AM process does (am/runner.py)
            m.on_preempted(r.preempt_ids, max(0.0, r.preempt_deadline - now), now, r.preempt_reason)
        for c in r.completed:
            m.on_ended(_ended(c), now)
        if r.kill_requested:
            m.on_kill("killed", now)
        if r.plan_now:
            m.on_room(now)
        m.on_reply()
        self.execute(am, m.take_actions(), now)
        if m.final is not None:
            self.growers.pop(am.job_id, None)
            self.finish(am, now)
            return
        if am.trace.max_gpus:
            if m.phase is Phase.RUNNING and m.live_gpus < m.target:
                self.growers[am.job_id] = None
            else:
                self.growers.pop(am.job_id, None)
        if m.releases or m.dirty or m.plan_looks_taken:
            self.dirty[am.job_id] = None          # more to tell the RM, or its plan to settle
        if m.idle:
            self.set_idle(am, now, True)
            if self.view().total_free < am.trace.gpus:
                return                            # nothing can fit until GPUs come free: wake_planners will call
        self.arm_timer(am, now)
        self.sync_dormant(am)

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
            self.push(deadline, TIMER, (am.job_id, deadline))

    def execute(self, am: SimAM, actions: list[Launch | Stop], now: float) -> None:
        for action in actions:
            if isinstance(action, Launch):
                self.launch(am, action, now)
            else:
                self.end_container(action.held.container_id, action.held.node_id,
                                   ContainerReport(action.held.container_id, "EXITED", signal=15, stopped=True), now)

    def launch(self, am: SimAM, launch: Launch, now: float) -> None:
        if all((r := am.master.runs.get(h.container_id)) is not None and r.extra for h, _, _ in launch.learners):
            if am.run is not None and not am.run.ended and self.runtime is not None:
                self.grow(am, launch, now)
            else:
                # Granted in the reply that also brought the end of its gang, which the AM had not heard yet:
                # the learners start into an attempt that is over, and its AM stops them with the others.
                self.start_learners(am, launch, now)
            return
        self._token += 1
        containers = {h.container_id: h.node_id for h, _, _ in launch.learners}
        am.run = Run(self._token, now, containers)
        self.start_learners(am, launch, now)
        if am.first_start is None:
            am.first_start = now
        remaining = max(0.0, am.trace.duration_s - am.progress_s)
        if self.runtime is None:
            self.push(now + remaining, FINISH, (am.job_id, self._token, 0))
        else:
            self.start_timed(am, self.runtime, now)
        failures = self.options.failures_per_1000_gpu_h
        if failures > 0:
            per_s = failures / 1000.0 * am.trace.gpus / 3600.0
            t_fail = self.rng.expovariate(per_s)
            # Under `placement` the attempt may run slower than full speed: a failure past the finish is stale.
            if t_fail < remaining or self.runtime is not None:
                node = self.rng.choice(sorted(set(containers.values())))
                self.push(now + t_fail, FAIL, (am.job_id, self._token, node))
        self.dirty[am.job_id] = None

    def start_learners(self, am: SimAM, launch: Launch, now: float) -> None:
        """The agents report the learners running (one heartbeat per server) and the AM hears they started."""
        by_node: dict[str, list[ContainerReport]] = {}
        for h, _, _ in launch.learners:
            by_node.setdefault(h.node_id, []).append(ContainerReport(h.container_id, "RUNNING", pid=1))
        for node_id, reports in by_node.items():
            self.report(node_id, reports, now)
        for h, _, _ in launch.learners:
            am.master.on_started(h.container_id, True, 1, "", False, now)

    def grow(self, am: SimAM, launch: Launch, now: float) -> None:
        """Grown learners of a running elastic job start (`placement` model): the job re-forms with them."""
        assert am.run is not None and self.runtime is not None
        self.start_learners(am, launch, now)
        grown = {**am.run.containers, **{h.container_id: h.node_id for h, _, _ in launch.learners}}
        self.resize(am, grown, self.runtime, now)
        self.dirty[am.job_id] = None

    def resize(self, am: SimAM, containers: dict[str, str], config: RuntimeConfig, now: float) -> None:
        """An elastic job's learners changed. Its workers restart from a checkpoint taken at the resize (all work
        so far is kept: torchrun's elastic restart), and after `resize_cost_s` it runs at the new size's rate: a
        new run, as far as the FINISH events and the run-time model know."""
        run = am.run
        assert run is not None
        self.accrue(am, run, now)
        am.progress_s = min(am.trace.duration_s, am.progress_s + run.work)
        touched: dict[str, None] = {am.job_id: None}
        self.leave_servers(am.job_id, run, touched)
        self._token += 1
        new = Run(self._token, now, containers)
        new.productive_from = now + config.resize_cost_s
        new.accounted_at = now
        new.gpus = sum(self.core.containers[cid].gpus for cid in containers if cid in self.core.containers)
        self.join_servers(am.job_id, new, touched)
        am.run = new
        self.retime(touched, config, now)

    # ------------------------------------------------------------ learners ending

    def learners_done(self, job_id: str, token: int, seq: int, now: float) -> None:
        am = self.ams.get(job_id)          # a stale event: the job may have ended another way meanwhile
        if am is None or am.run is None or am.run.token != token or am.run.ended or am.run.finish_seq != seq:
            return
        by_node: dict[str, list[str]] = {}
        for cid, node in am.run.containers.items():
            by_node.setdefault(node, []).append(cid)
        for node, cids in by_node.items():
            for cid in cids:
                self.end_container(cid, node, ContainerReport(cid, "EXITED", exit_code=0), now)

    def learner_failed(self, job_id: str, token: int, node: str, now: float) -> None:
        am = self.ams.get(job_id)
        if am is None or am.run is None or am.run.token != token or am.run.ended:
            return
        cid = next(c for c, n in am.run.containers.items() if n == node)
        self.end_container(cid, node, ContainerReport(cid, "LOST", diagnostics="injected failure", infra_failure=True),
                           now)

    def end_container(self, cid: str, node: str, report: ContainerReport, now: float) -> None:
        c = self.core.live.get(cid)
        if c is None:
            return
        job_id = c.job_id
        am = self.ams.get(job_id)
        if c.elastic and am is not None and am.run is not None and cid in am.run.containers and not am.run.ended \
                and not (report.state == "EXITED" and report.exit_code == 0 and not report.stopped) \
                and self.runtime is not None:
            # A grown learner taken back (or failed): the job re-forms without it and goes on.
            self.resize(am, {k: v for k, v in am.run.containers.items() if k != cid}, self.runtime, now)
            self.report(node, [report], now)
            self.dirty[job_id] = None
            return
        if am is not None and am.run is not None and cid in am.run.containers and not am.run.ended:
            am.run.ended = True                           # the attempt's work stops with its first learner
            if self.runtime is None:
                am.progress_s += now - am.run.start       # instant checkpoints: every second counts
            else:
                self.end_timed(am, self.runtime, report, now)
        self.report(node, [report], now)
        self.dirty[job_id] = None
        waiting = self.beneficiary.pop(job_id, None)
        if waiting is not None and waiting in self.ams:
            # GPUs came free for it: let it look (its plan may be elsewhere), before the victim asks again.
            self.dirty.pop(waiting, None)
            self.dirty.pop(job_id, None)
            self.dirty[waiting] = None
            self.dirty[job_id] = None

    def apply_stop_orders(self, now: float) -> None:
        """The RM's stop orders (preemption deadlines, kills, finished jobs): the processes stop at once."""
        for node_id in self.core.nodes_with_stops():
            for order in self.core.take_stops(node_id, now):
                c = self.core.live.get(order.container_id)
                if c is not None:
                    self.end_container(order.container_id, node_id,
                                       ContainerReport(order.container_id, "EXITED", signal=15, stopped=True), now)

    def report(self, node_id: str, reports: list[ContainerReport], now: float) -> None:
        self.core.node_heartbeat(node_id, node_id, reports, now)

    # ------------------------------------------------------------ the `placement` run-time model

    def start_timed(self, am: SimAM, config: RuntimeConfig, now: float) -> None:
        """An attempt starts under the `placement` model: its rate, its neighbours' (it now shares their links),
        and its FINISH event."""
        run = am.run
        assert run is not None
        run.productive_from = now + (config.restart_cost_s if am.restart_after else 0.0)
        run.accounted_at = now
        run.gpus = am.trace.gpus
        touched: dict[str, None] = {am.job_id: None}
        self.join_servers(am.job_id, run, touched)
        self.retime(touched, config, now)

    def join_servers(self, job_id: str, run: Run, touched: dict[str, None]) -> None:
        """Note the run's servers and racks; a run on several servers shares their links with the multi-server
        jobs already there, which go into `touched` (their rates change)."""
        nodes = tuple(sorted(set(run.containers.values())))
        run.racks = len({self.rack_of[n] for n in nodes})
        if len(nodes) > 1:
            run.nodes = nodes
            for n in nodes:
                jobs = self.on_server.setdefault(n, {})
                touched.update(jobs)
                jobs[job_id] = None

    def leave_servers(self, job_id: str, run: Run, touched: dict[str, None]) -> None:
        """The run stops sharing its servers' links: the jobs left there go into `touched`."""
        for n in run.nodes:
            jobs = self.on_server.get(n)
            if jobs is not None:
                jobs.pop(job_id, None)
                touched.update(jobs)
        run.nodes = ()

    def end_timed(self, am: SimAM, config: RuntimeConfig, report: ContainerReport, now: float) -> None:
        """An attempt's work stops: keep what it finished or checkpointed, count what was lost, and re-time the
        jobs that shared its servers."""
        run = am.run
        assert run is not None
        self.accrue(am, run, now)
        gpus = am.trace.gpus
        restart_s = min(now, run.productive_from) - run.start
        finished = (report.state == "EXITED" and report.exit_code == 0 and not report.stopped
                    and not report.infra_failure)
        if finished:
            am.progress_s = am.trace.duration_s
            wasted = restart_s
        else:
            productive = now - run.productive_from
            saved = checkpointed(productive, config.checkpoint_interval_s)
            am.progress_s = min(am.trace.duration_s, am.progress_s + work_at(run, run.productive_from + saved))
            wasted = restart_s + max(0.0, productive - saved)
        cause = am.restart_after               # the restart paid in this attempt was caused by the last interruption
        if not finished:
            am.restart_after = "failure" if report.infra_failure else "preemption"
        # Restart time is charged to what caused it; work lost since the checkpoint to what ended this attempt.
        lost_restart = max(0.0, restart_s) * gpus
        lost_work = (wasted - max(0.0, restart_s)) * gpus
        for what, gpu_s in ((cause, lost_restart), ("" if finished else am.restart_after, lost_work)):
            if what == "failure":
                am.lost_failure_gpu_s += gpu_s
            elif what == "preemption":
                am.lost_preemption_gpu_s += gpu_s
        touched: dict[str, None] = {}
        self.leave_servers(am.job_id, run, touched)
        self.retime(touched, config, now)

    def accrue(self, am: SimAM, run: Run, now: float) -> None:
        """Count the work done at the current rate up to now."""
        begin = max(run.accounted_at, run.productive_from)
        if now > begin:
            run.work += (now - begin) * run.rate
            am.run_s += now - begin
            am.slow_s += (now - begin) / run.rate
        run.accounted_at = max(run.accounted_at, now)

    def retime(self, job_ids: dict[str, None], config: RuntimeConfig, now: float) -> None:
        """Recompute the rate of these running jobs and move their FINISH events to match."""
        view = self.view()
        for job_id in job_ids:
            am = self.ams.get(job_id)
            run = am.run if am is not None else None
            if am is None or run is None or run.ended:
                continue
            gpus = am.trace.gpus if not am.trace.max_gpus else run.gpus
            servers = max(len(run.nodes), 1)
            neighbours = max((len(self.on_server[n]) - 1 for n in run.nodes), default=0)
            new_rate = rate(config, am.sensitivity, servers, view.fewest_servers(gpus), run.racks,
                            fewest_of(gpus, self._rack_sizes), neighbours)
            if am.trace.max_gpus:
                new_rate *= elastic_speedup(config, gpus, am.trace.gpus)
            if run.breaks and new_rate == run.rate:
                continue
            self.accrue(am, run, now)
            run.rate = new_rate
            run.breaks.append((now, run.work, new_rate))
            left = max(0.0, am.trace.duration_s - am.progress_s - run.work)
            run.finish_seq += 1
            self.push(max(now, run.productive_from) + left / new_rate, FINISH, (job_id, run.token, run.finish_seq))

    # ------------------------------------------------------------ preemption checks

    def schedule_check(self, now: float) -> None:
        """Wake for queue work exactly when it can come due (see RMCore.next_check), never on a blind timer."""
        at = self.core.next_check(now)
        if at is not None and (self._check_at is None or at < self._check_at):
            self._check_at = at
            self.push(at, CHECK, at)

    def check_preemption(self, now: float) -> bool:
        """The RM's time-driven queue work; False when none came due (nothing changed)."""
        core = self.core
        moved = False
        for d in core.preempt(now):
            moved = True
            for v in d.victims:
                self.dirty[v.job_id] = None
        for victim, beneficiary in core.preempt_in_queue(now):
            moved = True
            self.dirty[victim] = None
            self.beneficiary[victim] = beneficiary
        for job_id in core.nudged:
            if job_id in self.ams:
                moved = True
                self.dirty[job_id] = None
        for cid in core.revoke_hoarded(now):
            moved = True
            self.dirty[core.containers[cid].job_id] = None
        for cid in list(core.preempting):
            c = core.containers[cid]
            if cid in core.preempting and now >= c.preempt_deadline:
                moved = True
                self.end_container(c.container_id, c.node_id,
                                   ContainerReport(c.container_id, "EXITED", signal=9, stopped=True), now)
        return moved

    # ------------------------------------------------------------ the end of a job

    def finish(self, am: SimAM, now: float) -> None:
        m = am.master
        assert m.final is not None
        core = self.core
        core.finish_am(am.job_id, am.am_attempt, m.final.state, m.final.diagnostics, m.final.exit_code,
                       [_update(a) for a in m.take_reports(None)], now)
        self.apply_stop_orders(now)
        self.report(am.am_node, [ContainerReport(am.am_container, "EXITED", exit_code=0)], now)
        am.done = True
        self.set_idle(am, now, False)
        self.track_asks(am.job_id, ())
        self.results.append(self.result(am, now))
        del self.ams[am.job_id]

    def result(self, am: SimAM, now: float | None) -> JobResult:
        job = self.core.jobs[am.job_id]
        attempts = job.attempts
        last = attempts[-1] if attempts else None
        preemptions = sum(1 for a in attempts if a.failure.name == "PREEMPTED")
        retries = sum(1 for a in attempts if a.counts_as_failure) - (1 if job.state is JobState.FAILED else 0)
        view = self.view()
        return JobResult(
            job_id=am.trace.job_id, queue=am.trace.queue, gpus=am.trace.gpus, submit_s=am.trace.submit_s,
            start_s=None if am.first_start is None else am.first_start - ORIGIN,
            finish_s=None if now is None else now - ORIGIN, duration_s=am.trace.duration_s, attempts=len(attempts),
            preemptions=preemptions, retries=max(0, retries),
            servers=len(last.learners) if last is not None and last.learners else 0,
            fewest_servers=view.fewest_servers(am.trace.gpus), gpu_seconds_served=job.attained_gpu_s,
            state=job.state.name if now is not None else "UNFINISHED", sensitivity=am.sensitivity,
            run_s=am.run_s if self.runtime is not None else am.progress_s,
            slowdown=am.slow_s / am.run_s if self.runtime is not None and am.run_s > 0 else 1.0,
            lost_preemption_gpu_s=am.lost_preemption_gpu_s, lost_failure_gpu_s=am.lost_failure_gpu_s)

    def finish_unfinished(self) -> None:
        for am in list(self.ams.values()):
            if not am.done:
                self.results.append(self.result(am, None))
        for job_id, tj in self._pending_trace.items():
            self.results.append(JobResult(tj.job_id, tj.queue, tj.gpus, tj.submit_s, None, None, tj.duration_s, 0, 0,
                                          0, 0, 0, 0.0, "UNFINISHED"))
            del job_id

    # ------------------------------------------------------------ metrics

    def record_usage(self, now: float) -> None:
        book = self.core.queues
        self.timeline.mark_below(now - ORIGIN, book.waiting(book.shares(self.core.cluster.capacity)))
        used = book.used
        leaves = list(self.timeline.per_queue)
        snapshot = tuple(used.get(q, 0) for q in leaves)
        if snapshot == self._last_used:
            return
        self._last_used = snapshot
        self.timeline.times.append(now - ORIGIN)
        self.timeline.allocated.append(sum(snapshot))
        for q, v in zip(leaves, snapshot, strict=True):
            self.timeline.per_queue[q].append(v)


def work_at(run: Run, t: float) -> float:
    """The work an attempt had done at time t (not after the last accrual): rates are constant between breaks."""
    work = 0.0
    for at, done, r in run.breaks:
        if at > t:
            break
        work = done + max(0.0, t - max(at, run.productive_from)) * r
    return work


def _update(a: AttemptRecord) -> AttemptUpdate:
    return AttemptUpdate(a.number, a.state, a.learners, "", a.level, a.failure, a.cause, a.exit_code,
                         a.counts_as_failure, a.start_time, a.end_time)


def _ended(c: Container) -> Ended:
    kind = c.exit.kind
    return Ended(c.container_id, exit_code=c.exit.exit_code, signal=c.exit.signal,
                 stopped=kind in (ExitKind.STOPPED, ExitKind.RELEASED),
                 failed_to_start=kind is ExitKind.FAILED_TO_START, lost=kind in (ExitKind.LOST, ExitKind.EXPIRED),
                 infra=c.exit.infra, diagnostics=c.exit.diagnostics)


__all__ = ["ContainerKind", "Engine", "SimOptions", "SimResult"]
