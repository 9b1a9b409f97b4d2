"""Where an elastic job grows (the AM's side of rm/sched/elastic.py). Pure.

An elastic job runs a gang of its minimum, placed like any job (am/placement.py). Growth then asks for more
GPUs, one container per server, where the job stays packed: first on the servers it already runs on, then in its
master's rack (IB domain), and elsewhere only when its attempt already runs at level `any` (or its locality is
`any`). A gang placed on one server (level `node`) still grows within its rack: its minimum fitted on one
server, its maximum may not. GPUs that other
elastic jobs hold (`ServerView.reclaimable`) are not free for growth: growth never takes from anyone.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpurm.am.placement import ServerView, View
from gpurm.common.jobspec import LocalityLevel


def growable(s: ServerView) -> list[int]:
    """Free GPUs of a server that growth may ask for (not those held by elastic jobs)."""
    taken = set(s.reclaimable)
    return [i for i in s.free if i not in taken]


def growth_parts(view: View, want: int, own: Iterable[str], master_node: str, level: LocalityLevel,
                 avoid: set[str]) -> list[tuple[str, int, tuple[int, ...]]]:
    """Asks (node, GPUs, preferred indices) for up to `want` more GPUs; the job runs on `own` servers."""
    if want <= 0:
        return []
    own_set = set(own)
    by_id = {s.node_id: s for s in view.servers}
    master = by_id.get(master_node)
    domain = master.domain if master is not None else ""

    def allowed(s: ServerView) -> bool:
        if s.node_id in avoid:
            return False
        return s.node_id in own_set or level is LocalityLevel.ANY or s.domain == domain

    candidates = [(s, growable(s)) for s in view.servers if allowed(s)]
    candidates = [(s, free) for s, free in candidates if free]
    candidates.sort(key=lambda sf: (sf[0].node_id not in own_set, sf[0].domain != domain, -len(sf[1]),
                                    sf[0].node_id))
    out: list[tuple[str, int, tuple[int, ...]]] = []
    for s, free in candidates:
        take = min(len(free), want)
        out.append((s.node_id, take, tuple(free[:take])))
        want -= take
        if want <= 0:
            break
    return out
