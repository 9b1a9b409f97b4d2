"""Reservations: no job size starves (Slurm's backfill reservations, YARN's node reservations). Pure: `now` in.

A job that is first in the scheduling order but cannot be placed at its locality level (an 8-GPU job waiting for
a whole server while a stream of one-GPU jobs takes every GPU that comes free) gets a reservation: the servers
where, by the run-time estimates (rm/sched/history.py), enough GPUs will be free soonest, chosen by the AM's own
planner (am/placement.py) on the cluster as it is expected to be at that time; for a job one server holds, the
server whose drain costs least (`_least_idle`: the GPU-seconds held idle until it starts, plus its own wait). From
then on the GPUs that are free on those servers, up to what the job needs there, are held for it:

- nobody else is granted them (rm/sched/scheduler.py asks `allows`), except a job expected to end before the
  reservation's estimated start (`start`): backfill, which cannot delay the reserved job by the estimates;
- the published cluster view shows them as reserved (am/placement.py `ServerView.reserved`), so other AMs do
  not plan on them, and the holder's AM (and a backfill candidate's) adds them back (`View.for_job`);
- once every part is free the reservation is ready: the holder's AM is told to plan now.

A reservation ends when its job is granted its gang, stops waiting (killed, finished, relaxed to another level),
or has not taken it within `READY_HOLD_S` of it being ready. One server is reserved for one job at a time.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpurm.am.placement import Plan, ServerView, View, plan
from gpurm.common.jobspec import LocalityLevel
from gpurm.rm.state.cluster import Cluster, Node

READY_HOLD_S = 120.0          # a ready reservation not taken this long after is given up (its AM is gone or stuck)
RESTART_S = 30.0              # a start estimate already past is moved on by at least this much

# (node, now) -> [(expected end, GPU indices)] of the containers running there (the core's estimates)
EndsFn = Callable[[str, float], list[tuple[float, tuple[int, ...]]]]


@dataclass
class Reservation:
    job_id: str
    gpus: int
    level: LocalityLevel
    parts: dict[str, int]            # server -> GPUs the job needs there
    start: float                     # when every part is expected to be free (the backfill bound)
    made: float
    ready_since: float | None = None
    _node_versions: dict[str, int] = field(default_factory=dict)


class Reservations:
    def __init__(self, cluster: Cluster, ends: EndsFn, limit: int = 1, by_idle: bool = True) -> None:
        self.cluster = cluster
        self.by_idle = by_idle           # a one-server job's server: the least idle GPU-time, not the soonest free
        self.ends = ends
        self.limit = limit               # reservations at once (rm.yaml `scheduler.reservations`; 0: none)
        self.by_job: dict[str, Reservation] = {}
        self.on_node: dict[str, str] = {}      # server -> the job it is reserved for
        self.made = 0                    # reservations made since start (a metric)
        self.idle_gpu_s = 0.0            # GPU-seconds held idle for reservations (a metric: what they cost)
        self.expired = 0                 # ready reservations their job did not take in time (a metric)
        self._idle_at: float | None = None
        self._held_now = 0
        self.version = 0                 # moves whenever the reserved GPUs may have changed (the view shows them)

    # ------------------------------------------------------------ questions

    def held_on(self, node_id: str) -> tuple[str, int]:
        """(the job a server is reserved for, the GPUs held for it there now); ("", 0) if none."""
        job_id = self.on_node.get(node_id)
        if job_id is None:
            return "", 0
        need = self.by_job[job_id].parts.get(node_id, 0)
        return job_id, min(need, self.cluster.free(node_id))

    def allows(self, job_id: str, node_id: str, gpus: int, expected_end: float) -> bool:
        """Whether `job_id` may be granted `gpus` GPUs on `node_id`: the server is not reserved, or reserved for
        it, or enough is free beyond the reservation's need, or the job is expected to end before the reserved
        job needs the GPUs (backfill)."""
        holder = self.on_node.get(node_id)
        if holder is None or holder == job_id:
            return True
        r = self.by_job[holder]
        if self.cluster.free(node_id) - gpus >= r.parts.get(node_id, 0):
            return True
        return expected_end <= r.start

    def blocking(self, node_id: str) -> Reservation | None:
        holder = self.on_node.get(node_id)
        return self.by_job[holder] if holder is not None else None

    # ------------------------------------------------------------ making and ending

    def reserve(self, job_id: str, gpus: int, level: LocalityLevel, now: float) -> Reservation | None:
        """Reserve for a job that cannot be placed now: the servers its level allows where enough GPUs are
        expected to be free soonest (servers reserved for other jobs excluded). None when the limit is reached
        or no placement is expected at all (e.g. every suitable server is reserved)."""
        if len(self.by_job) >= self.limit or job_id in self.by_job:
            return None
        found = self._soonest(gpus, level, now)
        if found is None:
            return None
        start, parts = found
        r = Reservation(job_id, gpus, level, parts, start, now)
        self.by_job[job_id] = r
        for node_id in parts:
            self.on_node[node_id] = job_id
        self.made += 1
        self._changed(r)
        return r

    def release(self, job_id: str) -> bool:
        r = self.by_job.pop(job_id, None)
        if r is None:
            return False
        for node_id in r.parts:
            if self.on_node.get(node_id) == job_id:
                del self.on_node[node_id]
        self._changed(r)
        return True

    def _changed(self, r: Reservation) -> None:
        """What the views show of the reservation's servers changed."""
        self.version += 1
        for node_id in r.parts:
            self.cluster.touch(node_id)

    def ready(self, now: float) -> list[str]:
        """Jobs whose reserved GPUs are all free now (their AMs should plan); drops those not taken in time and
        those whose servers left the cluster. A start estimate that has passed is estimated again."""
        self._count_idle(now)
        out = []
        for job_id, r in list(self.by_job.items()):
            nodes = [self.cluster.nodes.get(n) for n in r.parts]
            if any(n is None or not n.offering for n in nodes):
                self.release(job_id)
                continue
            if all(self.cluster.free(n) >= need for n, need in r.parts.items()):
                if r.ready_since is None:
                    r.ready_since = now
                    if r.start > now:
                        r.start = now
                        self._changed(r)
                elif now - r.ready_since > READY_HOLD_S:
                    self.expired += 1
                    self.release(job_id)
                    continue
                out.append(job_id)
            elif r.start <= now:
                r.start = max(now + RESTART_S, self._part_start(r, now))
                self._changed(r)
        return out

    def _count_idle(self, now: float) -> None:
        """Add the GPU-seconds held idle since the last call (the GPUs held then, held since: a step function
        sampled whenever the core asks `ready`, which it does after every change while reservations are held)."""
        if self._idle_at is not None and now > self._idle_at:
            self.idle_gpu_s += self._held_now * (now - self._idle_at)
        self._idle_at = now
        self._held_now = sum(min(need, self.cluster.free(n)) for r in self.by_job.values()
                             for n, need in r.parts.items() if n in self.cluster.nodes)

    def _part_start(self, r: Reservation, now: float) -> float:
        """When the reservation's servers are expected to have its GPUs free, estimated anew."""
        latest = now
        for node_id, need in r.parts.items():
            free = self.cluster.free(node_id)
            if free >= need:
                continue
            for end, indices in sorted(self.ends(node_id, now)):
                free += len(indices)
                if free >= need:
                    latest = max(latest, end)
                    break
        return latest

    def _soonest(self, gpus: int, level: LocalityLevel, now: float) -> tuple[float, dict[str, int]] | None:
        """The earliest expected time a plan at `level` exists on servers reserved for nobody, and that plan."""
        nodes = [n for n in self.cluster.nodes.values() if n.offering and n.node_id not in self.on_node]
        if not nodes:
            return None
        ends: dict[str, list[tuple[float, tuple[int, ...]]]] = {n.node_id: sorted(self.ends(n.node_id, now))
                                                                for n in nodes}
        times = sorted({t for e in ends.values() for t, _ in e} | {now})
        # Binary search: the plan exists at time t or not, and more GPUs come free as t grows.
        lo, hi = 0, len(times) - 1
        if _plan_at(nodes, ends, times[hi], gpus, level) is None:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if _plan_at(nodes, ends, times[mid], gpus, level) is None:
                lo = mid + 1
            else:
                hi = mid
        found = _plan_at(nodes, ends, times[lo], gpus, level)
        assert found is not None
        start = max(times[lo], now)
        if len(found.parts) == 1 and self.by_idle:
            return _least_idle(nodes, ends, gpus, level, now, start, found.parts[0].node_id)
        return start, {p.node_id: p.gpus for p in found.parts}


def _least_idle(nodes: Iterable[Node], ends: dict[str, list[tuple[float, tuple[int, ...]]]], gpus: int,
                level: LocalityLevel, now: float, soonest: float, soonest_node: str) -> tuple[float, dict[str, int]]:
    """Of the servers that could hold a one-server job, the one whose reservation costs least: the GPU-seconds its
    held GPUs would idle while it drains (each freed GPU, up to the job's need, from its end to the start) plus
    the job's own GPUs over its wait. The server that frees soonest may free all but one GPU early and idle
    them for hours behind its last job; another that frees a little later, all at once, costs far less."""
    best_cost, best = float("inf"), (soonest, soonest_node)
    for n in nodes:
        if n.healthy_gpus < gpus:
            continue
        e = ends[n.node_id]
        free = len(n.free_indices())
        idle, last, t = 0.0, now, now
        k = 0
        while True:
            if free >= gpus and plan(gpus, View([_server_at(n, e, t)]), level) is not None:
                break
            if k >= len(e):
                t = float("inf")
                break
            end, indices = e[k]
            k += 1
            end = max(end, now)
            idle += min(free, gpus) * (end - last)
            last, t = end, end
            free += len(indices)
        if t == float("inf"):
            continue
        cost = idle + gpus * (t - now)
        if cost < best_cost or (cost == best_cost and t < best[0]):
            best_cost, best = cost, (t, n.node_id)
    return max(best[0], now), {best[1]: gpus}


def _plan_at(nodes: Iterable[Node], ends: dict[str, list[tuple[float, tuple[int, ...]]]], t: float, gpus: int,
             level: LocalityLevel) -> Plan | None:
    return plan(gpus, View(_server_at(n, ends[n.node_id], t) for n in nodes), level)


def _server_at(node: Node, ends: list[tuple[float, tuple[int, ...]]], t: float) -> ServerView:
    """The server as it is expected to be at time `t`: its free GPUs now and those of containers ending by then."""
    free = set(node.free_indices())
    k = bisect.bisect_right(ends, (t, (1 << 30,)))
    for _, indices in ends[:k]:
        free.update(i for i in indices if i in node.gpus and node.gpus[i].healthy)
    return ServerView(node.node_id, node.rack, node.healthy_gpus, tuple(sorted(free)),
                      tuple(tuple(i) for i in node.islands), node.ib_domain)
