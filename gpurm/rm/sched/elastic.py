"""Elastic jobs in the RM: growth beyond a job's minimum on idle GPUs, and taking it back when anyone waits. Pure.

An elastic job (`gpus: {min: 4, max: 16}`) runs a gang of its minimum like any job. Once it runs, its AM asks
for more with *elastic* asks (am/master.py). The RM grants them only onto GPUs nobody wants: while no gang ask
waits anywhere and no queue has unmet demand (RMCore.unmet_demand: jobs queued without an AM, AMs backing off,
gangs half granted; a queue held back by its own max_gpus wants nothing growth could take), and only once that
has lasted IDLE_HOLD_S (`idle_since`; rm.yaml `elastic.idle_hold`). Growing whenever nobody asked at that very
instant made a carousel on a busy cluster: GPUs grown onto between a release and the next job's ask were taken
straight back, each time a resize for the elastic job and a preemption notice for the waiting one (docs/sim.md
"Elastic jobs" has the numbers). What it grants is a preemptible container marked elastic. When a gang ask then
waits on a server (or a rack, or anywhere) where elastic containers run, the RM takes back just enough of them,
newest first, with the usual preemption notice to their AM, which lets its job go on with fewer learners: elastic
jobs shrink toward their minimum before anybody is preempted whole (fair-share preemption, which takes whole jobs,
acts only after its timeouts, by when the elastic GPUs are back). The cluster view shows elastic GPUs as reclaimable
(`NodeView.elastic_gpus`), so a waiting AM plans onto them and asks for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpurm.common.model import Container
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.cluster import Cluster


@dataclass
class Growth:
    """One job's outstanding elastic asks."""

    job_id: str
    queue: str
    user: str
    seq: int
    asks: list[Ask] = field(default_factory=list)


@dataclass
class Taken:
    """An elastic container the RM takes back, and the ask it makes room for."""

    container: Container
    for_job: str


# A job whose growth was taken back does not grow again for this long: GPUs freed for a waiting job, or by
# preemption for a queue, must not go straight back to growth (a carousel of resizes).
REGROW_HOLD_S = 60.0
# Growth starts only once no queue has wanted GPUs it may have for this long (Elastic-KubeFlow scales up on
# sustained low utilisation): GPUs idle for a moment between a release and the next job are not growth's.
# The RM's setting (RMSettings.elastic_idle_hold_s, rm.yaml elastic.idle_hold) defaults to it.
IDLE_HOLD_S = 300.0


class ElasticBook:
    """Outstanding growth asks, and the live elastic containers per node (oldest first)."""

    def __init__(self, cluster: Cluster, regrow_hold_s: float = REGROW_HOLD_S) -> None:
        self.cluster = cluster
        self.regrow_hold_s = regrow_hold_s        # rm.yaml elastic.regrow_hold
        self.growth: dict[str, Growth] = {}
        self.on_node: dict[str, dict[str, Container]] = {}
        self.shrunk_at: dict[str, float] = {}     # job id -> when growth was last taken back from it
        self.held: dict[str, int] = {}            # job id -> GPUs its live elastic containers hold
        self.idle_since: float | None = None      # since when no queue has wanted GPUs it may have
        self.idle_hold_s = IDLE_HOLD_S

    # -- upkeep
    def set_growth(self, g: Growth) -> None:
        if g.asks:
            self.growth[g.job_id] = g
        else:
            self.growth.pop(g.job_id, None)

    def drop_job(self, job_id: str) -> None:
        self.growth.pop(job_id, None)
        self.shrunk_at.pop(job_id, None)

    def may_grow(self, job_id: str, now: float) -> bool:
        return now - self.shrunk_at.get(job_id, -self.regrow_hold_s) >= self.regrow_hold_s

    def note_wanted(self, wanted: bool, now: float) -> None:
        """Whether some job wants GPUs it may have, as a pass saw it."""
        if wanted:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now

    def hold_over(self, now: float) -> bool:
        return self.idle_since is not None and now - self.idle_since >= self.idle_hold_s

    def next_growth(self, now: float) -> float | None:
        """When the idle hold ends for the growth asks waiting on it (None: no such asks, or not idle)."""
        if not self.growth or self.idle_since is None:
            return None
        at = self.idle_since + self.idle_hold_s
        return at if at > now else None

    def added(self, c: Container) -> None:
        if c.elastic:
            self.on_node.setdefault(c.node_id, {})[c.container_id] = c
            self.held[c.job_id] = self.held.get(c.job_id, 0) + c.gpus

    def ended(self, c: Container) -> None:
        held = self.on_node.get(c.node_id)
        if held is None or held.pop(c.container_id, None) is None:
            return
        if not held:
            del self.on_node[c.node_id]
        left = self.held.get(c.job_id, 0) - c.gpus
        if left > 0:
            self.held[c.job_id] = left
        else:
            self.held.pop(c.job_id, None)

    # -- questions
    def reclaimable(self, node_id: str) -> list[int]:
        """GPU indices of `node_id` held by elastic containers not yet being taken back."""
        return sorted(i for c in self.on_node.get(node_id, {}).values() if not c.stop_requested
                      for i in c.gpu_indices)

    def held_by(self, job_id: str) -> int:
        return self.held.get(job_id, 0)

    def growers(self) -> list[Growth]:
        """Jobs asking to grow, the one holding the fewest elastic GPUs first (then submit order): growth is
        shared out rather than all going to the first asker."""
        return sorted(self.growth.values(), key=lambda g: (self.held_by(g.job_id), g.seq))

    def to_take_back(self, waiting: Iterable[tuple[str, list[Ask]]], rack_of: dict[str, str]) -> list[Taken]:
        """The elastic containers to take back so that the waiting gang asks (job id, asks), in the order given,
        can be granted: on an asked node, as many as its free GPUs fall short by; for a rack or anywhere ask,
        what the rack or cluster falls short by. Newest first; containers already being stopped count as freed."""
        out: list[Taken] = []
        chosen: set[str] = set()
        for job_id, asks in waiting:
            for ask in asks:
                need = ask.gpus * max(ask.count, 1)
                if ask.node_id:
                    nodes = [ask.node_id]
                    free = self.cluster.free(ask.node_id)
                else:
                    nodes = [n for n in self.on_node if not ask.rack or rack_of.get(n) == ask.rack]
                    free = max((self.cluster.free(n) for n in nodes), default=0)
                short = need - free - sum(c.gpus for n in nodes for c in self.on_node.get(n, {}).values()
                                          if c.stop_requested or c.container_id in chosen)
                for n in nodes:
                    for c in reversed(list(self.on_node.get(n, {}).values())):
                        if short <= 0:
                            break
                        if c.stop_requested or c.container_id in chosen or c.job_id == job_id:
                            continue
                        chosen.add(c.container_id)
                        out.append(Taken(c, job_id))
                        short -= c.gpus
        return out
