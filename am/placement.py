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

from collections.abc import Iterable, Sequence
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


def fewest_servers(gpus: int, servers: Iterable[ServerView]) -> int:
    """The fewest servers the job could occupy in this cluster if it were empty (its best-case packing)."""
    sizes = sorted((s.total for s in servers if s.total > 0), reverse=True)
    total = 0
    for k, size in enumerate(sizes, start=1):
        total += size
        if total >= gpus:
            return k
    return max(len(sizes), 1) if total >= gpus else len(sizes) + 1


def plan(gpus: int, servers: Sequence[ServerView], level: LocalityLevel,
         avoid: Iterable[str] = ()) -> Plan | None:
    """A placement of `gpus` GPUs at exactly `level`, or None when none fits the view right now."""
    avoided = set(avoid)
    usable = [s for s in servers if s.node_id not in avoided]
    candidates = [s for s in usable if s.free]
    if level is LocalityLevel.NODE:
        fits = [s for s in candidates if len(s.free) >= gpus]
        if not fits:
            return None
        best = min(fits, key=lambda s: (len(s.free) - gpus, -_rack_size(s, candidates), s.node_id))
        return Plan(level, [_part(best, gpus)])
    if level is LocalityLevel.ANY:
        chosen = _choose(candidates, gpus, max_servers=None)
        return Plan(level, chosen) if chosen else None
    cap = fewest_servers(gpus, usable) if level is LocalityLevel.PACKED else None
    by_domain: dict[str, list[ServerView]] = {}
    for s in candidates:
        by_domain.setdefault(s.domain, []).append(s)
    # The domain with the most candidate servers first; ties to the one that leaves the least over.
    ranked = sorted(by_domain.items(),
                    key=lambda kv: (-len(kv[1]), sum(len(s.free) for s in kv[1]), kv[0]))
    for _, members in ranked:
        chosen = _choose(members, gpus, max_servers=cap)
        if chosen:
            return Plan(level, chosen)
    return None


def _rack_size(s: ServerView, servers: Sequence[ServerView]) -> int:
    return sum(1 for x in servers if x.domain == s.domain)


def _choose(servers: Sequence[ServerView], gpus: int, max_servers: int | None) -> list[Part] | None:
    """Fewest servers first: take the fullest servers while no single one fits the rest, then the tightest
    server that does (best fit)."""
    remaining = gpus
    pool = sorted(servers, key=lambda s: (-len(s.free), s.node_id))
    parts: list[Part] = []
    while remaining > 0 and pool:
        fits = [s for s in pool if len(s.free) >= remaining]
        if fits:
            pick = min(fits, key=lambda s: (len(s.free), s.node_id))
            parts.append(_part(pick, remaining))
            remaining = 0
        else:
            pick = pool[0]
            parts.append(_part(pick, len(pick.free)))
            remaining -= len(pick.free)
        pool.remove(pick)
        if max_servers is not None and len(parts) > max_servers:
            return None
    return parts if remaining == 0 else None


def _part(server: ServerView, count: int) -> Part:
    indices = choose_in_islands(server.free, [list(i) for i in server.islands], count) or []
    return Part(server.node_id, server.rack, tuple(indices))
