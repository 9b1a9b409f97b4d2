"""The AM's placement planner. Pure: a job's GPU count and a cluster view in, a plan (or None) out.

Locality levels, strictest first (Philly's):
- node:   every GPU on one server;
- packed: the fewest servers the job could ever fit on, all in one rack / IB domain;
- rack:   any number of servers in one rack / IB domain;
- any:    anywhere, fewest servers first.
Inside a level, fragmentation-aware packing (best fit at every scale, after HiveD's buddy cells): keep whole
servers and whole racks free for the big jobs that need them.
- A job that fits on one server goes to the fullest server where it fits (the fewest GPUs left over), and among
  equally full servers to the fullest rack / IB domain.
- A multi-server job takes, in each domain, the fullest servers while none fits the rest, then the tightest one
  that does (whole free servers first: a server with all 8 free is the fullest pick for what is left); among the
  domains that can hold it, the plan with the fewest servers, then the fewest GPUs left over on the servers it
  touches, then the domain with the fewest free GPUs (the tightest rack) wins.
- At `any`, the fullest servers anywhere while none fits the rest, then the tightest.
On a server, a learner's GPUs stay on NVLink peers when the topology is known. Ties between equally good choices
go to a per-AM order (`salt`), so AMs planning from one view spread over them.

A job with `placement: spread` is planned by `plan_spread` instead, with no locality level: one GPU per server on
as many servers as possible, distinct racks first, never more than `cap` GPUs on one server (the AM raises the cap
when it waits too long; docs/jobs.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpurm.common.gpus import choose_in_islands
from gpurm.common.jobspec import LocalityLevel

T = TypeVar("T")

BACKFILL_MARGIN_S = 60.0       # a job plans on GPUs reserved for another only if it would vacate them this much early


@dataclass(frozen=True)
class ServerView:
    """One server as the AM sees it (from the RM's published view)."""

    node_id: str
    rack: str
    total: int                                   # healthy GPUs
    free: tuple[int, ...]                        # free GPU indices
    islands: tuple[tuple[int, ...], ...] = ()    # NVLink islands, when known
    ib_domain: str = ""
    reclaimable: tuple[int, ...] = ()            # of `free`: held by elastic jobs' growth, taken back for a gang
    # Free GPUs reserved for a job that waits for this server (rm/sched/reservations.py): not in `free`. Its AM, and
    # one expected to end before `reserved_until` (backfill), may plan on them (`View.for_job`).
    reserved: tuple[int, ...] = ()
    reserved_for: str = ""
    reserved_until: float = 0.0
    has_image: bool = False                      # holds the job's image: preferred among equally good servers

    @property
    def domain(self) -> str:
        return self.ib_domain or self.rack

    def usable_by(self, job_id: str, now: float, expected_run_s: float) -> bool:
        """Whether `job_id` may take this server's reserved GPUs: it holds the reservation, or it is expected to end
        before the reserved job needs them, with a margin (the RM's estimate of its run may have moved a little
        since its last reply: an AM that planned on GPUs the RM then refused would plan there again)."""
        return bool(self.reserved) and (self.reserved_for == job_id
                                        or now + expected_run_s + BACKFILL_MARGIN_S <= self.reserved_until)

    def with_reserved(self) -> ServerView:
        """This server with its reserved GPUs free (as the reservation's holder sees it)."""
        return ServerView(self.node_id, self.rack, self.total, tuple(sorted((*self.free, *self.reserved))),
                          self.islands, self.ib_domain, self.reclaimable, has_image=self.has_image)


@dataclass(frozen=True)
class Part:
    node_id: str
    rack: str
    gpu_indices: tuple[int, ...]

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)


@dataclass
class Plan:
    level: LocalityLevel
    parts: list[Part] = field(default_factory=list)

    @property
    def servers(self) -> int:
        return len(self.parts)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.parts)

    def describe(self) -> str:
        racks = sorted({p.rack for p in self.parts})
        where = f"rack {racks[0]}" if len(racks) == 1 else f"racks {', '.join(racks)}"
        return f"{self.gpus} GPUs on {self.servers} server{'s' if self.servers != 1 else ''} in {where}"


class View:
    """Servers as the AM sees them, with aggregates that answer "no plan can exist now" without scanning them:
    a busy cluster has many waiting jobs and most of their replans fail. One View is shared by every reader, and
    so are what planners derive from it (servers with free GPUs, grouped by domain); a View is never changed after
    it is built (`updated` builds the next one from it)."""

    def __init__(self, servers: Iterable[ServerView]) -> None:
        self.servers = list(servers)
        self.free_on: dict[str, int] = {s.node_id: len(s.free) for s in self.servers}
        self.total_free = sum(self.free_on.values())
        self.max_free = max(self.free_on.values(), default=0)
        domain_free: dict[str, int] = {}
        for s in self.servers:
            d = s.ib_domain or s.rack
            domain_free[d] = domain_free.get(d, 0) + self.free_on[s.node_id]
        self._domain_free = domain_free
        self.max_domain_free = max(domain_free.values(), default=0)
        self._sizes: list[int] | None = None     # healthy GPUs per server, largest first (when first needed)
        self._fewest: dict[int, int] = {}
        self._index: dict[str, int] | None = None
        self._candidates: list[ServerView] | None = None
        self._by_domain: dict[str, list[ServerView]] | None = None
        self._no_plan: set[tuple[int, LocalityLevel]] = set()
        self._shape: dict[tuple[int, LocalityLevel], bool] = {}   # (gpus, level) -> satisfiable in an empty cluster
        self.reserved_on: dict[str, ServerView] = {s.node_id: s for s in self.servers if s.reserved}
        self._holders: frozenset[str] | None = None   # servers holding the job's image (when first needed)

    def updated(self, changed: Iterable[ServerView]) -> View:
        """A new View: this one with some servers replaced (same node ids, same order), the aggregates updated
        from the changes alone. Equal to building a View from the resulting server list."""
        new = View(())                  # the aggregates of no servers (cheap), replaced below
        servers = list(self.servers)
        free_on = dict(self.free_on)
        domain_free = dict(self._domain_free)
        index = self._index
        if index is None:
            index = self._index = {s.node_id: k for k, s in enumerate(self.servers)}
        sizes_same = True
        domains_same = True
        total = self.total_free
        reserved_on = self.reserved_on
        for s in changed:
            if s.reserved or s.node_id in reserved_on:
                if reserved_on is self.reserved_on:
                    reserved_on = dict(reserved_on)
                if s.reserved:
                    reserved_on[s.node_id] = s
                else:
                    del reserved_on[s.node_id]
            k = index[s.node_id]
            old = servers[k]
            servers[k] = s
            n_old, n_new = free_on[old.node_id], len(s.free)
            free_on[s.node_id] = n_new
            total += n_new - n_old
            d_old, d_new = old.ib_domain or old.rack, s.ib_domain or s.rack
            domain_free[d_old] -= n_old
            domain_free[d_new] = domain_free.get(d_new, 0) + n_new
            if d_old != d_new and not any((x.ib_domain or x.rack) == d_old for x in servers):
                del domain_free[d_old]
            sizes_same = sizes_same and old.total == s.total
            domains_same = domains_same and d_old == d_new
        new.servers = servers
        new.free_on = free_on
        new.total_free = total
        new.max_free = max(free_on.values(), default=0)
        new._domain_free = domain_free
        new.max_domain_free = max(domain_free.values(), default=0)
        new._sizes = self._sizes if sizes_same else None
        new._fewest = self._fewest if sizes_same else {}
        new._index = index
        new._candidates = None
        new._by_domain = None
        new._no_plan = set()
        # The shape (sizes, domains) is what `satisfiable` reads: keep its answers while it did not change.
        new._shape = self._shape if sizes_same and domains_same else {}
        new.reserved_on = reserved_on
        return new

    def for_job(self, job_id: str, now: float, expected_run_s: float) -> View:
        """The view as `job_id` may plan on it: with the reserved GPUs it may take (its own reservation's, or
        another's it would vacate in time: `ServerView.usable_by`) counted free. Itself when there are none."""
        if not self.reserved_on:
            return self
        usable = [s.with_reserved() for s in self.reserved_on.values() if s.usable_by(job_id, now, expected_run_s)]
        return self.updated(usable) if usable else self

    def __len__(self) -> int:
        return len(self.servers)

    @property
    def image_holders(self) -> frozenset[str]:
        """The servers that hold the job's image (ServerView.has_image): preferred in ties."""
        if self._holders is None:
            self._holders = frozenset(s.node_id for s in self.servers if s.has_image)
        return self._holders

    def fewest_servers(self, gpus: int) -> int:
        k = self._fewest.get(gpus)
        if k is None:
            if self._sizes is None:
                self._sizes = sorted((s.total for s in self.servers if s.total > 0), reverse=True)
            k = self._fewest[gpus] = fewest_of(gpus, self._sizes)
        return k

    def satisfiable(self, gpus: int, level: LocalityLevel) -> bool:
        """Whether a plan at `level` could ever exist for `gpus` GPUs on this cluster's shape (its servers'
        healthy GPUs and their racks), were every GPU free: a level that fails this is not worth waiting at."""
        key = (gpus, level)
        known = self._shape.get(key)
        if known is None:
            known = self._shape[key] = self._satisfiable(gpus, level)
        return known

    def _satisfiable(self, gpus: int, level: LocalityLevel) -> bool:
        sizes = [s.total for s in self.servers if s.total > 0]
        if level is LocalityLevel.NODE:
            return max(sizes, default=0) >= gpus
        if level is LocalityLevel.ANY:
            return sum(sizes) >= gpus
        domains: dict[str, list[int]] = {}
        for s in self.servers:
            if s.total > 0:
                domains.setdefault(s.domain, []).append(s.total)
        if level is LocalityLevel.RACK:
            return any(sum(d) >= gpus for d in domains.values())
        cap = self.fewest_servers(gpus)     # PACKED: the fewest servers anywhere, all of them in one domain
        return any(sum(sorted(d, reverse=True)[:cap]) >= gpus for d in domains.values())

    def cannot_fit(self, gpus: int, level: LocalityLevel) -> bool:
        """True when the aggregates alone prove no plan at `level` exists (False: maybe one does)."""
        if level is LocalityLevel.NODE:
            return self.max_free < gpus
        if level is LocalityLevel.ANY:
            return self.total_free < gpus
        return self.max_domain_free < gpus

    def fits(self, gpus: int, level: LocalityLevel) -> bool | None:
        """Whether a plan at `level` exists for `gpus` GPUs (avoiding no server), where the aggregates decide it
        exactly; None where only planning can tell (`packed` for a job that needs more than one server). Exact
        because the planner's greedy choice (the fullest servers first) finds a plan whenever one exists: `any`
        needs as many free GPUs in all, `rack` in one domain, `node` and a one-server `packed` on one server."""
        if level is LocalityLevel.NODE:
            return self.max_free >= gpus
        if level is LocalityLevel.ANY:
            return self.total_free >= gpus
        if level is LocalityLevel.RACK or self.max_domain_free < gpus:
            return self.max_domain_free >= gpus
        if self.fewest_servers(gpus) == 1:
            return self.max_free >= gpus
        return None

    def candidates(self) -> list[ServerView]:
        """Servers with a free GPU, in view order (computed once per View; do not modify)."""
        if self._candidates is None:
            self._candidates = [s for s in self.servers if s.free]
        return self._candidates

    def by_domain(self) -> dict[str, list[ServerView]]:
        """The candidates per domain, domains in order of first appearance (computed once per View)."""
        if self._by_domain is None:
            by_domain: dict[str, list[ServerView]] = {}
            for s in self.candidates():
                by_domain.setdefault(s.domain, []).append(s)
            self._by_domain = by_domain
        return self._by_domain


def as_view(servers: View | Sequence[ServerView]) -> View:
    return servers if isinstance(servers, View) else View(servers)


def fewest_servers(gpus: int, servers: Iterable[ServerView]) -> int:
    """The fewest servers the job could occupy in this cluster if it were empty (its best-case packing)."""
    if isinstance(servers, View):
        return servers.fewest_servers(gpus)
    return fewest_of(gpus, sorted((s.total for s in servers if s.total > 0), reverse=True))


def fewest_of(gpus: int, sizes: list[int]) -> int:
    """How many of these sizes (servers' or racks' GPUs, largest first) it takes to hold `gpus`; one more than
    there are when even all of them cannot."""
    total = 0
    for k, size in enumerate(sizes, start=1):
        total += size
        if total >= gpus:
            return k
    return max(len(sizes), 1) if total >= gpus else len(sizes) + 1


def _tie(salt: int | None, prefer: frozenset[str] = frozenset()) -> Callable[[str], tuple[int, str]]:
    """Ties between equally good servers: those in `prefer` first (they hold the job's image: image locality,
    like Kubernetes' ImageLocality), then by name, or (salted) in an order of the AM's own, so AMs planning
    from the same view at the same moment spread over the equally good servers instead of all asking for
    one (a thundering herd)."""
    if prefer:
        base = _tie(salt)
        return lambda name: (base(name)[0] - (1 << 40), name) if name in prefer else base(name)
    if salt is None:
        return lambda name: (0, name)
    known = _TIES.get(salt)
    if known is None:
        if len(_TIES) >= _TIES_MAX:
            _TIES.clear()              # a memo only: the keys are recomputed the same way
        known = _TIES[salt] = {}

    def tie(name: str) -> tuple[int, str]:
        key = known.get(name)
        if key is None:
            key = known[name] = (zlib.crc32(f"{salt}:{name}".encode()), name)
        return key
    return tie


_TIES: dict[int, dict[str, tuple[int, str]]] = {}   # salt -> server name -> tie key (a memo of _tie's keys)
_TIES_MAX = 4096


def _best(items: Sequence[T], primary: Callable[[T], object], name: Callable[[T], str],
          tie: Callable[[str], tuple[int, str]]) -> T:
    """min(items, key=(primary, tie(name))), computing the (costly) tie only among the items whose primary key is
    the least. Same answer: the tie key is unique per name, so only the primary minimum's items compete."""
    keys = [primary(x) for x in items]
    low = min(keys)  # type: ignore[type-var]
    best = [x for x, k in zip(items, keys, strict=True) if k == low]
    if len(best) == 1:
        return best[0]
    return min(best, key=lambda x: tie(name(x)))


def plan(gpus: int, servers: View | Sequence[ServerView], level: LocalityLevel,
         avoid: Iterable[str] = (), salt: int | None = None) -> Plan | None:
    """A placement of `gpus` GPUs at exactly `level`, or None when none fits the view right now."""
    view = as_view(servers)
    if view.cannot_fit(gpus, level):
        return None        # avoiding servers only shrinks what fits, so the answer stands
    avoided = set(avoid)
    if not avoided:
        if (gpus, level) in view._no_plan:
            return None    # planned on this view before and failed: the salt only breaks ties, never decides
        found = _plan(view, gpus, level, avoided, salt)
        if found is None:
            view._no_plan.add((gpus, level))
        return found
    return _plan(view, gpus, level, avoided, salt)


def _plan(view: View, gpus: int, level: LocalityLevel, avoided: set[str], salt: int | None) -> Plan | None:
    if avoided:
        usable = [s for s in view.servers if s.node_id not in avoided]
        candidates = [s for s in usable if s.free]
        by_domain: dict[str, list[ServerView]] = {}
        for s in candidates:
            by_domain.setdefault(s.domain, []).append(s)
    else:
        usable = view.servers
        candidates = view.candidates()
        by_domain = view.by_domain()
    prefer = view.image_holders
    tie = _tie(salt, prefer)
    # Best fit at both scales (module doc): the free GPUs of each domain rank its servers and its plans.
    domain_free = {d: sum(len(s.free) for s in members) for d, members in by_domain.items()} if avoided \
        else view._domain_free
    if level is LocalityLevel.NODE:
        fits = [s for s in candidates if len(s.free) >= gpus]
        if not fits:
            return None
        best = _best(fits, lambda s: (len(s.free) - gpus, domain_free[s.domain]), _name, tie)
        return Plan(level, [_part(best, gpus)])
    if level is LocalityLevel.ANY:
        chosen = _choose(candidates, gpus, max_servers=None, salt=salt, prefer=prefer)
        return Plan(level, chosen) if chosen else None
    most_free = view.max_free if not avoided else max((len(s.free) for s in candidates), default=0)
    if most_free >= gpus:
        # Some server holds the job: a one-server plan beats every other at `packed` and `rack`, so the ranking
        # below comes down to this (the same answer, ties included, without planning in every domain).
        fits = [s for s in candidates if len(s.free) >= gpus]
        keys = [(len(s.free) - gpus, domain_free[s.domain]) for s in fits]
        least = min(keys)
        tight = [s for s, k in zip(fits, keys, strict=True) if k == least]
        best = tight[0] if len(tight) == 1 else min(tight, key=lambda s: (tie(s.domain), tie(s.node_id)))
        return Plan(level, [_part(best, gpus)])
    cap = (view.fewest_servers(gpus) if not avoided else fewest_servers(gpus, usable)) \
        if level is LocalityLevel.PACKED else None
    # Every domain's own best plan, then the plan that fits most tightly: the fewest servers, the fewest GPUs left
    # over on the servers it touches, then the fullest domain (an emptier one stays whole for a bigger job).
    ranked: list[tuple[tuple[int, int, int], str, list[Part]]] = []
    for d, members in by_domain.items():
        if domain_free[d] < gpus:
            continue
        chosen = _choose(members, gpus, max_servers=cap, salt=salt, prefer=prefer)
        if chosen:
            free_on = view.free_on
            left = sum(free_on[p.node_id] - p.gpus for p in chosen)
            ranked.append(((len(chosen), left, domain_free[d]), d, chosen))
    if not ranked:
        return None
    low = min(r[0] for r in ranked)
    best_plans = [r for r in ranked if r[0] == low]
    if len(best_plans) > 1:
        best_plans.sort(key=lambda r: tie(r[1]))       # only equal plans need the (costly) tie
    return Plan(level, best_plans[0][2])


def _name(s: ServerView) -> str:
    return s.node_id


def _choose(servers: Sequence[ServerView], gpus: int, max_servers: int | None,
            salt: int | None = None, prefer: frozenset[str] = frozenset()) -> list[Part] | None:
    """Fewest servers first: take the fullest servers while no single one fits the rest, then the tightest
    server that does (best fit)."""
    if sum(len(s.free) for s in servers) < gpus:
        return None                       # the loop below would run out of servers
    remaining = gpus
    tie = _tie(salt, prefer)
    pool = list(servers)
    picks: list[tuple[ServerView, int]] = []
    while remaining > 0 and pool:
        fits = [s for s in pool if len(s.free) >= remaining]
        if fits:
            pick = _best(fits, _free_count, _name, tie)
            picks.append((pick, remaining))
            remaining = 0
        else:
            pick = _best(pool, _minus_free_count, _name, tie)     # the fullest
            picks.append((pick, len(pick.free)))
            remaining -= len(pick.free)
        pool.remove(pick)
        if max_servers is not None and len(picks) > max_servers:
            return None
    return [_part(s, n) for s, n in picks] if remaining == 0 else None


def _free_count(s: ServerView) -> int:
    return len(s.free)


def _minus_free_count(s: ServerView) -> int:
    return -len(s.free)


def _part(server: ServerView, count: int) -> Part:
    indices = choose_in_islands(server.free, [list(i) for i in server.islands], count) or []
    return Part(server.node_id, server.rack, tuple(indices))


def spread_shape_cap(gpus: int, sizes: Iterable[int]) -> int:
    """The least per-server cap at which `gpus` GPUs can ever be spread over servers of these sizes (healthy GPUs),
    were every GPU free: 1 where there are `gpus` servers, 2 where only half as many, ...; 0 (no cap) where even
    whole servers do not hold the job."""
    held = sorted((n for n in sizes if n > 0), reverse=True)
    for cap in range(1, (held[0] if held else 0) + 1):
        if sum(min(n, cap) for n in held) >= gpus:
            return cap
    return 0


def plan_spread(gpus: int, servers: View | Sequence[ServerView], cap: int, avoid: Iterable[str] = (),
                salt: int | None = None) -> Plan | None:
    """A spread placement of `gpus` GPUs with at most `cap` on one server (0: no cap), or None when none fits the
    view now. As many servers as the free GPUs allow: one GPU from each server in turn, taking the servers in an
    order that goes through the racks (the fullest rack's fullest server, then the next rack's, ...; a second
    server of a rack only after every rack gave one), then a second GPU from each, and so on. The fullest first
    (best fit), so that whole servers stay free for the jobs that pack. The plan's level is `any`."""
    view = as_view(servers)
    if view.total_free < gpus:
        return None
    avoided = set(avoid)
    candidates = [s for s in view.candidates() if s.node_id not in avoided]
    limit = cap if cap > 0 else gpus
    if sum(min(len(s.free), limit) for s in candidates) < gpus:
        return None
    tie = _tie(salt)
    racks: dict[str, list[ServerView]] = {}
    for s in candidates:
        racks.setdefault(s.rack, []).append(s)
    rack_free = {r: sum(len(s.free) for s in members) for r, members in racks.items()}
    ordered = [sorted(members, key=lambda s: (len(s.free), tie(s.node_id)))
               for _, members in sorted(racks.items(), key=lambda kv: (rack_free[kv[0]], tie(kv[0])))]
    order = [rack[i] for i in range(max(len(r) for r in ordered)) for rack in ordered if i < len(rack)]
    counts = [0] * len(order)
    remaining = gpus
    while remaining > 0:
        for k, s in enumerate(order):
            if remaining == 0:
                break
            if counts[k] < limit and counts[k] < len(s.free):
                counts[k] += 1
                remaining -= 1
    return Plan(LocalityLevel.ANY, [_part(s, n) for s, n in zip(order, counts, strict=True) if n > 0])
