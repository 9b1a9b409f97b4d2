"""The AM's placement planner. Pure: a job's GPU count and a cluster view in, a plan (or None) out.

Locality levels, strictest first (Philly's):
- node:   every GPU on one server;
- packed: the fewest servers the job could ever fit on, all in one rack / IB domain;
- rack:   any number of servers in one rack / IB domain;
- any:    anywhere, fewest servers first.
Inside a level: the rack with the most candidate servers wins; inside the rack, best fit (the server whose free
GPUs match the need, fewest GPUs left over); on a server, a learner's GPUs stay on NVLink peers when the
topology is known.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpurm.rm.cluster import choose_in_islands
from gpurm.rm.jobspec import LocalityLevel


@dataclass(frozen=True)
class ServerView:
    """One server as the AM sees it (from the RM's published view)."""

    node_id: str
    rack: str
    total: int                                   # healthy GPUs
    free: tuple[int, ...]                        # free GPU indices
    islands: tuple[tuple[int, ...], ...] = ()    # NVLink islands, when known
    ib_domain: str = ""

    @property
    def domain(self) -> str:
        return self.ib_domain or self.rack


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
    a busy cluster has many waiting jobs and most of their replans fail. One View is shared by every reader."""

    def __init__(self, servers: Iterable[ServerView]) -> None:
        self.servers = list(servers)
        self.free_on: dict[str, int] = {s.node_id: len(s.free) for s in self.servers}
        self.total_free = sum(self.free_on.values())
        self.max_free = max(self.free_on.values(), default=0)
        domain_free: dict[str, int] = {}
        for s in self.servers:
            d = s.ib_domain or s.rack
            domain_free[d] = domain_free.get(d, 0) + self.free_on[s.node_id]
        self.max_domain_free = max(domain_free.values(), default=0)
        self._sizes: list[int] | None = None     # healthy GPUs per server, largest first (when first needed)
        self._fewest: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.servers)

    def fewest_servers(self, gpus: int) -> int:
        k = self._fewest.get(gpus)
        if k is None:
            if self._sizes is None:
                self._sizes = sorted((s.total for s in self.servers if s.total > 0), reverse=True)
            k = self._fewest[gpus] = _fewest(gpus, self._sizes)
        return k

    def cannot_fit(self, gpus: int, level: LocalityLevel) -> bool:
        """True when the aggregates alone prove no plan at `level` exists (False: maybe one does)."""
        if level is LocalityLevel.NODE:
            return self.max_free < gpus
        if level is LocalityLevel.ANY:
            return self.total_free < gpus
        return self.max_domain_free < gpus


def as_view(servers: View | Sequence[ServerView]) -> View:
    return servers if isinstance(servers, View) else View(servers)


def fewest_servers(gpus: int, servers: Iterable[ServerView]) -> int:
    """The fewest servers the job could occupy in this cluster if it were empty (its best-case packing)."""
    if isinstance(servers, View):
        return servers.fewest_servers(gpus)
    return _fewest(gpus, sorted((s.total for s in servers if s.total > 0), reverse=True))


def _fewest(gpus: int, sizes: list[int]) -> int:
    total = 0
    for k, size in enumerate(sizes, start=1):
        total += size
        if total >= gpus:
            return k
    return max(len(sizes), 1) if total >= gpus else len(sizes) + 1


def _tie(salt: int | None) -> Callable[[str], tuple[int, str]]:
    """Ties between equally good servers: by name, or (salted) in an order of the AM's own, so AMs planning
    from the same view at the same moment spread over the equally good servers instead of all asking for
    one (a thundering herd)."""
    if salt is None:
        return lambda name: (0, name)
    return lambda name: (zlib.crc32(f"{salt}:{name}".encode()), name)


def plan(gpus: int, servers: View | Sequence[ServerView], level: LocalityLevel,
         avoid: Iterable[str] = (), salt: int | None = None) -> Plan | None:
    """A placement of `gpus` GPUs at exactly `level`, or None when none fits the view right now."""
    view = as_view(servers)
    if view.cannot_fit(gpus, level):
        return None        # avoiding servers only shrinks what fits, so the answer stands
    avoided = set(avoid)
    usable = [s for s in view.servers if s.node_id not in avoided]
    candidates = [s for s in usable if s.free]
    if level is LocalityLevel.NODE:
        fits = [s for s in candidates if len(s.free) >= gpus]
        if not fits:
            return None
        tie = _tie(salt)
        per_domain: dict[str, int] = {}
        for s in candidates:
            per_domain[s.domain] = per_domain.get(s.domain, 0) + 1
        best = min(fits, key=lambda s: (len(s.free) - gpus, -per_domain[s.domain], tie(s.node_id)))
        return Plan(level, [_part(best, gpus)])
    if level is LocalityLevel.ANY:
        chosen = _choose(candidates, gpus, max_servers=None, salt=salt)
        return Plan(level, chosen) if chosen else None
    cap = (view.fewest_servers(gpus) if not avoided else fewest_servers(gpus, usable)) \
        if level is LocalityLevel.PACKED else None
    by_domain: dict[str, list[ServerView]] = {}
    for s in candidates:
        by_domain.setdefault(s.domain, []).append(s)
    # The domain with the most candidate servers first; ties to the one that leaves the least over.
    tie = _tie(salt)
    ranked = sorted(by_domain.items(),
                    key=lambda kv: (-len(kv[1]), sum(len(s.free) for s in kv[1]), tie(kv[0])))
    for _, members in ranked:
        chosen = _choose(members, gpus, max_servers=cap, salt=salt)
        if chosen:
            return Plan(level, chosen)
    return None


def _choose(servers: Sequence[ServerView], gpus: int, max_servers: int | None,
            salt: int | None = None) -> list[Part] | None:
    """Fewest servers first: take the fullest servers while no single one fits the rest, then the tightest
    server that does (best fit)."""
    remaining = gpus
    tie = _tie(salt)
    pool = list(servers)
    parts: list[Part] = []
    while remaining > 0 and pool:
        fits = [s for s in pool if len(s.free) >= remaining]
        if fits:
            pick = min(fits, key=lambda s: (len(s.free), tie(s.node_id)))
            parts.append(_part(pick, remaining))
            remaining = 0
        else:
            pick = min(pool, key=lambda s: (-len(s.free), tie(s.node_id)))     # the fullest
            parts.append(_part(pick, len(pick.free)))
            remaining -= len(pick.free)
        pool.remove(pick)
        if max_servers is not None and len(parts) > max_servers:
            return None
    return parts if remaining == 0 else None


def _part(server: ServerView, count: int) -> Part:
    indices = choose_in_islands(server.free, [list(i) for i in server.islands], count) or []
    return Part(server.node_id, server.rack, tuple(indices))
