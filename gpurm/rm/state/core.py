"""The RM's pure core: `RMCore`, the facade the shells (rm/server/daemon.py, rm/server/service.py) and the simulator
call, and the state the parts below share.

Every method takes `now` (seconds) and returns or records decisions; nothing here reads a clock, sleeps or touches a
socket. The daemon feeds it real time and real messages, the simulator a virtual clock, the unit tests whatever they
like. Side effects the shell must carry out (launch an AM, stop a container, publish a job event) are appended to
`outbox`; records to persist are named in `dirty`, and the shell writes them to the store before it answers the
request that changed them.

What happens inside a request lives in the modules named for it, as functions of the core, which the methods here
call (the core keeps the shared bookkeeping: marking records dirty, stop orders, container ids):
- `lifecycle`: submit, kill, scale, a job's end, its AM's start, failure and restart;
- `agentreports`: node registration, heartbeats and container reports, a container's end, node loss;
- `allocate`: the AM protocol (registration, Allocate, finish);
- `granting`: scheduling passes and the grants they record, elastic growth;
- `timers`: `tick`'s time-driven work and what a preemption sets.
The objects the core is made of each have their own module and tests: the vocabulary (messages), admission, attempt
records (attempts), the node registry (nodes), the container records and indexes (containers), stop orders (stops), AM
launching (amlaunch), fair-share reclaiming across queues (reclaim), las / srtf standings (standing), in-queue
preemption (inqueue), recovery from the store (recovery) and the shell's read-only views (views). The order of calls
inside one request is kept exactly: the golden replays (tests/unit/test_golden*.py) stay byte for byte the same.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import (
    Container,
    ContainerKind,
    ContainerPhase,
    ExitStatus,
    FailureKind,
    Job,
    JobState,
)
from gpurm.queues.tree import Policy, QueueTree, default_tree
from gpurm.rm.sched import preemption, priority
from gpurm.rm.sched.backfill import WalkSettings
from gpurm.rm.sched.behind import Behind
from gpurm.rm.sched.borrowing import BorrowPreemption
from gpurm.rm.sched.elastic import ElasticBook
from gpurm.rm.sched.history import Finished, History
from gpurm.rm.sched.inqueue import InQueuePreemption
from gpurm.rm.sched.reclaim import Reclaims
from gpurm.rm.sched.reservations import Reservations
from gpurm.rm.sched.scheduler import Ask, Grant, Scheduler
from gpurm.rm.sched.standing import Standings
from gpurm.rm.sched.waiting import WaitingBook
from gpurm.rm.state import (
    admission,
    agentreports,
    allocate,
    backfilling,
    granting,
    lifecycle,
    recovery,
    resync,
    timers,
    views,
)
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.cluster import Cluster, Node
from gpurm.rm.state.containers import ContainerIndex
from gpurm.rm.state.heartbeats import META_KEY as BEAT_META_KEY
from gpurm.rm.state.heartbeats import BeatPacing
from gpurm.rm.state.messages import (
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
from gpurm.rm.state.nodes import NodeRegistry
from gpurm.rm.state.planview import PlanView
from gpurm.rm.state.queuebook import QueueBook
from gpurm.rm.state.stops import StopBook, StopOrder

log = logging.getLogger(__name__)

# The core's vocabulary (rm/state/messages.py) comes with it: callers import both from here.
__all__ = [
    "AllocateResult", "AppState", "AttemptUpdate", "ContainerReport", "Dirty", "Effect", "ErrorCode",
    "HeartbeatAction", "JobChanged", "LaunchAM", "NodeRegistration", "RMCore", "RMSettings", "RequestError",
]


class RMCore:
    def __init__(self, settings: RMSettings | None = None, tree: QueueTree | None = None) -> None:
        self.settings = settings or RMSettings()
        self.cluster = Cluster()
        self.queues = QueueBook(tree or default_tree())
        # What finished jobs taught (sizes, run times; the prior first): gittins' ranks, run-time estimates.
        self.history = History(self.settings.history_conditioning)
        self.history.learn_all(self.settings.history_prior)
        self.scheduler = Scheduler(self.cluster, self.queues, self.settings.las_thresholds_gpu_s, self.history)
        # Who waits for GPUs, in order; reservations for those no placement fits; the walk that tells AMs to plan
        # (rm/state/backfilling.py); the view AMs plan on, reserved GPUs apart (rm/state/planview.py).
        self.waiting = WaitingBook()
        self.reservations = Reservations(self.cluster, self._ends, self.settings.reservations)
        self.behind = Behind(self.settings.reserve_behind)      # who is starving (rm/sched/behind.py)
        self.backfill_settings = WalkSettings(self.settings.reserve_after_s)
        self.walked_at: tuple[int, int, int, int] = (-1, -1, -1, -1)
        self.told: dict[str, tuple[int, int, int]] = {}    # job -> what it was last told to plan on (backfilling.py)
        self.told_new: list[str] = []
        self.scheduler.reservations = self.reservations
        self.scheduler.expected_end = self._expected_end
        self.jobs: dict[str, Job] = {}
        # The container records and their indexes (rm/state/containers.py); the names below are that object's dicts.
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
        # Elastic jobs' growth asks and containers (rm/sched/elastic.py).
        self.elastic = ElasticBook(self.cluster, self.settings.elastic_regrow_hold_s)
        self.elastic.idle_hold_s = self.settings.elastic_idle_hold_s
        self.planview = PlanView(self.cluster, self.elastic, self.reservations)
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
        # AM launches a burst of submits left to the daemon's pass loop (settings.am_launch_coalesce_s)
        self.launch_due = False
        self.launched_at = float("-inf")
        self.next_job_seq = 1
        self.submit_ids: dict[str, str] = {}
        self.outbox: list[Effect] = []
        self.stop_orders = StopBook()       # stop orders for the agents' streams
        self.next_container_seq = 1
        self.recovered_at = 0.0     # when this RM (re)started: AMs and grants older than that get a fresh clock
        self.resync_until = 0.0     # until then, nodes known from the store may still come back (rm/state/resync.py)
        self.dirty = Dirty()
        # Since this RM started (Prometheus counters; rm_scale counts false losses with them).
        self.lost_nodes = 0
        self.lost_containers = 0
        # Which jobs want an AM or have one, and where the next AMs go.
        # Nodes: registration, heartbeats, health, expiry, loss, draining.
        self.nodes = NodeRegistry(self.cluster, self._node_changed, self._launch_ams)
        # The heartbeat interval the RM names, paced to the fleet's size, and the LOST expiry in force
        # (rm/state/heartbeats.py); the fleet is counted again only when nodes or their states changed.
        self.beats = BeatPacing(self.settings)
        self._beats_counted_at = -1
        self._beats_fleet = 0
        self.ams = AMLauncher(self.cluster, self.queues, self.jobs, self.live_ams, self.settings.max_active_ams,
                              self.settings.max_acquiring_per_queue, self._start_am)
        # Where jobs stand for las / srtf (cached), and in-queue preemption (each queue's last look).
        self.standings = Standings(self.live_by_job, self.settings.las_thresholds_gpu_s, self.history)
        self.inqueue = InQueuePreemption(self.cluster, self.queues, self.scheduler, self.standings, self.jobs,
                                         self.live_by_job, self.learners_live, self.ams.with_am_by_queue, self.nudged,
                                         self.settings.inqueue_min_run_s, self._preempt_job)
        self.inqueue.reservations = self.reservations
        # Fair-share preemption across queues: who is owed, reclaimed GPUs held for them, hoarded grants.
        self.reclaims = Reclaims(self.cluster, self.queues, self.jobs, self.index, self.ams, self.apps, self.asking,
                                 self.settings.inqueue_preemption, self.settings.inqueue_min_run_s,
                                 self._preempt_job, self._revoke)
        # Under a borrowing policy (the tree's `borrowing`): borrowers ranked cluster-wide, and preempted for
        # better-ranked waiting jobs of any queue (rm/sched/borrowing.py).
        self.borrow = BorrowPreemption(self.cluster, self.queues, self.standings, self.jobs, self.live_by_job,
                                       self.learners_live, self.ams.with_am_by_queue, self.nudged, self.inqueue.rooms,
                                       self.settings.inqueue_min_run_s, self._preempt_job)
        self.reclaims.borrowers = self.borrow.borrowers

    # ------------------------------------------------------------ bookkeeping helpers

    def _job_changed(self, job: Job) -> None:
        self.dirty.jobs.add(job.job_id)
        self.outbox.append(JobChanged(job.job_id))
        backfilling.sync_waiting(self, job)

    def _ends(self, node_id: str, now: float) -> list[tuple[float, tuple[int, ...]]]:
        return backfilling.ends(self, node_id, now)

    def expected_run_s(self, job: Job) -> float:
        return backfilling.expected_run_s(self, job)

    def _expected_end(self, job_id: str, now: float) -> float:
        job = self.jobs.get(job_id)
        return now + backfilling.expected_run_s(self, job) if job is not None else float("inf")

    def backfill(self, now: float) -> list[str]:
        """The backfill walk (rm/state/backfilling.py): the jobs told to plan now."""
        told = backfilling.backfill(self, now)
        self.told_new.extend(told)
        return told

    def take_told(self) -> list[str]:
        """The jobs the backfill walk told to plan now since the last call (the simulator drives their AMs)."""
        told, self.told_new = self.told_new, []
        return told

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

    # ------------------------------------------------------------ a job's life (lifecycle)

    def resolve_queue(self, name: str) -> str:
        return admission.resolve_queue(self.queues.tree, name)

    def submit(self, spec: JobSpec, user: str, now: float, submit_id: str = "", groups: Iterable[str] = (),
               check_acl: bool = True) -> Job:
        return lifecycle.submit(self, spec, user, now, submit_id, groups, check_acl)

    def may_kill(self, job: Job, user: str, groups: Iterable[str] = (), rm_admin: bool = False) -> bool:
        """The job's owner, its queue's admins and the RM's admins may kill it."""
        return admission.may_kill(self.queues.tree, job, user, groups, rm_admin)

    def kill(self, job_id: str, user: str, reason: str, now: float, groups: Iterable[str] = (),
             rm_admin: bool = False) -> Job:
        return lifecycle.kill(self, job_id, user, reason, now, groups, rm_admin)

    def scale(self, job_id: str, gpus: int, user: str, now: float, groups: Iterable[str] = (),
              rm_admin: bool = False) -> Job:
        return lifecycle.scale(self, job_id, gpus, user, now, groups, rm_admin)

    def _finish_job(self, job: Job, state: JobState, diagnostics: str, now: float, exit_code: int = 0) -> None:
        lifecycle.finish_job(self, job, state, diagnostics, now, exit_code)

    def _learn_size(self, job: Job, now: float) -> None:
        lifecycle.learn_size(self, job, now)

    @staticmethod
    def _never_started(c: Container) -> bool:
        return c.kind is ContainerKind.LEARNER and c.phase is ContainerPhase.ALLOCATED and not c.pid

    # ------------------------------------------------------------ AM launching

    def queued_reason(self, job: Job) -> str:
        """Why a job has no AM yet."""
        return self.ams.queued_reason(job)

    def _start_am(self, job: Job, node_id: str, now: float) -> None:
        lifecycle.start_am(self, job, node_id, now)

    def _set_waiting(self, job: Job, reason: str) -> None:
        if job.waiting_reason != reason:
            job.waiting_reason = reason
            self._job_changed(job)

    def am_launch_failed(self, container_id: str, reason: str, now: float, agent_unreachable: bool = False,
                         job_fault: bool = False) -> None:
        lifecycle.am_launch_failed(self, container_id, reason, now, agent_unreachable, job_fault)

    def _am_ended(self, job: Job, c: Container, now: float) -> None:
        lifecycle.am_ended(self, job, c, now)

    def _fail_job(self, job: Job, why: str, now: float, kind: FailureKind) -> None:
        lifecycle.fail_job(self, job, why, now, kind)

    # ------------------------------------------------------------ what agents report (agentreports)

    def register_node(self, reg: NodeRegistration, session: str, now: float) -> list[StopOrder]:
        return agentreports.register_node(self, reg, session, now)

    def node_heartbeat(self, node_id: str, session: str, reports: Iterable[ContainerReport], now: float,
                       healthy: bool = True, health_report: str = "",
                       gpu_health: Iterable[tuple[int, bool, str]] = ()) -> HeartbeatAction:
        return agentreports.node_heartbeat(self, node_id, session, reports, now, healthy, health_report, gpu_health)

    def _apply_report(self, node: Node, r: ContainerReport, now: float) -> StopOrder | None:
        return agentreports.apply_report(self, node, r, now)

    def _note_run_start(self, c: Container, now: float) -> None:
        agentreports.note_run_start(self, c, now)

    def expire_nodes(self, now: float) -> list[str]:
        # After a restart, a node the store knew has until `resync_until` to register again (rm/state/resync.py):
        # a big fleet's agents come back over a spread, and none of them is lost for being in its tail.
        return agentreports.expire_nodes(self, now)

    def mark_node_lost(self, node_id: str, why: str, now: float) -> None:
        agentreports.mark_node_lost(self, node_id, why, now)

    def drain(self, node_id: str, undrain: bool, now: float) -> Node:
        return self.nodes.drain(node_id, undrain)

    def _complete(self, c: Container, exit_status: ExitStatus, now: float) -> None:
        agentreports.complete(self, c, exit_status, now)

    def _update_learner(self, c: Container) -> None:
        agentreports.update_learner(self, c)

    # ------------------------------------------------------------ the AM protocol (allocate)

    def _app(self, job_id: str, am_attempt: int) -> tuple[Job, AppState]:
        return allocate.app(self, job_id, am_attempt)

    def _unlaunched_grants(self, job: Job) -> list[Grant]:
        return allocate.unlaunched_grants(self, job)

    def _ended_learners(self, job: Job) -> list[Container]:
        return allocate.ended_learners(self, job)

    def register_am(self, job_id: str, am_attempt: int, now: float) -> tuple[Job, list[Container]]:
        return allocate.register_am(self, job_id, am_attempt, now)

    def _mark_registered(self, job: Job, app: AppState, now: float) -> None:
        allocate.mark_registered(self, job, app, now)

    def allocate(self, job_id: str, am_attempt: int, response_id: int, asks: list[Ask], releases: list[str],
                 reports: list[AttemptUpdate], now: float, schedule: bool = True) -> AllocateResult:
        return allocate.allocate(self, job_id, am_attempt, response_id, asks, releases, reports, now, schedule)

    def waits_for_pass(self, job_id: str) -> bool:
        return allocate.waits_for_pass(self, job_id)

    def late_grants(self, job_id: str, am_attempt: int, response_id: int) -> list[Grant]:
        return allocate.late_grants(self, job_id, am_attempt, response_id)

    def _release(self, job: Job, container_id: str, now: float) -> None:
        allocate.release(self, job, container_id, now)

    def _apply_attempt(self, job: Job, report: AttemptUpdate, now: float) -> None:
        allocate.apply_attempt(self, job, report, now)

    def finish_am(self, job_id: str, am_attempt: int, final: JobState, diagnostics: str, exit_code: int,
                  reports: list[AttemptUpdate], now: float) -> Job:
        return allocate.finish_am(self, job_id, am_attempt, final, diagnostics, exit_code, reports, now)

    # ------------------------------------------------------------ scheduling passes (granting) and time (timers)

    def schedule(self, now: float) -> list[Grant]:
        return granting.schedule(self, now)

    def _schedule_gangs(self, now: float) -> list[Grant]:
        return granting.schedule_gangs(self, now)

    def _record_grant(self, g: Grant, now: float, elastic: bool = False) -> None:
        granting.record_grant(self, g, now, elastic)

    def _elastic_pass(self, now: float) -> list[Grant]:
        return granting.elastic_pass(self, now)

    def growth_budget(self) -> int:
        return granting.growth_budget(self)

    def unmet_demand(self) -> float:
        return granting.unmet_demand(self)

    def _growth_node(self, ask: Ask) -> Node | None:
        return granting.growth_node(self, ask)

    def _take_back(self, c: Container, for_job: str, now: float) -> None:
        granting.take_back(self, c, for_job, now)

    def _new_container_id(self, job_id: str) -> str:
        # Unique across the RM's life: a counter persisted with the job sequence.
        self.dirty.meta = True
        cid = f"{job_id}-c{self.next_container_seq}"
        self.next_container_seq += 1
        return cid

    def tick(self, now: float) -> None:
        timers.tick(self, now)

    def launch_due_ams(self, now: float) -> None:
        """Start the AMs a burst of submits left for later (lifecycle.submit), all in one launch."""
        if self.launch_due:
            self.launch_due = False
            self.launched_at = now
            self.ams.launch(now)

    # ------------------------------------------------------------ queues: preemption, refresh, views

    def preempt(self, now: float) -> list[preemption.Decision]:
        """Start the preemptions starving queues are owed (rm/sched/reclaim.py, rm/sched/preemption.py)."""
        return self.reclaims.preempt(now)

    def revoke_hoarded(self, now: float) -> list[str]:
        """Take back grants incomplete gangs hoard above their queue's share while another queue waits."""
        return self.reclaims.revoke_hoarded(now)

    def _revoke(self, c: Container, diagnostics: str, now: float) -> None:
        timers.revoke(self, c, diagnostics, now)

    def next_check(self, now: float) -> float | None:
        """When time-driven queue work may next come due (see Reclaims.next_check); None when nothing can."""
        at = self.reclaims.next_check(now)
        grow = self.elastic.next_growth(now)
        return grow if grow is not None and (at is None or grow < at) else at

    def _preempt_job(self, job: Job, d: preemption.Decision, grace_s: float, now: float) -> None:
        timers.preempt_job(self, job, d, grace_s, now)

    def standing(self, job: Job, now: float) -> priority.Standing:
        return self.standings.standing(job, now)

    def preempt_in_queue(self, now: float) -> list[tuple[str, str]]:
        """Tiresias-style preemption inside las / srtf leaves (rm/sched/inqueue.py); off unless
        `settings.inqueue_preemption`."""
        if not self.settings.inqueue_preemption:
            return []
        return self.inqueue.run(self.reclaims.being_preempted(), now)

    def preempt_borrowers(self, now: float) -> list[tuple[str, str]]:
        """Under a borrowing policy: borrowers of any queue preempted for better-ranked waiting jobs
        (rm/sched/borrowing.py); (victim, beneficiary) pairs. Nothing under `borrowing: fair`."""
        if self.queues.borrowing is None:
            return []
        return self.borrow.run(self.reclaims.being_preempted(), now)

    @property
    def _ranked(self) -> bool:
        """Whether any leaf, or the borrowing policy, orders jobs by something that changes with time (las, srtf)."""
        if self.queues.borrowing is not None:
            return True
        override = self.scheduler.policy_override
        if override is not None:
            return priority.preemptive(override)
        return self.queues.ranked

    @property
    def ranks_by_history(self) -> bool:
        """Whether any leaf, or the borrowing policy, ranks jobs by what the history learned (gittins)."""
        if self.queues.borrowing is Policy.GITTINS:
            return True
        override = self.scheduler.policy_override
        if override is not None:
            return override is Policy.GITTINS
        return any(self.scheduler.policy_of(q) is Policy.GITTINS for q in self.queues.tree.leaves)

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
        return {"next_job_seq": str(self.next_job_seq), "next_container_seq": str(self.next_container_seq),
                BEAT_META_KEY: f"{self.beats.terms.interval_s:g}"}

    def pace_beats(self, now: float) -> bool:
        """Follow the fleet's size with the heartbeat interval (rm/state/heartbeats.py); whether it changed (then
        stored: after a restart its expiry holds while agents may still follow it)."""
        if self._beats_counted_at == self.cluster.shape_version and not self.beats.shrinking:
            return False
        self._beats_counted_at = self.cluster.shape_version
        self._beats_fleet = fleet = self.nodes.counted()
        changed = self.beats.update(fleet, now)
        if changed:
            self.dirty.meta = True
            log.info("heartbeat interval now %gs for %d servers (agents' lease %gs; a node is LOST after %gs of "
                     "silence)", self.beats.terms.interval_s, fleet, self.beats.terms.lease_s,
                     self.beats.expiry_s(now))
        return changed

    def restore(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
                meta: dict[str, str], now: float, learned: Iterable[Finished] = ()) -> None:
        """Load records written by an earlier RM. Nodes come back as they were last seen and have a full
        expiry period to re-register; AMs and grants get a fresh clock from `now`. `learned`: what the history
        learned from jobs that left memory (rm/state/retention.py), in finish order."""
        self.recovered_at = now
        nodes = list(nodes)
        recovery.load(jobs, containers, nodes, now, self.jobs, self.submit_ids, self.index, self.cluster)
        self.pace_beats(now)
        self.beats.restore(recovery.stored_interval(meta), now)
        self.resync_until = now + resync.grace_s(self.settings, len(nodes), self.beats.expiry_s(now))
        for c in self.live.values():
            self.elastic.added(c)
        recovery.readmit(self.jobs, self.live, self.ams, self._am_up)
        self.next_job_seq, self.next_container_seq = recovery.counters(meta)
        self._rebuild_queue_book()
        # The history relearns the finished jobs in the store (finish order: the same tables), after its prior:
        # the retired ones' first (they finished before any finished job still in memory).
        self.history.learn_all(learned)
        for job in sorted(self.jobs.values(), key=lambda j: (j.finish_time, j.seq)):
            if job.state in (JobState.SUCCEEDED, JobState.FAILED):
                self.history.finished(lifecycle.finished_record(job, job.attained_gpu_s))

    # ------------------------------------------------------------ views for the shell

    def list_jobs(self, states: Iterable[JobState] = (), queue: str = "", user: str = "",
                  limit: int = 0) -> list[Job]:
        return views.list_jobs(self.jobs, states, queue, user, limit)

    def why_waiting(self, job: Job) -> str:
        """Why an unfinished job waits: its AM's account, and the RM's when the RM holds it back."""
        return views.why_waiting(job, self.ams, self.apps)

    def gpus_held(self, job_id: str) -> int:
        return sum(c.gpus for c in self.job_containers(job_id))
