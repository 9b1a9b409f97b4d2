"""Job priority inside a leaf queue, and preemption inside a queue for the preemptive policies. Pure.

- `fifo`: submit order.
- `las`: Tiresias' discretized two-dimensional LAS. A job's attained service is GPUs x seconds run (both
  dimensions, hence 2D). Service is discretized into priority levels by `LAS_THRESHOLDS_GPU_S`: a job starts at
  level 0 and drops a level each time its attained service crosses the next threshold; inside a level, the least
  attained service first (then submit order), and no preemption (jobs of similar service are not preempted over
  small differences: the order inside a level decides who gets GPUs that come free). Tiresias orders a level by
  submission; least served first is the LAS order the levels only discretize (docs/sim.md "Beside Tiresias'
  simulator" has what it changed). Starvation
  guard: a job that has waited, since it last ran, more than `LAS_STARVE_FACTOR` times as long as it has run
  (since its last promotion) is promoted to level 0. As in Tiresias, the promotion sticks: when the promoted
  job starts, its service counts afresh from there (`las_promoted`), so it keeps level 0 until it has attained
  the first threshold again. (Were it to fall back to its old level as soon as it ran, the jobs it displaced would take
  their GPUs back after `min_run_s`, and so on: a carousel of preemptions that serves nobody.)
- `gittins`: Tiresias' discretized 2D-Gittins: the `las` levels (the same thresholds, starvation guard and
  sticky promotion), and inside a level the higher 2D-Gittins index (rm/sched/gittins.py: attained GPU-seconds,
  bucketed, weighed against the sizes of the jobs this RM saw finish) first instead of submit order; in-queue preemption
  weighs the level alone, as under `las` (`preempt_rank`). `las` itself until enough jobs finished.
- `srtf`: shortest remaining GPU-time first, from the trace's durations (the simulator's oracle baseline; an RM
  has no durations and treats every job alike, i.e. fifo).

In-queue preemption (`las`, `gittins` and `srtf`, Tiresias-style): a waiting job that outranks running jobs
of its own queue takes their GPUs when the idle ones do not suffice: only jobs at a worse level (las, gittins) or with
more left (srtf), only jobs that ran at least `min_run_s` (no flapping), and only where that makes room for it
on the fewest servers it could fit on, in one domain (GPUs freed here and there would go back to the jobs that
just lost them while its AM waits for a compact placement); among such rooms, the one that preempts the fewest
GPUs, lowest-ranked jobs first.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from gpurm.queues.tree import Policy
from gpurm.rm.sched.history import Features, History

# 1, 10 and 100 GPU-hours: levels 0..3 (the default of rm.yaml `preemption.las_thresholds`)
LAS_THRESHOLDS_GPU_S: tuple[float, ...] = (3600.0, 36000.0, 360000.0)
LAS_STARVE_FACTOR = 8.0
NO_FEATURES = Features()     # a job nothing is known of: ranked by the whole cluster's history


@dataclass
class Standing:
    """What ranking a job needs to know."""

    job_id: str
    seq: int
    gpus: int
    attained_gpu_s: float = 0.0   # GPU-seconds served (las: since its last promotion)
    executed_s: float = 0.0       # wall time it has run (las: since its last promotion)
    waiting_since: float = 0.0    # when it last stopped running (or was submitted)
    remaining_gpu_s: float = 0.0  # srtf only: from the trace
    running_since: float = -1.0   # when its current run started, -1 if it holds no GPUs
    features: Features | None = None   # what its history group is decided by (gittins; None: the cluster's)


def las_level(attained_gpu_s: float, thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S) -> int:
    return bisect.bisect_right(thresholds, attained_gpu_s)


def las_thresholds_problem(thresholds: Sequence[float]) -> str:
    """Why these can not be las thresholds (GPU-seconds: at least one, above 0, rising); empty when they can."""
    if not thresholds:
        return "must name at least one GPU-time, such as 1h,10h,100h"
    if thresholds[0] <= 0 or any(b <= a for a, b in itertools.pairwise(thresholds)):
        return "must be above 0 and rising"
    return ""


STARVED = (0.0, 0.0)       # how a starved job ranks (level 0, as if it had attained nothing; then submit order)


def las_starve_at(waiting_since: float, executed_s: float) -> float:
    """When the starvation guard promotes a waiting job: once it has waited `LAS_STARVE_FACTOR` times as long as
    it has run."""
    return waiting_since + LAS_STARVE_FACTOR * max(executed_s, 1.0)


def las_starved(now: float, waiting_since: float, executed_s: float) -> bool:
    return now > las_starve_at(waiting_since, executed_s)


def las_promoted(now: float, waiting_since: float, served_gpu_s: float, gpus: int,
                 thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S) -> bool:
    """Whether a job starting now starts by the starvation guard (rather than on its level), so that its service
    should count afresh from here. A job still at level 0 has nothing to be promoted from."""
    return las_level(served_gpu_s, thresholds) > 0 and las_starved(now, waiting_since, served_gpu_s / max(gpus, 1))


def rank(policy: Policy, now: float, thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S,
         gittins: History | None = None) -> Callable[[Standing], tuple[float, float, int]]:
    """Sort key: lower ranks first. The last item (submit order) only breaks ties: it orders, never preempts."""
    if policy is Policy.GITTINS and gittins is not None and gittins.ready:
        table = gittins

        def git(s: Standing) -> tuple[float, float, int]:
            if s.running_since < 0 and las_starved(now, s.waiting_since, s.executed_s):
                # Level 0 as under las, and first inside it: behind every fresh job's index it would starve on.
                return (STARVED[0], -math.inf, s.seq)
            # The las level first (the discretized queues, as in Tiresias), then the higher index first inside it.
            return (float(las_level(s.attained_gpu_s, thresholds)),
                    -table.index(s.features or NO_FEATURES, s.attained_gpu_s), s.seq)
        return git
    if policy is Policy.GITTINS:
        policy = Policy.LAS                 # too few jobs finished to learn from: las
    if policy is Policy.LAS:
        def las(s: Standing) -> tuple[float, float, int]:
            if s.running_since < 0 and las_starved(now, s.waiting_since, s.executed_s):
                return (*STARVED, s.seq)
            # The level first, then the least attained service inside it (it orders, never preempts).
            return (float(las_level(s.attained_gpu_s, thresholds)), s.attained_gpu_s, s.seq)
        return las
    if policy is Policy.SRTF:
        return lambda s: (0.0, s.remaining_gpu_s, s.seq)
    return lambda s: (0.0, 0.0, s.seq)


def waiting_rank(policy: Policy, s: Standing, thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S,
                 gittins: History | None = None) -> tuple[tuple[float, float, int], float]:
    """A job running nothing keeps one rank until the starvation guard promotes it: (that rank, the time from
    which it ranks as `STARVED` instead; infinity if never). Equal to `rank` at every time."""
    # Ranked the moment it began waiting, it is not starved yet.
    key = rank(policy, s.waiting_since, thresholds, gittins)(s)
    starves = policy in (Policy.LAS, Policy.GITTINS)
    return key, las_starve_at(s.waiting_since, s.executed_s) if starves else float("inf")


def rank_changes_at(policy: Policy, s: Standing, now: float,
                    thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S,
                    gittins: History | None = None) -> float:
    """For a running job: the earliest time its rank may worsen as in-queue preemption weighs it (`preempt_rank`;
    las and gittins: its service crossing the next las threshold, were all its GPUs running); infinity where it
    never does (srtf ranks only improve as a job runs)."""
    if policy not in (Policy.LAS, Policy.GITTINS):
        return float("inf")
    level = las_level(s.attained_gpu_s, thresholds)
    if level >= len(thresholds):
        return float("inf")
    return now + (thresholds[level] - s.attained_gpu_s) / max(s.gpus, 1)


def preempt_rank(policy: Policy, k: tuple[float, float, int] | tuple[float, float]) -> tuple[float, float]:
    """The part of a rank that in-queue preemption weighs (lower outranks). las and gittins weigh the las level
    alone: attained service (las) or the index (gittins) orders jobs inside a level but never preempts over it.
    (Weighing the index made the Philly window
    thrash: the index of Philly's sizes is not monotone and moves at every doubling of service, so fresh jobs and
    jobs a bucket apart took each other's GPUs 149k times, each preemption losing the work since a checkpoint.)"""
    return (k[0], 0.0) if policy in (Policy.LAS, Policy.GITTINS) else (k[0], k[1])


def preemptive(policy: Policy) -> bool:
    return policy in (Policy.LAS, Policy.SRTF, Policy.GITTINS)


@dataclass(frozen=True)
class Room:
    """A server as in-queue preemption sees it."""

    node_id: str
    domain: str       # rack / IB domain: a multi-server job is packed inside one
    size: int         # GPUs it offers in all
    free: int


def in_queue_victims(policy: Policy, now: float, waiting: Sequence[Standing], running: Sequence[Standing],
                     servers: Sequence[Room], held: Mapping[str, Mapping[str, int]],
                     min_run_s: float, levels: Mapping[str, str] | None = None,
                     fits_idle: list[str] | None = None,
                     thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S,
                     gittins: History | None = None, first: Collection[str] = ()) -> list[tuple[str, str]]:
    """(victim, beneficiary) pairs: running jobs of one queue that waiting jobs of the same queue outrank.

    `held` says where each running job's GPUs are (job -> server -> GPUs). Victims are chosen so that the
    beneficiary's AM can use the room at the locality level it is at (`levels`: job -> level label; strictest
    if unknown): at `node` / `packed` the fewest servers it could ever fit on, in one domain; at `rack` as few
    servers as will do in one domain; at `any` as few as will do anywhere. GPUs freed where its AM cannot use
    them would go back to the jobs that just lost them. A waiting job for which no such room can be made takes
    nothing; waiting jobs that fit in the idle GPUs take nothing either: they are appended to `fits_idle`, if
    given (the RM tells their AMs to plan now). The waiting jobs in `first` go before the others and outrank every
    running job (borrowing: a queue taking its steady share back, rm/sched/borrowing.py).
    """
    key = rank(policy, now, thresholds, gittins)
    full = {s.job_id: key(s) for s in running}
    rk = {job_id: preempt_rank(policy, k) for job_id, k in full.items()}
    # Inside one preemption rank, gittins gives up the lowest index first (others keep their order as given).
    within = {job_id: k[1] if policy is Policy.GITTINS else 0.0 for job_id, k in full.items()}
    free = {r.node_id: r.free for r in servers}
    idle = sum(free.values())
    biggest = max((r.size for r in servers), default=0)
    victims: list[tuple[str, str]] = []
    # Jobs that may be preempted, lowest-ranked first; `pool[:n]` are those a job ranked k outranks, where n is
    # where (-k0, -k1) would go in `negated` (their ranks, negated: ascending).
    pool = sorted((r for r in running if now - r.running_since >= min_run_s),
                  key=lambda r: (rk[r.job_id], within[r.job_id], full[r.job_id][2]), reverse=True)

    # Where the pool's jobs hold GPUs, their ranks negated, and the GPUs of the first n of them. Victims leave
    # the pool in place (their GPUs count no more), so the places and ranks stay as they are.
    on = _Spread(pool, held)
    negated = [(-rk[r.job_id][0], -rk[r.job_id][1]) for r in pool]
    room_gpus = list(itertools.accumulate((r.gpus for r in pool), initial=0))
    gone: set[str] = set()
    # Sizes no room could be made for since victims were last chosen: a job further down outranks no more
    # jobs (`pool[:n]` only shrinks) and finds no more idle GPUs, so it cannot fare better.
    hopeless: set[tuple[int, str]] = set()
    for w in sorted(waiting, key=lambda w: (w.job_id not in first, key(w))) if first else sorted(waiting, key=key):
        if idle >= w.gpus:
            idle -= _occupy(free, servers, w.gpus)         # it fits without preempting anybody
            if fits_idle is not None:
                fits_idle.append(w.job_id)
            continue
        level = (levels or {}).get(w.job_id, "") or "packed"
        if (w.gpus, level) in hopeless or biggest <= 0:
            continue
        kw = (-math.inf, -math.inf) if w.job_id in first else preempt_rank(policy, key(w))
        n = bisect.bisect_left(negated, (-kw[0], -kw[1]))  # how many it outranks (not by submit order alone)
        # gittins: between rooms of equal cost, the one whose victims have the lowest index.
        chosen = _compact_room(w.gpus, level, servers, free, on, n, biggest, policy is Policy.GITTINS) \
            if idle + room_gpus[n] >= w.gpus else None
        if chosen is None:
            hopeless.add((w.gpus, level))
            continue
        victim_ids, used = chosen
        for job_id in victim_ids:
            victims.append((job_id, w.job_id))
            for node_id, gpus in held.get(job_id, {}).items():
                if node_id in free:
                    free[node_id] += gpus
                    idle += gpus
        idle -= _occupy(free, [r for r in servers if r.node_id in used], w.gpus)
        gone.update(victim_ids)
        on.drop(victim_ids, held)
        room_gpus = list(itertools.accumulate((0 if r.job_id in gone else r.gpus for r in pool), initial=0))
        hopeless.clear()
    return victims


class _Spread:
    """Where a pool of would-be victims holds GPUs: per server, (place in the pool, job, GPUs there) in pool
    order, with running sums, so that the GPUs of the first n on a server are a bisection away."""

    def __init__(self, pool: Sequence[Standing], held: Mapping[str, Mapping[str, int]]) -> None:
        self.entries: dict[str, list[tuple[int, Standing, int]]] = {}
        self.orders: dict[str, list[int]] = {}
        self.sums: dict[str, list[int]] = {}
        for order, r in enumerate(pool):
            where = held.get(r.job_id)
            if where is None:
                continue
            for node_id, g in where.items():
                orders = self.orders.get(node_id)
                if orders is None:
                    self.entries[node_id] = [(order, r, g)]
                    self.orders[node_id] = [order]
                    self.sums[node_id] = [0, g]
                else:
                    self.entries[node_id].append((order, r, g))
                    orders.append(order)
                    sums = self.sums[node_id]
                    sums.append(sums[-1] + g)

    def drop(self, job_ids: Sequence[str], held: Mapping[str, Mapping[str, int]]) -> None:
        """Take these jobs out (their places stay: the others' do not move)."""
        out = set(job_ids)
        for node_id in {node_id for job_id in job_ids for node_id in held.get(job_id, {})}:
            entries = [e for e in self.entries.get(node_id, []) if e[1].job_id not in out]
            if not entries:
                self.entries.pop(node_id, None)
                self.orders.pop(node_id, None)
                self.sums.pop(node_id, None)
                continue
            sums = [0]
            for e in entries:
                sums.append(sums[-1] + e[2])
            self.entries[node_id] = entries
            self.orders[node_id] = [e[0] for e in entries]
            self.sums[node_id] = sums

    def gpus_of_first(self, node_id: str, n: int) -> int:
        orders = self.orders.get(node_id)
        return 0 if orders is None else self.sums[node_id][bisect.bisect_left(orders, n)]

    def first(self, node_id: str, n: int) -> list[tuple[int, Standing, int]]:
        orders = self.orders.get(node_id)
        return [] if orders is None else self.entries[node_id][:bisect.bisect_left(orders, n)]


def _compact_room(gpus: int, level: str, servers: Sequence[Room], free: Mapping[str, int], on: _Spread, n: int,
                  biggest: int, ties_by_order: bool = False) -> tuple[list[str], set[str]] | None:
    """The cheapest victims among the first `n` of the pool (fewest GPUs preempted, then lowest-ranked) whose
    GPUs, with the idle ones, give `gpus` GPUs where an AM at locality `level` can take them (see
    in_queue_victims); with the servers used. None if none do. `ties_by_order`: between rooms of equal cost, the
    one whose victims come first in the pool (else the first room found). A spread job (`spread:N`) is sized as
    at `any`."""
    if level.startswith("spread"):
        level = "any"
    fewest = -(-gpus // biggest)
    by_domain: dict[str, list[tuple[int, str]]] = {}        # domain -> (-room, server)
    for s in servers:
        room = free.get(s.node_id, 0) + on.gpus_of_first(s.node_id, n)
        if room > 0:
            by_domain.setdefault("" if level == "any" else s.domain, []).append((-room, s.node_id))
    best: tuple[tuple[int, int, tuple[int, ...]], list[str], set[str]] | None = None
    for domain in sorted(by_domain):
        group = sorted(by_domain[domain])
        if ties_by_order:
            # Between servers of equal room, the one whose would-be victims come first in the pool.
            def first_order(node: str) -> int:
                entries = on.first(node, n)
                return entries[0][0] if entries else n
            group = [(r, node) for r, _, node in sorted((r, first_order(node), node) for r, node in group)]
        if level in ("rack", "any"):
            # As few servers as will do: the roomiest first.
            total = 0
            take: list[str] = []
            for neg_room, node in group:
                if total >= gpus:
                    break
                take.append(node)
                total -= neg_room
            if total < gpus:
                continue
            candidates = [take]
        elif fewest == 1:
            candidates = [[node] for neg_room, node in group if -neg_room >= gpus]
        elif len(group) >= fewest and -sum(r for r, _ in group[:fewest]) >= gpus:
            candidates = [[node for _, node in group[:fewest]]]
        else:
            continue
        for chosen in candidates:
            have = sum(free.get(node, 0) for node in chosen)
            # Lowest-ranked first across the chosen servers; a victim counts only for its GPUs on them.
            here: dict[str, tuple[int, Standing, int]] = {}
            for node in chosen:
                for order, r, g in on.first(node, n):
                    o = here.get(r.job_id)
                    here[r.job_id] = (order, r, g + (o[2] if o else 0))
            picked: list[str] = []
            orders: list[int] = []
            preempted = 0
            for order, r, g in sorted(here.values(), key=lambda x: x[0]):
                if have >= gpus:
                    break
                picked.append(r.job_id)
                orders.append(order)
                have += g
                preempted += r.gpus
            if have < gpus:
                continue
            cost = (preempted, len(picked), tuple(orders) if ties_by_order else ())
            if best is None or cost < best[0]:
                best = (cost, picked, set(chosen))
    return None if best is None else (best[1], best[2])


def _occupy(free: dict[str, int], servers: Sequence[Room], gpus: int) -> int:
    """Mark `gpus` of the free GPUs on `servers` as spoken for, the way a compact plan would take them (one
    server that fits, tightest first; else the emptiest servers first). Returns how many it marked."""
    fits = [s for s in servers if free.get(s.node_id, 0) >= gpus]
    if fits:
        tightest = min(fits, key=lambda s: (free[s.node_id], s.node_id))
        free[tightest.node_id] -= gpus
        return gpus
    left = gpus
    for s in sorted(servers, key=lambda s: (-free.get(s.node_id, 0), s.node_id)):
        if left <= 0:
            break
        take = min(left, free.get(s.node_id, 0))
        free[s.node_id] -= take
        left -= take
    return gpus - left


def room_victims(gpus: int, level: str, servers: Sequence[Room], free: Mapping[str, int], pool: Sequence[Standing],
                 held: Mapping[str, Mapping[str, int]]) -> tuple[list[str], set[str]] | None:
    """Victims among `pool` (preferred first) whose GPUs, with the idle ones (`free`), give `gpus` GPUs where an
    AM at locality `level` can take them (as in in_queue_victims: the fewest GPUs preempted, then the fewest jobs,
    the first in `pool` first); with the servers used. None if no such room can be made. Fair-share preemption
    (rm/sched/preemption.py) asks this for the starving queue's waiting jobs."""
    biggest = max((r.size for r in servers), default=0)
    if gpus <= 0 or biggest <= 0:
        return None
    return _compact_room(gpus, level or "packed", servers, free, _Spread(pool, held), len(pool), biggest, True)


def occupy(free: dict[str, int], servers: Sequence[Room], gpus: int) -> int:
    """Mark `gpus` free GPUs on `servers` as spoken for, as a compact plan would take them; how many it marked."""
    return _occupy(free, servers, gpus)
