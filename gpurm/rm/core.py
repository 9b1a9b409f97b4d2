"""The RM's pure core: jobs, containers, nodes, AM lifecycle and the allocate protocol.

Every method takes `now` (seconds) and returns or records decisions; nothing here reads a clock, sleeps or
touches a socket. The daemon feeds it real time and real messages, the simulator a virtual clock, the unit
tests whatever they like. Side effects the shell must carry out (launch an AM, stop a container, publish a job
event) are appended to `outbox`; records to persist are named in `dirty`, and the shell writes them to the
store before it answers the request that changed them.

RMCore is the facade the shells (rm/daemon.py, rm/service.py) and the simulator call, and the glue between the
objects it is made of, each in its own module with its own tests: the vocabulary (messages), admission, attempt
records (attempts), the node registry (nodes), the container records and indexes (containers), stop orders
(stops), AM launching (amlaunch), fair-share reclaiming across queues (reclaim), las / srtf standings (standing),
in-queue preemption (inqueue), recovery from the store (recovery) and the shell's read-only views (views).

Why it is still over 500 lines: what is left here is the sequencing that ties those objects together inside one
request (a container's end touches the index, the cluster, the queue book, the reclaim ledger, its AM's state and
its job), which must keep its order for the golden replay to stay byte for byte the same. Still to split out: the
allocate protocol and the per-AM state (`apps`), the job lifecycle (finish, kill, an AM's end and restarts) and
`tick`'s container timers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpurm.queues.tree import QueueTree, default_tree
from gpurm.rm import admission, attempts, preemption, priority, recovery, resync, views
from gpurm.rm.amlaunch import AMLauncher
from gpurm.rm.cluster import Cluster, Node, pick_gpus
from gpurm.rm.containers import ContainerIndex
from gpurm.rm.elastic import ElasticBook, Growth
from gpurm.rm.gittins import GittinsIndex
from gpurm.rm.inqueue import InQueuePreemption
from gpurm.rm.jobspec import JobSpec
from gpurm.rm.messages import (
    AllocateResult,
    AppState,
    AttemptUpdate,
    ContainerReport,
    Dirty,
    Effect,
    ErrorCode,
    HeartbeatAction,
    JobChanged,
    LaunchAM,
    NodeRegistration,
    RequestError,
    RMSettings,
)
from gpurm.rm.model import (
    Container,
    ContainerKind,
    ContainerPhase,
    ExitKind,
    ExitStatus,
    FailureKind,
    Job,
    JobState,
)
from gpurm.rm.nodes import NodeRegistry
from gpurm.rm.queuebook import QueueBook
from gpurm.rm.reclaim import RECLAIM_HOLD_S, Reclaims
from gpurm.rm.scheduler import App, Ask, Grant, Scheduler, shaped_asks, subtract_grants
from gpurm.rm.standing import Standings
from gpurm.rm.stops import StopBook, StopOrder

log = logging.getLogger(__name__)

PREEMPT_CHECK_S = 1.0     # how often starvation is checked


class RMCore:
    def __init__(self, settings: RMSettings | None = None, tree: QueueTree | None = None) -> None:
        self.settings = settings or RMSettings()
        self.cluster = Cluster()
        self.queues = QueueBook(tree or default_tree())
        # gittins: job sizes learned from finished jobs, one table for the scheduler's order and the standings.
        self.gittins = GittinsIndex()
        self.scheduler = Scheduler(self.cluster, self.queues, self.settings.las_thresholds_gpu_s, self.gittins)
        self.jobs: dict[str, Job] = {}
        # The container records and their indexes (rm/containers.py); the names below are that object's dicts.
        self.index = ContainerIndex(self._runs_changed)
        self.containers = self.index.containers
        self.by_job = self.index.by_job
        self.live = self.index.live
        self.live_by_job = self.index.live_by_job
        self.unstarted = self.index.unstarted
        self.live_ams = self.index.live_ams
        self.learners_live = self.index.learners_live
        self.preempting = self.index.preempting
        self.asking: dict[str, AppState] = {}     # apps with outstanding asks: what a scheduling pass looks at
        # Elastic jobs' growth asks and containers (rm/elastic.py).
        self.elastic = ElasticBook(self.cluster, self.settings.elastic_regrow_hold_s)
        self.elastic.idle_hold_s = self.settings.elastic_idle_hold_s
        # A full scheduling pass is due when GPUs came free or nodes / limits changed; otherwise only apps whose
        # asks changed can be granted anything, and a pass looks at those alone.
        self.pass_due = True
        self.new_askers: dict[str, None] = {}
        self._seen_releases = -1
        # Jobs in-queue preemption found GPUs for (idle ones, or ones it frees): their next allocate reply says to
        # plan now, as an AM backing off would otherwise leave them idle for minutes.
        self.nudged: dict[str, None] = {}
        self.apps: dict[str, AppState] = {}
        self._next_preempt_check = 0.0
        self.next_job_seq = 1
        self.submit_ids: dict[str, str] = {}
        self.outbox: list[Effect] = []
        self.stop_orders = StopBook()       # stop orders for the agents' streams
        self.next_container_seq = 1
        self.recovered_at = 0.0     # when this RM (re)started: AMs and grants older than that get a fresh clock
        self.resync_until = 0.0     # until then, nodes known from the store may still come back (rm/resync.py)
        self.dirty = Dirty()
        # Since this RM started (Prometheus counters; rm_scale counts false losses with them).
        self.lost_nodes = 0
        self.lost_containers = 0
        # Which jobs want an AM or have one, and where the next AMs go.
        # Nodes: registration, heartbeats, health, expiry, loss, draining.
        self.nodes = NodeRegistry(self.cluster, self._node_changed, self._launch_ams)
        self.ams = AMLauncher(self.cluster, self.queues, self.jobs, self.live_ams, self.settings.max_active_ams,
                              self.settings.max_acquiring_per_queue, self._start_am)
        # Where jobs stand for las / srtf (cached), and in-queue preemption (each queue's last look).
        self.standings = Standings(self.live_by_job, self.settings.las_thresholds_gpu_s, self.gittins)
        self.inqueue = InQueuePreemption(self.cluster, self.queues, self.scheduler, self.standings, self.jobs,
                                         self.live_by_job, self.learners_live, self.ams.with_am_by_queue, self.nudged,
                                         self.settings.inqueue_min_run_s, self._preempt_job)
        # Fair-share preemption across queues: who is owed, reclaimed GPUs held for them, hoarded grants.
        self.reclaims = Reclaims(self.cluster, self.queues, self.jobs, self.index, self.ams, self.apps, self.asking,
                                 self.settings.inqueue_preemption, self.settings.inqueue_min_run_s,
                                 self._preempt_job, self._revoke)

    # ------------------------------------------------------------ bookkeeping helpers

    def _job_changed(self, job: Job) -> None:
        self.dirty.jobs.add(job.job_id)
        self.outbox.append(JobChanged(job.job_id))

    def _node_changed(self, node_id: str) -> None:
        self.dirty.nodes.add(node_id)

    def _launch_ams(self, now: float) -> None:
        self.ams.launch(now)

    def _container_changed(self, c: Container) -> None:
        self.dirty.containers.add(c.container_id)

    def take_outbox(self) -> list[Effect]:
        out, self.outbox = self.outbox, []
        return out

    def take_dirty(self) -> Dirty:
        d, self.dirty = self.dirty, Dirty()
        return d

    def take_stops(self, node_id: str, now: float) -> list[StopOrder]:
        return self.stop_orders.take(node_id, now)

    def nodes_with_stops(self) -> list[str]:
        return self.stop_orders.nodes()

    @property
    def stops(self) -> dict[str, dict[str, StopOrder]]:
        """Stop orders not yet sent: node id -> container id -> order."""
        return self.stop_orders.pending

    def _order_stop(self, c: Container, grace_s: float, reason: str) -> None:
        c.stop_requested = True
        c.stop_reason = c.stop_reason or reason
        self._container_changed(c)
        self.stop_orders.order(StopOrder(c.node_id, c.container_id, grace_s, reason))

    def get_job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise RequestError(ErrorCode.NOT_FOUND,
                               f"job_id: no job {job_id!r}; `gpurm jobs` lists the jobs this RM knows")
        return job

    def _add_container(self, c: Container) -> None:
        self.index.add(c)
        self.elastic.added(c)
        self._container_changed(c)

    def _runs_changed(self, job_id: str) -> None:
        """A job's learners came, started or went: drop its cached runs, and look at its queue's in-queue ranks
        again (see preempt_in_queue)."""
        self.standings.runs_changed(job_id)
        job = self.jobs.get(job_id)
        if job is not None:
            self._inqueue_touch(job)

    def _inqueue_touch(self, job: Job) -> None:
        """The job's rank, run or locality level changed: its queue's next in-queue look must weigh it."""
        self.inqueue.touch(job)

    def _am_up(self, job: Job) -> None:
        self.ams.up(job)
        self._inqueue_touch(job)

    def _am_gone(self, job: Job) -> None:
        self.ams.gone(job)
        self.nudged.pop(job.job_id, None)
        self._inqueue_touch(job)

    def job_containers(self, job_id: str, live_only: bool = True) -> list[Container]:
        return self.index.of_job(job_id, live_only)

    def live_count(self, job_id: str) -> int:
        return self.index.live_count(job_id)

    # ------------------------------------------------------------ submit / kill

    def resolve_queue(self, name: str) -> str:
        return admission.resolve_queue(self.queues.tree, name)

    def submit(self, spec: JobSpec, user: str, now: float, submit_id: str = "", groups: Iterable[str] = (),
               check_acl: bool = True) -> Job:
        if submit_id and submit_id in self.submit_ids:
            return self.jobs[self.submit_ids[submit_id]]
        queue = admission.admit(self.queues.tree, spec, user, groups, self.cluster.total_gpus, check_acl)
        seq = self.next_job_seq
        self.next_job_seq += 1
        self.dirty.meta = True
        job = Job(job_id=f"job-{seq}", spec=spec, user=user, queue=queue, submit_time=now, seq=seq,
                  submit_id=submit_id, waiting_reason="waiting for its AM to start", idle_since=now)
        self.jobs[job.job_id] = job
        if submit_id:
            self.submit_ids[submit_id] = job.job_id
        self.queues.want(queue, spec.gpu_amount)
        self.ams.want(job)
        self._job_changed(job)
        self.ams.launch(now)
        return job

    def may_kill(self, job: Job, user: str, groups: Iterable[str] = (), rm_admin: bool = False) -> bool:
        """The job's owner, its queue's admins and the RM's admins may kill it."""
        return admission.may_kill(self.queues.tree, job, user, groups, rm_admin)

    def kill(self, job_id: str, user: str, reason: str, now: float, groups: Iterable[str] = (),
             rm_admin: bool = False) -> Job:
        job = self.get_job(job_id)
        if not self.may_kill(job, user, groups, rm_admin):
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"{user} may not kill {job_id}: only its owner ({job.user}), the admins of queue "
                               f"{job.queue.removeprefix('root.')} and RM admins may")
        if job.state.terminal:
            return job
        job.kill_requested = True
        why = f"killed by {user}" + (f": {reason}" if reason else "")
        attempt = job.current_attempt
        if attempt is not None and not attempt.state.terminal:
            attempt.state = JobState.KILLED
            attempt.failure = FailureKind.KILLED
            attempt.cause = why
            attempt.end_time = now
        self._finish_job(job, JobState.KILLED, why, now)
        return job

    def _finish_job(self, job: Job, state: JobState, diagnostics: str, now: float, exit_code: int = 0) -> None:
        job.state = state
        job.finish_time = now
        job.diagnostics = diagnostics
        job.exit_code = exit_code
        job.waiting_reason = ""
        if state in (JobState.SUCCEEDED, JobState.FAILED):
            self._learn_size(job, now)
        self.queues.want(job.queue, -job.spec.gpu_amount)
        self.standings.forget(job.job_id)
        if self.inqueue.drop_holds(job.job_id):
            self.pass_due = True             # what was held for it may go to others now
        if job.admitted:
            self.queues.activate(job.queue, -1)
        self.ams.drop(job)
        self._am_gone(job)
        app = self.apps.pop(job.job_id, None)
        self.asking.pop(job.job_id, None)
        self.elastic.drop_job(job.job_id)
        if app is not None:
            app.app.asks = []
        for c in self.job_containers(job.job_id):
            # The AM of a job that finished normally exits by itself; everything else is stopped now.
            if c.kind is ContainerKind.AM and job.final_reported:
                continue
            # A grant not yet seen running may be starting right now (the AM launches before the agent says
            # so): its GPUs stay held until the agent reports it, or the start timeout takes it back.
            self._order_stop(c, self.settings.kill_grace_s, diagnostics or state.name.lower())
        self._job_changed(job)

    def _learn_size(self, job: Job, now: float) -> None:
        """gittins learns job sizes from jobs that ended on their own: the GPU-seconds it attained, its learners
        still running counted to now. A rebuilt table moves ranks: every queue's in-queue look is weighed afresh."""
        live = sum(c.gpus * (now - c.started) for c in self.live_by_job.get(job.job_id, {}).values()
                   if c.kind is ContainerKind.LEARNER and c.started)
        if self.gittins.finished(job.attained_gpu_s + live):
            self.inqueue.clear()

    @staticmethod
    def _never_started(c: Container) -> bool:
        return c.kind is ContainerKind.LEARNER and c.phase is ContainerPhase.ALLOCATED and not c.pid

    # ------------------------------------------------------------ AM launching

    def queued_reason(self, job: Job) -> str:
        """Why a job has no AM yet."""
        return self.ams.queued_reason(job)

    def _start_am(self, job: Job, node_id: str, now: float) -> None:
        self.ams.drop(job)
        self._am_up(job)
        if not job.admitted:
            job.admitted = True
            self.queues.activate(job.queue, 1)
        job.am_attempt += 1
        c = Container(container_id=f"{job.job_id}-am{job.am_attempt}", job_id=job.job_id,
                      kind=ContainerKind.AM, node_id=node_id, gpu_indices=[], attempt=job.am_attempt,
                      created=now, user=job.user)
        self._add_container(c)
        job.am_container = c.container_id
        job.am_node = node_id
        if job.state is JobState.QUEUED:
            job.waiting_reason = f"starting its AM on {node_id}"
        self._job_changed(job)
        self.outbox.append(LaunchAM(job.job_id, c.container_id, node_id, job.am_attempt))

    def _set_waiting(self, job: Job, reason: str) -> None:
        if job.waiting_reason != reason:
            job.waiting_reason = reason
            self._job_changed(job)

    def am_launch_failed(self, container_id: str, reason: str, now: float, agent_unreachable: bool = False,
                         job_fault: bool = False) -> None:
        """The shell could not start an AM container (agent unreachable, refused the token ...). An unreachable
        agent is the node's fault, not the job's: the node gets no AM until it is heard from again, and the
        failure does not count against the job's AM launch retries. `job_fault`: the agent refused the job itself
        (its user may not run there): the job fails at once, no retry can help."""
        c = self.containers.get(container_id)
        if c is None or not c.phase.live:
            return
        node = self.cluster.nodes.get(c.node_id)
        if agent_unreachable and node is not None:
            if node.unreachable_since is None:
                log.warning("node %s: agent unreachable (%s); no AM goes there until it is heard from", node.node_id,
                            reason)
            node.unreachable_since = now
            job = self.jobs.get(c.job_id)
            if job is not None and not job.state.terminal:
                job.am_launch_failures -= 1      # _am_ended counts it; this one was not the job's doing
        self._complete(c, ExitStatus(ExitKind.FAILED_TO_START, diagnostics=reason, infra=not job_fault), now)

    def _am_ended(self, job: Job, c: Container, now: float) -> None:
        if job.am_container == c.container_id:
            job.am_container = ""
            self._am_gone(job)
        self.apps.pop(job.job_id, None)
        self.asking.pop(job.job_id, None)
        self.elastic.drop_job(job.job_id)
        if job.state.terminal or job.final_reported:
            return
        if c.attempt not in job.am_registered:
            if c.exit.kind is ExitKind.FAILED_TO_START and not c.exit.infra:
                self._fail_job(job, f"its AM could not start: {c.exit.describe()}", now, FailureKind.AM)
                return
            job.am_launch_failures += 1
            if job.am_launch_failures >= self.settings.am_launch_retries:
                self._fail_job(job, f"could not start the AM {job.am_launch_failures} times; last: "
                                    f"{c.exit.describe()}", now, FailureKind.AM)
                return
            log.warning("AM %s of %s did not come up (%s); retrying", c.container_id, job.job_id,
                        c.exit.describe())
            job.waiting_reason = f"its AM did not start ({c.exit.describe()}); retrying"
        elif len(job.am_registered) >= self.settings.am_max_attempts:
            self._fail_job(job, f"the AM failed {len(job.am_registered)} times; last: {c.exit.describe()}",
                           now, FailureKind.AM)
            return
        else:
            # A new AM adopts the learners that still run (work-preserving AM restart).
            log.warning("AM of %s ended (%s); starting AM attempt %d", job.job_id, c.exit.describe(),
                        job.am_attempt + 1)
            job.waiting_reason = f"AM attempt {job.am_attempt} ended ({c.exit.describe()}); restarting the AM"
        self.ams.want(job)
        self._job_changed(job)
        self.ams.launch(now)

    def _fail_job(self, job: Job, why: str, now: float, kind: FailureKind) -> None:
        attempt = job.current_attempt
        if attempt is not None and not attempt.state.terminal:
            attempt.state = JobState.FAILED
            attempt.failure = kind
            attempt.cause = why
            attempt.end_time = now
            attempt.counts_as_failure = True
        self._finish_job(job, JobState.FAILED, why, now, exit_code=0)

    # ------------------------------------------------------------ nodes

    def register_node(self, reg: NodeRegistration, session: str, now: float) -> list[StopOrder]:
        """Add or re-add a node; reconcile what it runs with the RM's records. Returns containers to stop."""
        node = self.nodes.admit(reg, session, now, self.index.on_node(reg.node_id))
        stops: list[StopOrder] = []
        reported = {r.container_id for r in reg.containers}
        for r in reg.containers:
            stop = self._apply_report(node, r, now)
            if stop is not None:
                stops.append(stop)
        for c in self.index.on_node(reg.node_id):
            if c.container_id in reported:
                continue
            if c.phase is ContainerPhase.RUNNING or c.started:
                self._complete(c, ExitStatus(ExitKind.LOST, diagnostics=f"agent on {reg.node_id} restarted "
                                             "without it", infra=True), now)
        self.stop_orders.drop_node(reg.node_id)
        for c in self.index.on_node(reg.node_id):
            if c.stop_requested:
                stops.append(StopOrder(c.node_id, c.container_id, self.settings.kill_grace_s, c.stop_reason))
        log.info("node %s registered (%s:%d, rack %s, %d GPUs, %d containers)", reg.node_id, reg.host, reg.port,
                 node.rack, len(node.gpus), len(reg.containers))
        self.ams.launch(now)
        return stops

    def node_heartbeat(self, node_id: str, session: str, reports: Iterable[ContainerReport], now: float,
                       healthy: bool = True, health_report: str = "",
                       gpu_health: Iterable[tuple[int, bool, str]] = ()) -> HeartbeatAction:
        node = self.nodes.beat(node_id, session, now, healthy, health_report, gpu_health)
        if node is None:
            return HeartbeatAction.REREGISTER
        for r in reports:
            stop = self._apply_report(node, r, now)
            if stop is not None:
                self.stop_orders.order(stop)
        return HeartbeatAction.OK

    def _apply_report(self, node: Node, r: ContainerReport, now: float) -> StopOrder | None:
        c = self.containers.get(r.container_id)
        if c is None or c.node_id != node.node_id:
            if r.live:
                return StopOrder(node.node_id, r.container_id, 0.0, "the RM does not know this container")
            return None
        if not c.phase.live:
            if r.live:
                return StopOrder(node.node_id, r.container_id, 0.0, c.stop_reason or "container already ended")
            return None
        if r.live:
            if r.state == "RUNNING" and c.phase is not ContainerPhase.RUNNING:
                c.phase = ContainerPhase.RUNNING
                self.unstarted.pop(c.container_id, None)
                self._note_run_start(c, now)
                c.started = now
                self._runs_changed(c.job_id)
                c.pid = r.pid
                self._container_changed(c)
                self._update_learner(c)
            return None
        if r.state == "FAILED_TO_START":
            # An AM the agent refused for the job's own sake (its user may not run there) is the job's fault.
            # A learner the agent could not start is the node's fault unless the agent saw the job's own
            # (command not found, workdir missing): that one fails the job instead of moving it elsewhere.
            infra = (r.infra_failure or c.kind is not ContainerKind.AM) and not r.user_error
            exit_status = ExitStatus(ExitKind.FAILED_TO_START, diagnostics=r.diagnostics, infra=infra,
                                     user_error=r.user_error)
        elif r.state == "LOST":
            exit_status = ExitStatus(ExitKind.LOST, diagnostics=r.diagnostics, infra=True)
        else:
            kind = ExitKind.STOPPED if (r.stopped or c.stop_requested) else ExitKind.EXITED
            exit_status = ExitStatus(kind, r.exit_code, r.signal, r.diagnostics, r.infra_failure,
                                     user_error=r.user_error and kind is ExitKind.EXITED)
        if not c.started:
            c.started = now
        self._complete(c, exit_status, now)
        return None

    def _note_run_start(self, c: Container, now: float) -> None:
        """A job's first learner to start after it ran nothing: if the LAS starvation guard is what let it run,
        its service counts afresh from here (the promotion sticks; see `priority`)."""
        job = self.jobs.get(c.job_id)
        if job is None or c.kind is not ContainerKind.LEARNER or any(
                x.started for x in self.live_by_job.get(c.job_id, {}).values()
                if x.kind is ContainerKind.LEARNER and x is not c):
            return
        served = job.attained_gpu_s - job.las_base_gpu_s
        if priority.las_promoted(now, job.idle_since, served, job.spec.gpus, self.settings.las_thresholds_gpu_s):
            job.las_base_gpu_s = job.attained_gpu_s          # (the standing caches key on it)
            self.dirty.jobs.add(job.job_id)

    def expire_nodes(self, now: float) -> list[str]:
        # After a restart, a node the store knew has until `resync_until` to register again (rm/resync.py):
        # a big fleet's agents come back over a spread, and none of them is lost for being in its tail.
        lost = self.nodes.late(now, self.settings.heartbeat_interval_s * self.settings.missed_beats,
                               now < self.resync_until)
        for node_id in lost:
            self.mark_node_lost(node_id, f"missed {self.settings.missed_beats} heartbeats", now)
        return lost

    def mark_node_lost(self, node_id: str, why: str, now: float) -> None:
        self.nodes.lose(node_id, why)
        self.lost_nodes += 1
        self.stop_orders.drop_node(node_id)
        for c in self.index.on_node(node_id):
            self._complete(c, ExitStatus(ExitKind.LOST, diagnostics=f"node {node_id} lost ({why})", infra=True),
                           now)

    def drain(self, node_id: str, undrain: bool, now: float) -> Node:
        return self.nodes.drain(node_id, undrain)

    # ------------------------------------------------------------ containers

    def _complete(self, c: Container, exit_status: ExitStatus, now: float) -> None:
        if not c.phase.live:
            return
        c.phase = ContainerPhase.COMPLETED
        c.finished = now
        c.exit = exit_status
        if exit_status.kind is ExitKind.LOST:
            self.lost_containers += 1
        self.index.unindex_live(c)
        if c.gpus:
            self.pass_due = True
        self.cluster.release(c.node_id, c.gpu_indices, c.container_id)
        self.elastic.ended(c)
        job_of = self.jobs.get(c.job_id)
        if c.kind is ContainerKind.LEARNER and job_of is not None:
            self.queues.charge(job_of.queue, job_of.user, -c.amount)
        self.reclaims.ended(c, now)
        if c.preempt_deadline and c.gpus and self.inqueue.rooms_under_way:
            self.inqueue.freed(c.job_id, c.gpus, now + RECLAIM_HOLD_S)
        self._container_changed(c)
        self.stop_orders.ended(c.container_id)
        job = self.jobs.get(c.job_id)
        if job is None:
            return
        if c.started and c.gpus:
            job.attained_gpu_s += max(0.0, c.finished - c.started) * c.gpus
            self.dirty.jobs.add(job.job_id)
        if c.kind is ContainerKind.AM:
            self._am_ended(job, c, now)
        else:
            self._update_learner(c)
            app = self.apps.get(job.job_id)
            if app is not None:
                app.app.held_gpus = max(0, app.app.held_gpus - c.gpus)
                # Reclaimed before the AM ever saw the grant: just drop the grant.
                before = len(app.pending_grants)
                app.pending_grants = [g for g in app.pending_grants if g.container_id != c.container_id]
                if len(app.pending_grants) == before:
                    app.completed.append(c)
        if c.kind is ContainerKind.LEARNER and c.preempt_deadline and job.state is JobState.RUNNING:
            # Its gang is broken: the job waits for its next attempt (the AM's report may come later).
            job.state = JobState.ALLOCATING
            self._job_changed(job)
        if c.kind is ContainerKind.LEARNER and not any(x.kind is ContainerKind.LEARNER
                                                         for x in self.job_containers(job.job_id)):
            job.idle_since = now
        if self.live_count(c.job_id) == 0 or job.state.terminal:
            self._job_changed(job)

    def _update_learner(self, c: Container) -> None:
        job = self.jobs.get(c.job_id)
        if job is not None and attempts.follow_container(job, c):
            self._job_changed(job)

    # ------------------------------------------------------------ the AM protocol

    def _app(self, job_id: str, am_attempt: int) -> tuple[Job, AppState]:
        job = self.get_job(job_id)
        if am_attempt != job.am_attempt:
            raise RequestError(ErrorCode.FAILED_PRECONDITION,
                               f"am_attempt: {am_attempt} is not the current AM attempt ({job.am_attempt}) of "
                               f"{job_id}; this AM must exit")
        app = self.apps.get(job_id)
        if app is None or app.am_attempt != am_attempt:
            if job.state.terminal:
                raise RequestError(ErrorCode.FAILED_PRECONDITION, f"job {job_id} is already {job.state.name}")
            held = sum(c.gpus for c in self.job_containers(job_id) if c.kind is ContainerKind.LEARNER)
            app = AppState(App(job.job_id, job.queue, job.user, job.seq, held_gpus=held), am_attempt)
            # Ends that happened while no AM state existed (an RM restart, an AM restart) are delivered now;
            # the AM ignores ends it already knows, so repeating one is harmless.
            app.completed = self._ended_learners(job)
            # Grants the AM may never have seen (the reply was lost with a former RM, or went to a former AM):
            # offered again, so it uses or releases them; an AM ignores a grant it already holds.
            app.pending_grants = self._unlaunched_grants(job)
            self.apps[job_id] = app
        return job, app

    def _unlaunched_grants(self, job: Job) -> list[Grant]:
        launched = {ln.container_id for ln in job.current_attempt.learners} if job.current_attempt else set()
        return [Grant(job.job_id, c.container_id, c.node_id, list(c.gpu_indices), c.preemptible)
                for c in self.job_containers(job.job_id)
                if self._never_started(c) and not c.stop_requested and c.container_id not in launched]

    def _ended_learners(self, job: Job) -> list[Container]:
        attempt = job.current_attempt
        if attempt is None:
            return []
        found = (self.containers.get(ln.container_id) for ln in attempt.learners)
        return [c for c in found if c is not None and not c.phase.live]

    def register_am(self, job_id: str, am_attempt: int, now: float) -> tuple[Job, list[Container]]:
        """Register the job's current AM. Returns the job and its learner containers: those still running (to
        adopt) and those of the current attempt that ended (so a restarted AM learns how)."""
        job, app = self._app(job_id, am_attempt)
        if job.state.terminal:
            raise RequestError(ErrorCode.FAILED_PRECONDITION, f"job {job_id} is already {job.state.name}")
        self._mark_registered(job, app, now)
        if job.state is JobState.QUEUED:
            job.state = JobState.ALLOCATING
        job.waiting_reason = "its AM is planning a placement"
        self._job_changed(job)
        live = [c for c in self.job_containers(job_id) if c.kind is ContainerKind.LEARNER]
        return job, live + self._ended_learners(job)

    def _mark_registered(self, job: Job, app: AppState, now: float) -> None:
        app.registered = True
        app.last_seen = now
        if app.am_attempt not in job.am_registered:
            job.am_registered.append(app.am_attempt)
            self._job_changed(job)

    def allocate(self, job_id: str, am_attempt: int, response_id: int, asks: list[Ask], releases: list[str],
                 reports: list[AttemptUpdate], now: float, schedule: bool = True) -> AllocateResult:
        """Apply an AM's call and answer it. `schedule=False` leaves the scheduling pass to the caller (the
        daemon coalesces passes under load); grants made by a later pass go out with the next call."""
        job = self.get_job(job_id)
        if job.state.terminal and job.am_attempt == am_attempt:
            return AllocateResult(response_id, [], [], kill_requested=True)
        app_or_none = self.apps.get(job_id)
        if app_or_none is not None and app_or_none.am_attempt == am_attempt == job.am_attempt:
            app = app_or_none                 # the usual call: what _app would answer, without looking twice
        else:
            job, app = self._app(job_id, am_attempt)
        self._mark_registered(job, app, now)   # an AM that allocates has registered, even with a former RM
        if app.last_response is not None and response_id + 1 == app.response_id:
            return app.last_response          # a retry of the last call: same answer, nothing done twice
        if response_id != app.response_id:
            app.response_id = response_id     # the RM restarted since the AM's last call
        for cid in releases:
            self._release(job, cid, now)
        for report in reports:
            self._apply_attempt(job, report, now)
        if reports:
            # A report may name learners this RM did not know of (it restarted before the AM's report reached
            # it) whose ends it has already seen: those ends are owed to the AM too.
            queued = {c.container_id for c in app.completed} | app.delivered
            app.completed += [c for c in self._ended_learners(job) if c.container_id not in queued]
        asks = shaped_asks(asks, job.spec.gpu_share_milli)
        unseen = [(g.node_id, self.cluster.nodes[g.node_id].rack, len(g.gpu_indices)) for g in app.pending_grants]
        growth = [a for a in asks if a.elastic]
        if growth or job_id in self.elastic.growth:
            asks = [a for a in asks if not a.elastic]      # a rigid job's elastic asks are ignored
            growth = subtract_grants(growth, unseen) if growth and job.spec.elastic else []
            self.elastic.set_growth(Growth(job_id, job.queue, job.user, job.seq, growth))
            self.pass_due = self.pass_due or bool(growth)
        new_asks = subtract_grants(asks, unseen) if asks else []
        if new_asks != app.app.asks and new_asks:
            self.new_askers[job_id] = None
        app.app.asks = new_asks
        if app.app.asks:
            self.asking[job_id] = app
        else:
            self.asking.pop(job_id, None)
        if schedule:
            self.schedule(now)
        app.response_id += 1
        plan_now = job_id in self.nudged
        self.nudged.pop(job_id, None)
        result = AllocateResult(app.response_id, app.pending_grants, app.completed,
                                kill_requested=job.kill_requested, preempt_ids=app.preempt_ids,
                                preempt_deadline=app.preempt_deadline, preempt_reason=app.preempt_reason,
                                plan_now=plan_now, target_gpus=job.target_gpus)
        app.delivered.update(c.container_id for c in app.completed)
        app.pending_grants, app.completed, app.preempt_ids = [], [], []
        app.last_response = result
        return result

    def waits_for_pass(self, job_id: str) -> bool:
        """Whether the AM's last call brought asks no pass has looked at yet (its reply may wait for the next)."""
        return job_id in self.new_askers and job_id in self.asking

    def late_grants(self, job_id: str, am_attempt: int, response_id: int) -> list[Grant]:
        """Grants made since the reply `response_id` was built, moved into that reply when the AM has made no
        call since (the shell held the reply for the next pass: a new ask is answered by the pass that serves
        it, not at the AM's next poll). A retry of that call gets them too."""
        app = self.apps.get(job_id)
        if app is None or app.am_attempt != am_attempt or app.response_id != response_id \
                or app.last_response is None or not app.pending_grants:
            return []
        grants, app.pending_grants = app.pending_grants, []
        app.last_response.grants.extend(grants)
        return grants

    def _release(self, job: Job, container_id: str, now: float) -> None:
        c = self.containers.get(container_id)
        if c is None or c.job_id != job.job_id or not c.phase.live:
            return
        if c.phase is ContainerPhase.ALLOCATED and not c.pid:
            # Never seen running: free it now, and tell the agent so a racing start is refused.
            self._order_stop(c, 0.0, "released by its AM")
            self._complete(c, ExitStatus(ExitKind.RELEASED), now)
            app = self.apps.get(job.job_id)
            if app is not None:
                app.completed = [x for x in app.completed if x.container_id != container_id]
            return
        self._order_stop(c, self.settings.kill_grace_s, "released by its AM")

    def _apply_attempt(self, job: Job, report: AttemptUpdate, now: float) -> None:
        applied, moved = attempts.apply_report(job, report, self.containers, self.cluster.nodes, now)
        if moved:
            self._inqueue_touch(job)         # its locality level decides what room helps it
        if applied:
            self._job_changed(job)

    def finish_am(self, job_id: str, am_attempt: int, final: JobState, diagnostics: str, exit_code: int,
                  reports: list[AttemptUpdate], now: float) -> Job:
        job = self.get_job(job_id)
        if job.state.terminal:
            return job
        if am_attempt != job.am_attempt:
            raise RequestError(ErrorCode.FAILED_PRECONDITION,
                               f"am_attempt: {am_attempt} is not the current AM attempt of {job_id}")
        if not final.terminal:
            raise RequestError(ErrorCode.INVALID_ARGUMENT,
                               f"final_state: must be SUCCEEDED, FAILED or KILLED, got {final.name}")
        for report in reports:
            self._apply_attempt(job, report, now)
        job.final_reported = True
        self._finish_job(job, final, diagnostics, now, exit_code)
        return job

    # ------------------------------------------------------------ scheduling and time

    def schedule(self, now: float) -> list[Grant]:
        """A scheduling pass, when anything it could act on changed (asks, freed GPUs, nodes, limits, the
        clock for las/srtf ranks); then elastic jobs grow on what nobody waits for, or shrink for who waits."""
        grants = self._schedule_gangs(now)
        if self.elastic.growth or self.elastic.on_node:
            grants += self._elastic_pass(now)
        else:
            self.elastic.idle_since = None   # unwatched: the idle hold starts again at the next growth ask
        return grants

    def _schedule_gangs(self, now: float) -> list[Grant]:
        if self.pass_due or self.cluster.releases != self._seen_releases:
            self._seen_releases = self.cluster.releases
            targeted = False
            apps = [a.app for a in self.asking.values() if a.registered and a.app.asks]
        elif self.new_askers:
            targeted = True
            apps = [a.app for j in self.new_askers if (a := self.asking.get(j)) is not None and a.registered
                    and a.app.asks]
        else:
            return []
        self.pass_due = False
        self.new_askers = {}
        if not apps:
            return []
        waiting_before = self.queues.waiting(self.queues.shares(self.cluster.capacity)) if targeted else set()
        if self._ranked:
            for app in apps:
                app.standing = self.standings.standing(self.jobs[app.job_id], now)
        grants = self.scheduler.schedule(apps, self._new_container_id, now, self.reclaims.reserved(now),
                                         self.inqueue.held_from(now) if self.inqueue.freed_for else None)
        for app in apps:
            if not app.asks:
                self.asking.pop(app.job_id, None)
        if targeted and grants and self.queues.waiting(self.queues.shares(self.cluster.capacity)) != waiting_before:
            # A queue reached its share: others may now go beyond theirs. Everybody gets another look.
            self.pass_due = True
            grants += self._schedule_gangs(now)
        for g in grants:
            self.reclaims.consume(self.jobs[g.job_id].queue, len(g.gpu_indices))
            if self.inqueue.freed_for:
                self.inqueue.granted(g.job_id, len(g.gpu_indices))
        for g in grants:
            self._record_grant(g, now)
        return grants

    def _record_grant(self, g: Grant, now: float, elastic: bool = False) -> None:
        """The learner container a grant made, and the grant queued for its AM's next reply."""
        job = self.jobs[g.job_id]
        attempt = job.current_attempt
        self._add_container(Container(container_id=g.container_id, job_id=g.job_id, kind=ContainerKind.LEARNER,
                                      node_id=g.node_id, gpu_indices=list(g.gpu_indices),
                                      attempt=attempt.number if attempt else 1, created=now, user=job.user,
                                      preemptible=g.preemptible, elastic=elastic, share_milli=g.share_milli))
        self.apps[g.job_id].pending_grants.append(g)

    def _elastic_pass(self, now: float) -> list[Grant]:
        """Elastic jobs (rm/elastic.py): while gang asks wait (not for a limit of their own), take back the
        elastic containers in their way; while none wait, grant growth asks on free GPUs."""
        waiting = [(a.app.job_id, a.app.asks) for a in sorted(self.asking.values(), key=lambda a: a.app.seq)
                   if a.registered and a.app.asks and not a.app.blocked]
        if waiting:
            self.elastic.note_wanted(True, now)
            rack_of = {n: self.cluster.nodes[n].rack for n in self.elastic.on_node if n in self.cluster.nodes}
            for taken in self.elastic.to_take_back(waiting, rack_of):
                self._take_back(taken.container, taken.for_job, now)
            return []
        if any(self.reclaims.reserved(now).values()):
            self.elastic.note_wanted(True, now)
            return []                    # GPUs preemption freed for a queue are that queue's, not growth's
        budget = self.growth_budget()
        self.elastic.note_wanted(budget <= 0, now)
        if budget <= 0 or not self.elastic.hold_over(now):
            return []                    # growth takes only GPUs nobody has wanted for IDLE_HOLD_S
        grants: list[Grant] = []
        for g in self.elastic.growers():
            job = self.jobs.get(g.job_id)
            app = self.apps.get(g.job_id)
            leaf = self.queues.tree.by_path.get(g.queue)
            if job is None or app is None or not app.registered or leaf is None or job.state is not JobState.RUNNING \
                    or not self.elastic.may_grow(g.job_id, now):
                continue
            for ask in g.asks:
                while ask.count > 0 and not self.queues.over_cap(leaf, g.user, ask.gpus):
                    node = self._growth_node(ask)
                    indices = pick_gpus(node, ask.gpus, ask.preferred) if node is not None else None
                    if node is None or indices is None:
                        break
                    cid = self._new_container_id(g.job_id)
                    self.cluster.allocate(node.node_id, indices, cid)
                    self.queues.charge(g.queue, g.user, len(indices))
                    app.app.held_gpus += len(indices)
                    grant = Grant(g.job_id, cid, node.node_id, indices, preemptible=True)
                    self._record_grant(grant, now, elastic=True)
                    grants.append(grant)
                    ask.count -= 1
            g.asks = [a for a in g.asks if a.count > 0]
            self.elastic.set_growth(g)
        return grants

    def growth_budget(self) -> int:
        """How many free GPUs growth may take now: none while any queue wants GPUs it may have (unmet_demand),
        whether or not its jobs ask yet; else every free GPU."""
        return self.cluster.free_gpus if self.unmet_demand() < 0.001 else 0

    def unmet_demand(self) -> float:
        """GPUs that queues' jobs want and do not hold, less what only a max_gpus of their own holds back: per
        leaf, its demand (every unfinished job's size, an elastic job's minimum) beyond its usage less its
        growth. That counts the jobs no ask shows (queued without an AM, AMs backing off, gangs half granted),
        which would otherwise find their GPUs grown on and have to take them back."""
        growth: dict[str, float] = {}
        for job_id, gpus in self.elastic.held.items():
            job = self.jobs.get(job_id)
            if job is not None:
                growth[job.queue] = growth.get(job.queue, 0.0) + gpus
        if growth:                        # charged to the leaf and its ancestors alike
            for leaf_path, amount in list(growth.items()):
                leaf = self.queues.tree.by_path.get(leaf_path)
                for a in leaf.ancestry() if leaf is not None else ():
                    if a.path != leaf_path:
                        growth[a.path] = growth.get(a.path, 0.0) + amount
        used, demand = self.queues.used, self.queues.demand
        total = 0.0
        for leaf in self.queues.tree.leaves:
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

    def _growth_node(self, ask: Ask) -> Node | None:
        if ask.node_id:
            node = self.cluster.nodes.get(ask.node_id)
            return node if node is not None and self.cluster.free(ask.node_id) >= ask.gpus else None
        return next(iter(self.cluster.nodes_with_free(ask.gpus, ask.rack or None)), None)

    def _take_back(self, c: Container, for_job: str, now: float) -> None:
        """Stop an elastic container for a waiting job, with the victim queue's preemption notice."""
        job = self.jobs.get(c.job_id)
        leaf = self.queues.tree.by_path.get(job.queue) if job is not None else None
        grace = leaf.preemption.grace_s if leaf is not None else self.settings.kill_grace_s
        reason = f"elastic GPUs taken back for {for_job}, which waits for them"
        self._order_stop(c, grace, reason)
        self.elastic.shrunk_at[c.job_id] = now
        app = self.apps.get(c.job_id)
        if app is not None:
            app.preempt_ids = [*app.preempt_ids, c.container_id]
            app.preempt_deadline = now + grace
            app.preempt_reason = reason
        log.info("%s: %s", c.container_id, reason)

    def scale(self, job_id: str, gpus: int, user: str, now: float, groups: Iterable[str] = (),
              rm_admin: bool = False) -> Job:
        """`gpurm scale`: set an elastic job's target size, between its minimum and maximum. Its AM grows or
        shrinks toward it on its next call."""
        job = self.get_job(job_id)
        if not self.may_kill(job, user, groups, rm_admin):
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"{user} may not scale {job_id} (only its owner or an admin of its queue)")
        if job.state.terminal:
            raise RequestError(ErrorCode.FAILED_PRECONDITION, f"{job_id} has ended ({job.state.name})")
        if not job.spec.elastic:
            raise RequestError(ErrorCode.FAILED_PRECONDITION,
                               f"{job_id} is not elastic (gpus: {job.spec.gpus}); submit with --gpus MIN:MAX")
        if not job.spec.gpus <= gpus <= job.spec.max_gpus:
            raise RequestError(ErrorCode.INVALID_ARGUMENT,
                               f"gpus: must be between the job's min {job.spec.gpus} and max {job.spec.max_gpus}, "
                               f"got {gpus}")
        job.target_gpus = gpus
        self._job_changed(job)
        return job

    def _new_container_id(self, job_id: str) -> str:
        # Unique across the RM's life: a counter persisted with the job sequence.
        self.dirty.meta = True
        cid = f"{job_id}-c{self.next_container_seq}"
        self.next_container_seq += 1
        return cid

    def tick(self, now: float) -> None:
        """Time-driven work: lost nodes, stuck AMs, grants never started, stop orders to repeat, preemption."""
        self.expire_nodes(now)
        if now >= self._next_preempt_check:
            self._next_preempt_check = now + PREEMPT_CHECK_S
            self.preempt(now)
            self.preempt_in_queue(now)
            self.revoke_hoarded(now)
            if self.inqueue.freed_for and self.inqueue.expire_holds(now):
                self.pass_due = True
        s = self.settings
        for c in list(self.live.values()):
            if not c.phase.live:
                continue
            if c.stop_requested and self._never_started(c) \
                    and now - max(c.created, self.recovered_at) > s.container_start_timeout_s:
                self._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics="stopped before it ever started"), now)
                continue
            if c.stop_requested:
                if self.stop_orders.resend_due(c.node_id, c.container_id, now, s.stop_resend_s):
                    self.stop_orders.order(StopOrder(c.node_id, c.container_id, s.kill_grace_s, c.stop_reason))
                continue
            job = self.jobs.get(c.job_id)
            if c.preempt_deadline and now >= c.preempt_deadline:
                self._order_stop(c, s.kill_grace_s, f"preempted for queue {c.preempted_for.removeprefix('root.')}")
                continue
            if c.kind is ContainerKind.LEARNER and c.phase is ContainerPhase.ALLOCATED \
                    and now - max(c.created, self.recovered_at) > s.container_start_timeout_s:
                self._order_stop(c, 0.0, "granted but never started")
                self._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=f"not started within "
                                             f"{s.container_start_timeout_s:g}s of its grant"), now)
            elif c.kind is ContainerKind.AM and job is not None and not job.state.terminal:
                app = self.apps.get(job.job_id)
                registered = app is not None and app.am_attempt == c.attempt and app.registered
                since = max(c.created, self.recovered_at)
                if not registered and now - since > s.am_register_timeout_s:
                    self._order_stop(c, 0.0, "AM did not register in time")
                    self._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=f"AM did not register within "
                                                 f"{s.am_register_timeout_s:g}s", infra=True), now)
                elif registered and app is not None and now - app.last_seen > s.am_liveness_timeout_s:
                    self._order_stop(c, 0.0, "AM stopped calling allocate")
                    self._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=f"AM silent for "
                                                 f"{s.am_liveness_timeout_s:g}s"), now)
            elif c.kind is ContainerKind.AM and job is not None and job.state.terminal \
                    and now - job.finish_time > s.kill_grace_s + s.am_liveness_timeout_s:
                self._order_stop(c, s.kill_grace_s, "job finished")
        self.ams.launch(now)

    # ------------------------------------------------------------ queues: preemption, refresh, views

    def preempt(self, now: float) -> list[preemption.Decision]:
        """Start the preemptions starving queues are owed (rm/reclaim.py, rm/preemption.py)."""
        return self.reclaims.preempt(now)

    def revoke_hoarded(self, now: float) -> list[str]:
        """Take back grants incomplete gangs hoard above their queue's share while another queue waits."""
        return self.reclaims.revoke_hoarded(now)

    def _revoke(self, c: Container, diagnostics: str, now: float) -> None:
        self._order_stop(c, 0.0, "revoked")
        self._complete(c, ExitStatus(ExitKind.EXPIRED, diagnostics=diagnostics), now)

    def next_check(self, now: float) -> float | None:
        """When time-driven queue work may next come due (see Reclaims.next_check); None when nothing can."""
        at = self.reclaims.next_check(now)
        grow = self.elastic.next_growth(now)
        return grow if grow is not None and (at is None or grow < at) else at

    def _preempt_job(self, job: Job, d: preemption.Decision, grace_s: float, now: float) -> None:
        deadline = now + grace_s
        ids = []
        for c in self.job_containers(job.job_id):
            if c.kind is ContainerKind.LEARNER and not c.preempt_deadline:
                c.preempt_deadline = deadline
                self.preempting[c.container_id] = None
                self._inqueue_touch(job)
                c.preempted_for = d.beneficiary
                self.reclaims.marked(d.beneficiary, c.gpus)
                self._container_changed(c)
                ids.append(c.container_id)
        app = self.apps.get(job.job_id)
        reason = f"preempted for queue {d.beneficiary.removeprefix('root.')}: {d.reason}"
        if app is not None:
            app.preempt_ids = ids
            app.preempt_deadline = deadline
            app.preempt_reason = reason
        job.waiting_reason = reason
        self._job_changed(job)

    def standing(self, job: Job, now: float) -> priority.Standing:
        return self.standings.standing(job, now)

    def preempt_in_queue(self, now: float) -> list[tuple[str, str]]:
        """Tiresias-style preemption inside las / srtf leaves (rm/inqueue.py); off unless
        `settings.inqueue_preemption`."""
        if not self.settings.inqueue_preemption:
            return []
        return self.inqueue.run(self.reclaims.being_preempted(), now)

    @property
    def _ranked(self) -> bool:
        """Whether any leaf orders its jobs by something that changes with time (las, srtf)."""
        override = self.scheduler.policy_override
        if override is not None:
            return priority.preemptive(override)
        return self.queues.ranked

    def _rebuild_queue_book(self) -> None:
        recovery.rebuild_queue_book(self.queues, self.jobs, self.containers)

    def replace_tree(self, tree: QueueTree) -> list[str]:
        """Adopt a new queue config, or say why not (the old one then stays in force)."""
        problems = []
        for job in self.jobs.values():
            if job.state.terminal:
                continue
            q = tree.by_path.get(job.queue)
            if q is None:
                problems.append(f"{job.queue}: removed, but job {job.job_id} ({job.state.name}) is still in it; "
                                "let its jobs finish or kill them first")
            elif not q.leaf:
                problems.append(f"{job.queue}: would become a parent queue, but job {job.job_id} is still in it")
        if problems:
            return sorted(set(problems))
        self.queues.replace_tree(tree)
        self._rebuild_queue_book()
        self.pass_due = True
        self.inqueue.clear()                 # policies may have changed
        for app in self.apps.values():
            app.app.queue = self.jobs[app.app.job_id].queue
        return []

    def queue_stats(self) -> dict[str, tuple[int, int]]:
        """Per queue (ancestors included): (running jobs, queued jobs)."""
        return views.queue_stats(self.jobs, self.queues.tree)

    def preemptible_jobs(self) -> set[str]:
        """Jobs running on borrowed GPUs (see Reclaims.preemptible_jobs)."""
        return self.reclaims.preemptible_jobs()

    # ------------------------------------------------------------ persistence

    def meta(self) -> dict[str, str]:
        return {"next_job_seq": str(self.next_job_seq), "next_container_seq": str(self.next_container_seq)}

    def restore(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
                meta: dict[str, str], now: float, learned: Iterable[float] = ()) -> None:
        """Load records written by an earlier RM. Nodes come back as they were last seen and have a full
        expiry period to re-register; AMs and grants get a fresh clock from `now`. `learned`: the job sizes
        gittins learned from jobs that left memory (rm/retention.py), in finish order."""
        self.recovered_at = now
        nodes = list(nodes)
        self.resync_until = now + resync.grace_s(self.settings, len(nodes))
        recovery.load(jobs, containers, nodes, now, self.jobs, self.submit_ids, self.index, self.cluster)
        for c in self.live.values():
            self.elastic.added(c)
        recovery.readmit(self.jobs, self.live, self.ams, self._am_up)
        self.next_job_seq, self.next_container_seq = recovery.counters(meta)
        self._rebuild_queue_book()
        # gittins relearns its job sizes from the finished jobs in the store (finish order: the same table):
        # the retired ones' first (they finished before any finished job still in memory).
        for size in learned:
            self.gittins.finished(size)
        for job in sorted(self.jobs.values(), key=lambda j: (j.finish_time, j.seq)):
            if job.state in (JobState.SUCCEEDED, JobState.FAILED):
                self.gittins.finished(job.attained_gpu_s)

    # ------------------------------------------------------------ views for the shell

    def list_jobs(self, states: Iterable[JobState] = (), queue: str = "", user: str = "",
                  limit: int = 0) -> list[Job]:
        return views.list_jobs(self.jobs, states, queue, user, limit)

    def why_waiting(self, job: Job) -> str:
        """Why an unfinished job waits: its AM's account, and the RM's when the RM holds it back."""
        return views.why_waiting(job, self.ams, self.apps)

    def gpus_held(self, job_id: str) -> int:
        return sum(c.gpus for c in self.job_containers(job_id))
