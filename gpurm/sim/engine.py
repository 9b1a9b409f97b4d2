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

This module is the entry point: `Engine` builds the RM core and the parts below, runs the event loop, submits
arriving jobs, settles, and runs the RM's time-driven queue work. The parts, each over the same job table
(`Engine.ams`), the same set of AMs to drive next (`Engine.dirty`) and the same event queue:
- clock.py: the event queue, the event kinds, where virtual time starts;
- options.py: `SimOptions`, `RelaxPolicy`, `SimResult` (re-exported here);
- simam.py: what is kept per job (`SimAM`) and per running attempt (`Run`);
- clusterview.py: the cluster view every AM plans on;
- amshell.py: the AM shells: starting, driving and ending each job's `Master`;
- waking.py: which AMs are driven: the scheduling pass's, idle AMs woken by GPUs coming free, AM timers;
- agents.py: the agents: learners starting, ending, stopped, reported;
- progress.py: how far each attempt's work has got, under the `ideal` or `placement` run-time model;
- failures.py: injected infrastructure failures;
- recorder.py: the allocation timeline and every job's result.
What stands alone outside the engine: the run-time model (runtime.py), the traces (trace.py), the metrics
(metrics.py), the cluster shapes (clusterspec.py).
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import logging
import time
from collections.abc import Callable
from typing import cast

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec, Locality, LocalityMode
from gpurm.common.model import ContainerKind
from gpurm.queues.tree import QueueTree
from gpurm.rm.sched import priority
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ContainerReport, NodeRegistration, RequestError, RMSettings
from gpurm.sim.agents import Agents
from gpurm.sim.amshell import AMShells
from gpurm.sim.clock import ARRIVE, CHECK, FAIL, FINISH, ORIGIN, TIMER, EventQueue
from gpurm.sim.clusterspec import SimServer
from gpurm.sim.clusterview import SharedView
from gpurm.sim.failures import FailureInjector
from gpurm.sim.options import RelaxPolicy, SimOptions, SimResult
from gpurm.sim.progress import RunProgress
from gpurm.sim.recorder import Recorder
from gpurm.sim.simam import SimAM
from gpurm.sim.trace import Trace, TraceJob
from gpurm.sim.waking import Waker

log = logging.getLogger(__name__)

SETTLE_LIMIT = 10000           # rounds of driving AMs after one event (a bug guard: real settles take a few)


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
            inqueue_min_run_s=options.inqueue_min_run_s, las_thresholds_gpu_s=options.las_thresholds_gpu_s,
            reservations=options.reservations,
            reserve_after_s=options.reserve_after_s, reserve_behind=options.reserve_behind,
            history_conditioning=options.history_by,
            history_prior=options.history_prior)
        if options.borrowing is not None and options.borrowing is not tree.borrowing:
            tree = dataclasses.replace(tree, borrowing=options.borrowing)   # `--borrowing`: the config's own else
        self.core = RMCore(settings, tree)
        self.core.scheduler.policy_override = policy
        for server in servers:
            self.core.register_node(NodeRegistration(server.node_id, "sim", 1, server.rack, server.rack,
                                                     [GpuRecord(i) for i in range(server.gpus)]), server.node_id, 0.0)
        self.core.take_outbox()
        self.capacity = sum(s.gpus for s in servers)
        self.servers = servers
        self.runtime = options.runtime
        # The state the parts share: they hold these very objects, so none of them is ever replaced.
        self.queue = EventQueue()
        self.ams: dict[str, SimAM] = {}
        self.by_trace: dict[str, str] = {}
        self.pending: dict[str, TraceJob] = {}       # submitted, AM not started yet
        self.dirty: dict[str, None] = {}             # the AMs to drive in the next round of settling
        self.beneficiary: dict[str, str] = {}        # in-queue preemption victim -> the job it makes room for
        self.views = SharedView(self.core)
        self.recorder = Recorder(self.core, self.views, self.runtime is not None, [q.path for q in tree.leaves])
        self.progress = RunProgress(servers, self.core, self.ams, self.queue, self.views)
        failures = FailureInjector(options.failures_per_1000_gpu_h, options.seed, self.runtime is not None,
                                   self.queue)
        self.agents = Agents(self.core, self.ams, self.dirty, self.beneficiary, self.queue, self.progress, failures,
                             self.runtime)
        self.waker = Waker(self.core, self.ams, self.dirty, self.queue, self.views)
        self.shells = AMShells(self.core, self.ams, self.dirty, self.pending, options, self.views, self.agents,
                               self.waker, self.recorder)
        self._check_at: float | None = None
        # Called after the settle of each instant at which jobs arrived, with the RM's ids of those that were
        # submitted (`gpurm sim --forecast`: sim/forecasting.py forecasts their starts from there).
        self.after_arrivals: Callable[[float, list[str]], None] | None = None
        self.arrived: list[str] = []
        self.n_events = 0
        self.n_settles = 0

    # ------------------------------------------------------------ the event loop

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
            self.queue.push(job.submit_s + ORIGIN, ARRIVE, job)
        results = self.recorder.results
        done_before = 0
        last_report = t0
        events = self.queue.heap
        while events:
            now, kind, _, payload = heapq.heappop(events)
            self.n_events += 1
            moved = self.handle(now, kind, payload)
            # Take every event of the same instant before settling: fewer, fuller passes.
            while events and events[0][0] == now:
                _, kind, _, payload = heapq.heappop(events)
                self.n_events += 1
                moved = self.handle(now, kind, payload) or moved
            if moved:
                self.settle(now)
            if self.arrived:
                if self.after_arrivals is not None:
                    self.after_arrivals(now, self.arrived)
                self.arrived = []
            if progress is not None and time.perf_counter() - last_report > 0.5:
                last_report = time.perf_counter()
                if len(results) != done_before:
                    done_before = len(results)
                progress(now - ORIGIN, len(results), len(self.trace.jobs))
        self.recorder.unfinished(self.ams, self.pending)
        timeline = self.recorder.timeline
        timeline.close_below(timeline.times[-1] if timeline.times else 0.0)
        wall = time.perf_counter() - t0
        return SimResult(results, timeline, self.capacity, wall, self.n_events, self.n_settles,
                         sum(r.preemptions for r in results), borrowing=self.core.queues.tree.borrowing.value,
                         borrow_preemptions=self.core.borrow.preemptions,
                         extra={"reservations": {"made": self.core.reservations.made,
                                                 "expired": self.core.reservations.expired,
                                                 "idle_gpu_h": self.core.reservations.idle_gpu_s / 3600}})

    def handle(self, now: float, kind: int, payload: object) -> bool:
        """Apply one event; False when it turned out to change nothing (a stale timer), so no settle is due."""
        if kind == ARRIVE:
            assert isinstance(payload, TraceJob)
            self.arrive(payload, now)
        elif kind == FINISH:
            job_id, token, seq = cast(tuple[str, int, int], payload)
            self.agents.learners_done(job_id, token, seq, now)
        elif kind == FAIL:
            job_id, token, node = cast(tuple[str, int, str], payload)
            self.agents.learner_failed(job_id, token, node, now)
        elif kind == TIMER:
            job_id, at = cast(tuple[str, float], payload)
            am = self.ams.get(job_id)
            if am is None or am.done or am.wake_at != at:
                return False
            am.wake_at = None
            self.waker.sync_dormant(am)
            if am.master.idle and self.views.current().total_free < am.trace.gpus:
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

    # ------------------------------------------------------------ jobs arriving

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
            self.recorder.rejected_at_submit(tj)
            return
        job.expected_gpu_s = tj.duration_s * tj.gpus
        self.by_trace[job.job_id] = tj.job_id
        self.pending[job.job_id] = tj
        if self.after_arrivals is not None:
            self.arrived.append(job.job_id)

    def job_locality(self, tj: TraceJob) -> Locality:
        """The run's locality settings, with the trace job's own (jsonl `locality`) in their place."""
        if tj.locality is None:
            return self.locality
        own = tj.locality.over(self.options.locality)
        return own if self.forced_mode is None else dataclasses.replace(own, mode=self.forced_mode)

    # ------------------------------------------------------------ settling

    def settle(self, now: float) -> None:
        self.n_settles += 1
        shells, waker, dirty = self.shells, self.waker, self.dirty
        shells.start_ams(now)
        for _ in range(SETTLE_LIMIT):
            waker.wake_growers()
            waker.wake_planners(now)
            waker.run_pass(now)
            if not dirty:
                break
            # Emptied in place, not replaced: the parts hold this very dict.
            batch = list(dirty)
            dirty.clear()
            for job_id in batch:
                am = self.ams.get(job_id)
                if am is not None and not am.done:
                    shells.drive(am, now)
            self.agents.apply_stop_orders(now)
            shells.start_ams(now)
        else:
            raise RuntimeError(f"the simulation did not settle at t={now}: {len(dirty)} AMs still moving: "
                               + "; ".join(self.describe(job_id) for job_id in list(dirty)[:4]))
        self.recorder.record_usage(now)
        self.schedule_check(now)

    def describe(self, job_id: str) -> str:
        """One AM as a settling failure reports it."""
        am = self.ams.get(job_id)
        job = self.core.jobs.get(job_id)
        if am is None or job is None:
            return f"{job_id} (gone)"
        m = am.master
        return (f"{job_id} ({job.spec.gpus} GPUs, {job.state.name}, AM {m.phase.name} at {m.level.label}, holds "
                f"{m.held_gpus}, asks {m.asks()}, told to plan: {job_id in self.core.nudged}, reserved: "
                f"{self.core.reservations.by_job.get(job_id)})")

    # ------------------------------------------------------------ the RM's time-driven queue work

    def schedule_check(self, now: float) -> None:
        """Wake for queue work exactly when it can come due (see RMCore.next_check), never on a blind timer."""
        at = self.core.next_check(now)
        if at is not None and (self._check_at is None or at < self._check_at):
            self._check_at = at
            self.queue.push(at, CHECK, at)

    def check_preemption(self, now: float) -> bool:
        """The RM's time-driven queue work; False when none came due (nothing changed)."""
        core = self.core
        moved = False
        for d in core.preempt(now):
            moved = True
            for v in d.victims:
                self.dirty[v.job_id] = None
        for victim, beneficiary in [*core.preempt_in_queue(now), *core.preempt_borrowers(now)]:
            moved = True
            self.dirty[victim] = None
            self.beneficiary[victim] = beneficiary
        if core.reservations.by_job and core.backfill(now):
            moved = True                          # a reservation came ready (its holder is nudged)
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
                self.agents.end_container(c.container_id, c.node_id,
                                          ContainerReport(c.container_id, "EXITED", signal=9, stopped=True), now)
        return moved


__all__ = ["ContainerKind", "Engine", "RelaxPolicy", "SimOptions", "SimResult"]
