"""Scheduling passes as the RM core runs them: which apps a pass looks at (all after GPUs came free, else only
those whose asks changed), the pass itself (rm/sched/scheduler.py), grants recorded as learner containers for the
AMs' next replies, and elastic growth on GPUs nobody wants or taken back for who waits (rm/sched/elastic.py).
Functions of the core (rm/state/core.py's RMCore, which calls them); pure, `now` passed in."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpurm.common.model import (
    Container,
    ContainerKind,
    JobState,
)
from gpurm.rm.sched.scheduler import Ask, Grant
from gpurm.rm.state.cluster import Node, pick_gpus

if TYPE_CHECKING:
    from gpurm.rm.state.core import RMCore

log = logging.getLogger(__name__)


def schedule(core: RMCore, now: float) -> list[Grant]:
    """A scheduling pass, when anything it could act on changed (asks, freed GPUs, nodes, limits, the
    clock for las/srtf ranks); then elastic jobs grow on what nobody waits for, or shrink for who waits; then the
    backfill walk reserves for the jobs first in line that no placement fits, and tells those whose reservations
    are ready to plan now."""
    grants = core._schedule_gangs(now)
    core.queues.track_guarantees(now)
    if core.elastic.growth or core.elastic.on_node:
        grants += core._elastic_pass(now)
    else:
        core.elastic.idle_since = None   # unwatched: the idle hold starts again at the next growth ask
    core.backfill(now)
    return grants


def schedule_gangs(core: RMCore, now: float) -> list[Grant]:
    if core.pass_due or core.cluster.releases != core._seen_releases:
        core._seen_releases = core.cluster.releases
        targeted = False
        apps = [a.app for a in core.asking.values() if a.registered and a.app.asks]
    elif core.new_askers:
        targeted = True
        apps = [a.app for j in core.new_askers if (a := core.asking.get(j)) is not None and a.registered
                and a.app.asks]
    else:
        return []
    core.pass_due = False
    core.new_askers = {}
    if not apps:
        return []
    waiting_before = core.queues.short(core.queues.shares(core.cluster.capacity)) if targeted else set()
    if core._ranked:
        for app in apps:
            app.standing = core.standings.standing(core.jobs[app.job_id], now)
    grants = core.scheduler.schedule(apps, core._new_container_id, now, core.reclaims.reserved(now),
                                     core.inqueue.held_from(now) if core.inqueue.freed_for else None)
    for app in apps:
        if not app.asks:
            core.asking.pop(app.job_id, None)
    if targeted and grants and core.queues.short(core.queues.shares(core.cluster.capacity)) != waiting_before:
        # A queue reached its share: others may now go beyond theirs. Everybody gets another look.
        core.pass_due = True
        grants += core._schedule_gangs(now)
    for g in grants:
        core.reclaims.consume(core.jobs[g.job_id].queue, len(g.gpu_indices))
        if core.inqueue.freed_for:
            core.inqueue.granted(g.job_id, len(g.gpu_indices))
    for g in grants:
        core._record_grant(g, now)
    return grants


def record_grant(core: RMCore, g: Grant, now: float, elastic: bool = False) -> None:
    """The learner container a grant made, and the grant queued for its AM's next reply."""
    job = core.jobs[g.job_id]
    attempt = job.current_attempt
    core._add_container(Container(container_id=g.container_id, job_id=g.job_id, kind=ContainerKind.LEARNER,
                                  node_id=g.node_id, gpu_indices=list(g.gpu_indices),
                                  attempt=attempt.number if attempt else 1, created=now, user=job.user,
                                  preemptible=g.preemptible, elastic=elastic, share_milli=g.share_milli))
    app = core.apps[g.job_id]
    app.pending_grants.append(g)
    if not elastic and app.app.held_gpus >= job.spec.gpus:
        if not job.start_time and not job.spec.shared:
            # Its first gang: the one-GPU jobs' queueing is the bar starving jobs are measured against.
            core.behind.started(job.spec.gpus, now - job.submit_time)
        if g.job_id in core.reservations.by_job:
            core.reservations.release(g.job_id)  # its gang is granted: the servers may be reserved for the next


def elastic_pass(core: RMCore, now: float) -> list[Grant]:
    """Elastic jobs (rm/sched/elastic.py): while gang asks wait (not for a limit of their own), take back the
    elastic containers in their way; while none wait, grant growth asks on free GPUs."""
    waiting = [(a.app.job_id, a.app.asks) for a in sorted(core.asking.values(), key=lambda a: a.app.seq)
               if a.registered and a.app.asks and not a.app.blocked]
    if waiting:
        core.elastic.note_wanted(True, now)
        rack_of = {n: core.cluster.nodes[n].rack for n in core.elastic.on_node if n in core.cluster.nodes}
        for taken in core.elastic.to_take_back(waiting, rack_of):
            core._take_back(taken.container, taken.for_job, now)
        return []
    if any(core.reclaims.reserved(now).values()):
        core.elastic.note_wanted(True, now)
        return []                    # GPUs preemption freed for a queue are that queue's, not growth's
    budget = core.growth_budget()
    core.elastic.note_wanted(budget <= 0, now)
    if budget <= 0 or not core.elastic.hold_over(now):
        return []                    # growth takes only GPUs nobody has wanted for IDLE_HOLD_S
    grants: list[Grant] = []
    for g in core.elastic.growers():
        job = core.jobs.get(g.job_id)
        app = core.apps.get(g.job_id)
        leaf = core.queues.tree.by_path.get(g.queue)
        if job is None or app is None or not app.registered or leaf is None or job.state is not JobState.RUNNING \
                or not core.elastic.may_grow(g.job_id, now):
            continue
        for ask in g.asks:
            while ask.count > 0 and not core.queues.over_cap(leaf, g.user, ask.gpus):
                node = core._growth_node(ask)
                indices = pick_gpus(node, ask.gpus, ask.preferred) if node is not None else None
                if node is None or indices is None:
                    break
                cid = core._new_container_id(g.job_id)
                core.cluster.allocate(node.node_id, indices, cid)
                core.queues.charge(g.queue, g.user, len(indices))
                app.app.held_gpus += len(indices)
                grant = Grant(g.job_id, cid, node.node_id, indices, preemptible=True)
                core._record_grant(grant, now, elastic=True)
                grants.append(grant)
                ask.count -= 1
        g.asks = [a for a in g.asks if a.count > 0]
        core.elastic.set_growth(g)
    return grants


def growth_budget(core: RMCore) -> int:
    """How many free GPUs growth may take now: none while any queue wants GPUs it may have (unmet_demand),
    whether or not its jobs ask yet; else every free GPU."""
    return core.cluster.free_gpus if core.unmet_demand() < 0.001 else 0


def unmet_demand(core: RMCore) -> float:
    """GPUs that queues' jobs want and do not hold, less what only a max_gpus of their own holds back: per
    leaf, its demand (every unfinished job's size, an elastic job's minimum) beyond its usage less its
    growth. That counts the jobs no ask shows (queued without an AM, AMs backing off, gangs half granted),
    which would otherwise find their GPUs grown on and have to take them back."""
    growth: dict[str, float] = {}
    for job_id, gpus in core.elastic.held.items():
        job = core.jobs.get(job_id)
        if job is not None:
            growth[job.queue] = growth.get(job.queue, 0.0) + gpus
    if growth:                        # charged to the leaf and its ancestors alike
        for leaf_path, amount in list(growth.items()):
            leaf = core.queues.tree.by_path.get(leaf_path)
            for a in leaf.ancestry() if leaf is not None else ():
                if a.path != leaf_path:
                    growth[a.path] = growth.get(a.path, 0.0) + amount
    used, demand = core.queues.used, core.queues.demand
    total = 0.0
    for leaf in core.queues.tree.leaves:
        want = demand.get(leaf.path, 0.0)
        if want <= 0:
            continue
        unmet = want - (used.get(leaf.path, 0.0) - growth.get(leaf.path, 0.0))
        if unmet < 0.001:
            continue
        for q in leaf.ancestry():
            if q.max_gpus is not None:
                unmet = min(unmet, q.max_gpus - (used.get(q.path, 0.0) - growth.get(q.path, 0.0)))
        if unmet >= 0.001:            # what its own cap holds back, growth elsewhere takes nothing from
            total += unmet
    return total


def growth_node(core: RMCore, ask: Ask) -> Node | None:
    if ask.node_id:
        node = core.cluster.nodes.get(ask.node_id)
        return node if node is not None and core.cluster.free(ask.node_id) >= ask.gpus else None
    return next(iter(core.cluster.nodes_with_free(ask.gpus, ask.rack or None)), None)


def take_back(core: RMCore, c: Container, for_job: str, now: float) -> None:
    """Stop an elastic container for a waiting job, with the victim queue's preemption notice."""
    job = core.jobs.get(c.job_id)
    leaf = core.queues.tree.by_path.get(job.queue) if job is not None else None
    grace = leaf.preemption.grace_s if leaf is not None else core.settings.kill_grace_s
    reason = f"elastic GPUs taken back for {for_job}, which waits for them"
    core._order_stop(c, grace, reason)
    core.elastic.shrunk_at[c.job_id] = now
    app = core.apps.get(c.job_id)
    if app is not None:
        app.preempt_ids = [*app.preempt_ids, c.container_id]
        app.preempt_deadline = now + grace
        app.preempt_reason = reason
    log.info("%s: %s", c.container_id, reason)
