"""Fair-share preemption across queues, as the core runs it: who is owed GPUs and which whole jobs are taken back
(the choice itself is `rm/sched/preemption.py`), GPUs so freed held for the starving queue until it is granted them, no
hoarding past the share (incomplete gangs' grants taken back while another queue waits), which jobs run on
borrowed GPUs, and when time-driven queue work may next come due.

Setting a job's deadlines and taking a grant back are the core's (the `preempt_job` and `revoke` callbacks); the
records are the core's (jobs, the container index, the apps with an AM state), read only here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from gpurm.common.model import Container, ContainerKind, ContainerPhase, Job, JobState
from gpurm.rm.sched import preemption, priority
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.cluster import Cluster
from gpurm.rm.state.containers import ContainerIndex
from gpurm.rm.state.queuebook import QueueBook

log = logging.getLogger(__name__)

RECLAIM_HOLD_S = 60.0     # GPUs freed by preemption count as the beneficiary's until it gets them, this long at most
RECHECK_S = 30.0          # a queue owed GPUs that nobody can spare: look again this much later
HOARD_CHECK_S = 10.0      # how soon hoarded grants are looked for while a queue waits (simulator cadence)

PreemptJobFn = Callable[[Job, preemption.Decision, float, float], None]   # (victim, decision, grace, now)
RevokeFn = Callable[[Container, str, float], None]                         # (grant, diagnostics, now)


class Reclaims:
    def __init__(self, cluster: Cluster, queues: QueueBook, jobs: dict[str, Job], index: ContainerIndex,
                 ams: AMLauncher, apps: Mapping[str, object], asking: Mapping[str, object],
                 inqueue_preemption: bool, inqueue_min_run_s: float, preempt_job: PreemptJobFn,
                 revoke: RevokeFn) -> None:
        self.cluster = cluster
        self.queues = queues
        self.jobs = jobs
        self.index = index
        self.ams = ams
        self.apps = apps                  # jobs with an AM state (a grant of one without is not hoarded)
        self.asking = asking              # apps with outstanding asks
        self.inqueue_preemption = inqueue_preemption
        self.inqueue_min_run_s = inqueue_min_run_s
        self.preempt_job = preempt_job
        self.revoke = revoke
        # GPUs preemption freed for a queue that it has not been granted yet: (GPUs, until), per queue. They keep
        # counting as reclaimed, so the queue's starvation is not answered a second time meanwhile.
        self.reclaimed: dict[str, list[tuple[int, float]]] = {}
        self.reclaiming_live: dict[str, int] = {}   # GPUs of live containers under a preemption deadline, per queue
        self._next_check: tuple[tuple[int, int, int, int], float | None] | None = None
        # Under a borrowing policy: the jobs running on borrowed GPUs (rm/sched/borrowing.py), the only ones
        # fair-share preemption takes back and the ones shown preemptible. The core sets it.
        self.borrowers: Callable[[float | None], set[str]] | None = None

    # ------------------------------------------------------------ the ledger of reclaimed GPUs

    def marked(self, beneficiary: str, gpus: int) -> None:
        """A container holding `gpus` got a preemption deadline for `beneficiary`."""
        self.reclaiming_live[beneficiary] = self.reclaiming_live.get(beneficiary, 0) + gpus

    def ended(self, c: Container, now: float) -> None:
        """A container ended: under a deadline, its GPUs are now held for the queue it was taken back for."""
        if c.preempt_deadline:
            self.reclaiming_live[c.preempted_for] = self.reclaiming_live.get(c.preempted_for, 0) - c.gpus
        if c.preempted_for:
            self.reclaimed.setdefault(c.preempted_for, []).append((c.gpus, now + RECLAIM_HOLD_S))

    def reserved(self, now: float) -> dict[str, int]:
        """GPUs preemption freed for each queue that it has not been granted yet (while the hold lasts)."""
        out = {}
        for queue, holds in self.reclaimed.items():
            gpus = sum(g for g, until in holds if until > now)
            if gpus:
                out[queue] = gpus
        return out

    def consume(self, queue: str, gpus: int) -> None:
        """The queue was granted `gpus`: that much of what was held for it is answered."""
        held = self.reclaimed.get(queue)
        while held and gpus > 0:
            g, until = held[0]
            take = min(g, gpus)
            gpus -= take
            if take == g:
                held.pop(0)
            else:
                held[0] = (g - take, until)

    # ------------------------------------------------------------ decisions

    def being_preempted(self) -> set[str]:
        """Jobs with a container under a preemption deadline."""
        containers = self.index.containers
        return {containers[cid].job_id for cid in self.index.preempting}

    def preempt(self, now: float) -> list[preemption.Decision]:
        """Start the preemptions starving queues are owed (see rm/sched/preemption.py)."""
        book = self.queues
        shares = book.shares(self.cluster.capacity)
        reclaiming = {q: g for q, g in self.reclaiming_live.items() if g > 0}
        for queue, holds in list(self.reclaimed.items()):
            holds[:] = [(g, until) for g, until in holds if until > now]
            reclaiming[queue] = reclaiming.get(queue, 0) + sum(g for g, _ in holds)
        if not preemption.owed(book, shares, now, reclaiming):
            return []                      # the usual case: nobody is owed GPUs; skip gathering candidates
        fair = book.between(shares)
        if not any(book.used.get(q.path, 0) > fair.get(q.path, 0) and q.effective_preemptible
                   for q in book.tree.leaves):
            return []                      # owed, but nobody has GPUs to spare
        holding = self.index.holding()
        busy = self.being_preempted()
        # Under a borrowing policy only borrowers are taken back: a job inside its queue's steady share never is.
        lenders = self.borrowers(now) if book.borrowing is not None and self.borrowers is not None else None
        candidates = []
        for job_id, held in holding.items():
            job = self.jobs[job_id]
            if job.state.terminal or job_id in busy or job.spec.shared:
                continue          # a share frees no whole GPU: jobs below one GPU are not taken back (docs/jobs.md)
            if lenders is not None and job_id not in lenders:
                continue
            candidates.append(preemption.Candidate(job_id, job.queue, sum(c.gpus for c in held),
                                                   max(c.created for c in held), job.seq))
        decisions = preemption.decide(book, shares, now, candidates, reclaiming, self.placement(holding))
        grace = 0.0
        for d in decisions:
            grace = book.tree.by_path[d.beneficiary].preemption.grace_s
            for v in d.victims:
                self.preempt_job(self.jobs[v.job_id], d, grace, now)
            log.info("preempting %s (%d GPUs) for %s: %s", ", ".join(v.job_id for v in d.victims), d.gpus,
                     d.beneficiary, d.reason)
        return decisions

    def placement(self, holding: Mapping[str, list[Container]]) -> preemption.Placement:
        """Where the GPUs are, for placement-aware preemption: the servers on offer with their idle GPUs, where each
        job holding GPUs holds them, and each queue's jobs that have an AM but run nothing (submit order) with the
        GPUs they still need and their AM's locality level."""
        cluster = self.cluster
        servers = [priority.Room(n.node_id, n.ib_domain or n.rack, n.healthy_gpus, cluster.free(n.node_id))
                   for n in cluster.nodes.values() if n.offering]
        held: dict[str, dict[str, int]] = {}
        for job_id, containers in holding.items():
            where = held[job_id] = {}
            for c in containers:
                where[c.node_id] = where.get(c.node_id, 0) + c.gpus
        waiting: dict[str, list[preemption.Waiter]] = {}
        running = self.index.learners_live
        for queue, members in self.ams.with_am_by_queue.items():
            out: list[preemption.Waiter] = []
            for job_id in members:
                job = self.jobs.get(job_id)
                if job is None or job.state.terminal or job_id in running:
                    continue
                need = job.spec.gpus - sum(held.get(job_id, {}).values())
                if need > 0:
                    attempt = job.current_attempt
                    out.append(preemption.Waiter(job_id, need, attempt.level if attempt is not None else ""))
            if out:
                waiting[queue] = sorted(out, key=lambda w: self.jobs[w.job_id].seq)
        return preemption.Placement(servers, held, waiting)

    def launched(self, c: Container) -> bool:
        """Whether the AM has already launched this grant as a learner (it says so before the agent does): the
        gang is complete, so taking the grant back would fail an attempt that hoards nothing."""
        attempt = self.jobs[c.job_id].current_attempt
        return attempt is not None and any(lr.container_id == c.container_id for lr in attempt.learners)

    def revoke_hoarded(self, now: float) -> list[str]:
        """No hoarding past the share: while a queue waits below its instantaneous share, grants that an
        incomplete gang holds (never started) in a queue above its share are taken back, newest first, down to
        the share. The AM sees them end and asks again; the scheduler will not re-grant them meanwhile."""
        book = self.queues
        shares = book.shares(self.cluster.capacity)
        inst = book.between(shares)
        waiting = sorted(book.short(shares))
        if not waiting:
            return []
        revoked: list[str] = []
        hoarding: dict[str, list[Container]] = {}      # per queue: grants never started (`unstarted` holds them)
        containers = self.index.containers
        for cid in self.index.unstarted:
            c = containers[cid]
            job = self.jobs[c.job_id]
            if c.kind is ContainerKind.LEARNER and c.phase is ContainerPhase.ALLOCATED and not c.pid \
                    and c.job_id in self.apps and job.state is not JobState.RUNNING and not self.launched(c):
                hoarding.setdefault(job.queue, []).append(c)
        for q in book.tree.leaves:
            excess = book.used.get(q.path, 0) - inst.get(q.path, 0)
            if excess <= 0 or waiting == [q.path]:
                continue
            held = hoarding.get(q.path, [])
            for c in sorted(held, key=lambda c: (-c.created, c.container_id)):
                if excess <= 0:
                    break
                others = ", ".join(p.removeprefix("root.") for p in waiting if p != q.path)
                self.revoke(c, f"grant taken back: its gang was incomplete while queue {q.short} was above its fair "
                               f"share and {others} waited", now)
                excess -= c.gpus
                revoked.append(c.container_id)
        return revoked

    def preemptible_jobs(self) -> set[str]:
        """Jobs running on borrowed GPUs: in each preemptible leaf, the newest jobs whose GPUs take the queue
        above its steady share (under a borrowing policy, its borrowers: rm/sched/borrowing.py)."""
        if self.queues.borrowing is not None and self.borrowers is not None:
            return self.borrowers(None)
        steady = self.queues.shares(self.cluster.capacity).steady
        by_queue: dict[str, list[tuple[Job, int]]] = {}
        for job_id, held in self.index.holding().items():
            job = self.jobs[job_id]
            if not job.state.terminal:
                by_queue.setdefault(job.queue, []).append((job, sum(c.gpus for c in held)))
        out: set[str] = set()
        for queue, jobs in by_queue.items():
            leaf = self.queues.tree.by_path.get(queue)
            if leaf is None or not leaf.effective_preemptible:
                continue
            used = 0
            for job, gpus in sorted(jobs, key=lambda jg: (jg[0].start_time or float("inf"), jg[0].seq)):
                used += gpus
                if used > steady.get(queue, 0):
                    out.add(job.job_id)
        return out

    # ------------------------------------------------------------ time

    def jobs_waiting_with_am(self) -> bool:
        """Whether some job has an AM but runs nothing (it may outrank a running job of its queue, even while its
        AM, seeing no room, asks for nothing)."""
        holding = self.index.learners_live
        return any(j not in holding for j in self.ams.with_am)

    def next_check(self, now: float) -> float | None:
        """When time-driven queue work (a starvation timeout running out, a preemption deadline, revoking a
        hoarded gang, in-queue ranks changing) may next come due; None when nothing can. The daemon ticks every
        second anyway; the simulator sleeps until then."""
        book = self.queues
        signature = (book.version, sum(self.reclaiming_live.values()), len(self.asking), len(self.ams.with_am))
        cached = self._next_check
        if cached is not None and cached[0] == signature and (cached[1] is None or cached[1] > now):
            return cached[1]
        shares = book.shares(self.cluster.capacity)
        preemption.update_starvation(book, shares, now)
        inst = book.between(shares)
        # Only queues above their share can lose GPUs; while none is, nothing can be taken back (and any change
        # of usage brings this function back anyway).
        spare = any(book.used.get(q.path, 0) > inst.get(q.path, 0) and q.effective_preemptible
                    for q in book.tree.leaves)
        due: list[float] = []
        for q in book.tree.leaves:
            s = book.starvation.get(q.path)
            if s is None or not spare:
                continue
            p = q.preemption
            for since, timeout in ((s.min_since, p.min_share_timeout_s), (s.fair_since, p.fair_share_timeout_s)):
                if since is not None and timeout is not None:
                    at = since + timeout
                    due.append(at if at > now else now + RECHECK_S)   # owed already: look again later
        if any(g > 0 for g in self.reclaiming_live.values()):
            containers = self.index.containers
            due.append(min((containers[cid].preempt_deadline for cid in self.index.preempting),
                           default=now + RECHECK_S))
        if book.short(shares) and self.index.unstarted:
            due.append(now + HOARD_CHECK_S)      # an incomplete gang holds grants that may be hoarded
        if (self.inqueue_preemption or book.borrowing is not None) and (self.asking or self.jobs_waiting_with_am()):
            due.append(now + max(self.inqueue_min_run_s / 2, HOARD_CHECK_S))
        when = max(min(due), now + 1e-6) if due else None
        self._next_check = (signature, when)
        return when
