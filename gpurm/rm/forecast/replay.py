"""The forecaster: a `Snapshot` in, a `Forecast` (earliest, likely, latest start) per queued job out. Pure: no
clock, no I/O; the same snapshot and settings give the same forecasts.

How. The snapshot is replayed through the simulator's engine (`sim/engine.py`: the real `RMCore`, scheduler,
preemption and one real AM `Master` per job) on a virtual clock that starts at the snapshot's `now`:
1. its servers register, empty;
2. its running jobs arrive first, each with the GPU-time it attained, and are placed on the servers they run on:
   all servers but theirs drained while they arrive and settle (server by server, then the multi-server jobs set by
   set; a job the planner still places elsewhere, or not at once, keeps what it got). Placed anew, they would be
   packed tighter than they run, and big waiting jobs would find room that the real cluster does not have;
3. its queued jobs arrive a millisecond later, in submission order, with what they attained before (a preempted
   job);
4. the replay runs until every queued job asked about has started, or `horizon_s` of replayed time, or
   `max_events` events.
A job's run time in the replay is what its history group says is left of it (`History.remaining_s`: a running job
has run `ran_s`, so only run times beyond that count). Three replays make the range: every job at the group's
`low_quantile` of what is left gives `earliest`, the mean gives `likely`, the `high_quantile` gives `latest`.
Nothing is known of jobs not yet submitted: a job submitted later that ranks first (another queue below its share,
a shorter job under las / gittins) delays the forecast job, which the range's width has to cover (`widen`: the
latest start is pushed out to `likely + widen x (likely - now)` at least; docs/sim.md gives the coverage measured).

The replay runs the `ideal` run-time model (full speed anywhere, instant checkpoints): the run times already come
from what jobs ran for real.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpurm.common.jobspec import LocalityLevel, LocalityMode, Placement
from gpurm.common.model import Job
from gpurm.queues.tree import Policy
from gpurm.rm.forecast.records import Forecast, ForecastSettings
from gpurm.rm.forecast.snapshot import SnapJob, Snapshot, fill_history, tree_from_plain
from gpurm.rm.sched.history import Features, History
from gpurm.sim.clock import ORIGIN
from gpurm.sim.clusterspec import SimServer
from gpurm.sim.engine import Engine
from gpurm.sim.options import SimOptions
from gpurm.sim.trace import Trace, TraceJob, TraceLocality

QUEUED_AFTER_S = 1e-3        # queued jobs arrive this long after the running ones (a settle between)
CHECK_EVERY = 16             # instants between looks at which forecast jobs have started


@dataclass(frozen=True)
class ReplayStats:
    """What the replays cost: events replayed and whether one stopped at a cap."""

    events: int
    capped: bool


def estimates(snap: Snapshot, history: History, quantile: float | None) -> dict[str, float]:
    """Each job's remaining run time (seconds) at `quantile` of its history group (None: the mean)."""
    out: dict[str, float] = {}
    for j in snap.jobs:
        f = Features(j.queue, j.user, j.name, j.gpu_amount)
        out[j.job_id] = max(1.0, history.remaining_s(f, j.ran_s, quantile))
    return out


def _trace_job(j: SnapJob, duration_s: float) -> TraceJob:
    locality = None
    if j.locality:
        timeout, base, cap, level, mode = j.locality
        locality = TraceLocality(LocalityMode(mode), LocalityLevel(level), timeout, base, cap)
    return TraceJob(j.job_id, 0.0, j.gpus, duration_s, j.queue, user=j.user, name=j.name, locality=locality,
                    placement=Placement(j.placement), gpu_share_milli=j.share_milli)


def replay_starts(snap: Snapshot, durations: dict[str, float], targets: Iterable[str],
                  settings: ForecastSettings) -> tuple[dict[str, float | None], ReplayStats]:
    """One replay: each target's start (seconds after the snapshot), None when not within the horizon."""
    s = snap.settings
    options = SimOptions(policy=Policy(s.policy_override) if s.policy_override else None, seed=0,
                         inqueue_min_run_s=s.inqueue_min_run_s,
                         las_thresholds_gpu_s=s.las_thresholds_gpu_s or SimOptions().las_thresholds_gpu_s,
                         reservations=s.reservations, reserve_after_s=s.reserve_after_s,
                         reserve_behind=s.reserve_behind, history_by=s.history_by)
    servers = [SimServer(n.node_id, n.rack, n.gpus) for n in snap.nodes]
    engine = Engine(Trace([], None, "forecast"), servers, tree_from_plain(snap.tree), options)
    fill_history(engine.core.history, snap.history)
    engine.core.behind.mean_s, engine.core.behind.seen = s.behind_mean_s, s.behind_seen
    core = engine.core
    ids: dict[str, str] = {}                 # snapshot job id -> the replay's job id

    def arrive(jobs: list[SnapJob], now: float) -> None:
        for j in jobs:
            before = len(engine.by_trace)
            engine.arrive(_trace_job(j, durations[j.job_id]), now)
            if len(engine.by_trace) == before:
                continue                      # refused (the queue config changed under it): never starts
            cid = next(reversed(engine.by_trace))
            ids[j.job_id] = cid
            replayed: Job = core.jobs[cid]
            replayed.attained_gpu_s = j.attained_gpu_s
            replayed.las_base_gpu_s = 0.0

    by_seq = sorted(snap.jobs, key=lambda j: j.seq)
    wanted = set(targets)
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        now = ORIGIN
        _place_running(engine, [j for j in by_seq if j.running], arrive, now)
        now = ORIGIN + QUEUED_AFTER_S
        arrive([j for j in by_seq if not j.running], now)
        engine.settle(now)
        left = {ids[t]: t for t in wanted if t in ids}
        starts: dict[str, float | None] = {t: None for t in wanted}
        events = engine.queue.heap
        end = ORIGIN + settings.horizon_s
        n_events = 0
        instants = 0
        capped = False
        while left:
            if instants % CHECK_EVERY == 0:
                _collect(engine, left, starts)
                if not left:
                    break
            if not events or events[0][0] > end:
                break
            if n_events >= settings.max_events:
                capped = True
                break
            now, kind, _, payload = heapq.heappop(events)
            n_events += 1
            moved = engine.handle(now, kind, payload)
            while events and events[0][0] == now:
                _, kind, _, payload = heapq.heappop(events)
                n_events += 1
                moved = engine.handle(now, kind, payload) or moved
            if moved:
                engine.settle(now)
            instants += 1
        _collect(engine, left, starts)
    finally:
        if gc_was_on:
            gc.enable()
    return starts, ReplayStats(n_events, capped)


def _place_running(engine: Engine, running: list[SnapJob], arrive: Callable[[list[SnapJob], float], None],
                   now: float) -> None:
    """The running jobs back on their servers: every server drained, then each group of jobs with the same servers
    arrives and settles with only those servers open; then every server open again."""
    core = engine.core
    nodes = list(core.cluster.nodes)
    groups: dict[tuple[str, ...], list[SnapJob]] = {}
    for j in running:
        groups.setdefault(tuple(s for s in j.servers if s in core.cluster.nodes), []).append(j)
    pinned = [(servers, jobs) for servers, jobs in groups.items() if servers]
    if pinned:
        for node in nodes:
            core.drain(node, False, now)
        for servers, jobs in sorted(pinned, key=lambda g: (len(g[0]), g[0])):
            for node in servers:
                core.drain(node, True, now)
            arrive(jobs, now)
            engine.settle(now)
            for node in servers:
                core.drain(node, False, now)
        for node in nodes:
            core.drain(node, True, now)
    arrive(groups.get((), []), now)            # no servers known (a snapshot of older records): placed anew
    engine.settle(now)


def _collect(engine: Engine, left: dict[str, str], starts: dict[str, float | None]) -> None:
    """Move the jobs that have started from `left` into `starts` (seconds after the snapshot)."""
    jobs = engine.core.jobs
    for cid in list(left):
        job = jobs.get(cid)
        start = job.start_time if job is not None else 0.0
        if not start:
            am = engine.ams.get(cid)
            start = am.first_start if am is not None and am.first_start is not None else 0.0
        if start:
            offset = start - ORIGIN           # seconds after the snapshot; at the queued jobs' arrival: now
            starts[left.pop(cid)] = offset if offset > QUEUED_AFTER_S else 0.0


def forecast(snap: Snapshot, settings: ForecastSettings, targets: Iterable[str] | None = None
             ) -> tuple[dict[str, Forecast], ReplayStats]:
    """Forecasts for `targets` (default: every queued job of the snapshot), times on the snapshot's clock."""
    queued = [j.job_id for j in snap.jobs if not j.running]
    wanted = queued if targets is None else [t for t in targets if t in set(queued)]
    if not wanted:
        return {}, ReplayStats(0, False)
    history = History(snap.settings.history_by)
    fill_history(history, snap.history)
    runs: list[dict[str, float | None]] = []
    events = 0
    capped = False
    for quantile in (settings.low_quantile, None, settings.high_quantile):
        starts, stats = replay_starts(snap, estimates(snap, history, quantile), wanted, settings)
        runs.append(starts)
        events += stats.events
        capped = capped or stats.capped
    low, mid, high = runs
    now = snap.now
    out: dict[str, Forecast] = {}
    for job_id in wanted:
        got = [x for x in (low[job_id], mid[job_id], high[job_id]) if x is not None]
        likely = mid[job_id]
        earliest = min(got) if got else None
        latest = None if high[job_id] is None or likely is None else max(got)
        if latest is not None and likely is not None:
            latest = max(latest, likely * (1.0 + settings.widen))
        if likely is None and got:
            likely = max(got)          # the mean replay ran past the horizon but another did not
        out[job_id] = Forecast(job_id, now, _at(now, earliest), _at(now, likely), _at(now, latest))
    return out, ReplayStats(events, capped)


def _at(now: float, offset: float | None) -> float | None:
    return None if offset is None or math.isinf(offset) else now + offset
