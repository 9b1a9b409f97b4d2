"""The AM's state machine (Philly's acquisition workflow). Pure: events and `now` in, decisions out.

One attempt goes: PLANNING (find a plan at the current locality level in the view) -> ACQUIRING (ask the RM
for exactly the plan's servers; keep grants as they come) -> LAUNCHING (start every learner) -> RUNNING
(watch them) -> SUCCEEDED, or STOPPING (tear the gang down) -> a new attempt, or FAILED.
If the gang is not complete within `timeout` of entering a level, everything held is released, the AM backs off
(base x 2^k with full jitter, capped) and relaxes one level; at `any` it keeps cycling with back-off.
A `placement: spread` job has no locality level (its `level` stays `any`): it plans with `plan_spread` under a cap
of GPUs per server, 1 (or the least the cluster's shape allows) first, and relaxing raises the cap by one
(`prefer`), never (`strict`), or there is no cap from the start (`any`); see docs/jobs.md.

The shell feeds it the view, grants, completions and launch results, and carries out what it asks for: the asks
sent with each allocate, releases, learner launches and stops, attempt reports and the final state.

Why it is over 500 lines: one attempt's whole acquisition workflow is one state machine whose transitions read
each other's fields (level, hold, back-off, launch set); the pieces that stand alone are already out: the planner
(placement.py), relax-by-cost (relax.py), the view (view.py).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from gpurm.am.elastic import growth_parts
from gpurm.am.placement import Part, Plan, ServerView, View, as_view, plan, plan_spread, spread_shape_cap
from gpurm.am.relax import CostRelax, FreeRate
from gpurm.queues.fields import format_duration
from gpurm.rm.jobspec import JobSpec, LocalityLevel, LocalityMode, Placement, share_text
from gpurm.rm.model import FailureKind, JobState, Learner

USER_ERROR_WINDOW_S = 60.0     # a failure this soon after start, twice with one exit code, is the user's
STOP_WAIT_S = 60.0             # how long to wait for stopped learners to be reported gone
GROWTH_PAUSE_S = 60.0          # an elastic job's growth waits this long after a grown learner failed
SHRINK_GRACE_S = 30.0          # notice to a grown learner the job's own target no longer wants


class Phase(enum.Enum):
    PLANNING = "PLANNING"
    ACQUIRING = "ACQUIRING"
    BACKOFF = "BACKOFF"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    DONE = "DONE"


@dataclass
class Held:
    """A container the RM granted to this job."""

    container_id: str
    node_id: str
    rack: str
    host: str
    port: int
    gpu_indices: tuple[int, ...]
    token: Any = None          # opaque to the state machine; the shell passes it to the agent
    preemptible: bool = False

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)


@dataclass
class Ended:
    """A container the RM reports ended."""

    container_id: str
    exit_code: int = 0
    signal: int = 0
    stopped: bool = False       # ended because somebody stopped it
    failed_to_start: bool = False
    lost: bool = False          # node lost, agent forgot it, grant expired
    infra: bool = False
    diagnostics: str = ""
    user_error: bool = False    # the agent saw the job's own fault (command not found, no workdir): never retried

    def describe(self) -> str:
        if self.lost:
            return f"lost ({self.diagnostics})" if self.diagnostics else "lost"
        if self.failed_to_start:
            return f"failed to start: {self.diagnostics}" if self.diagnostics else "failed to start"
        if self.infra and self.diagnostics:  # e.g. stopped by its agent because its GPU failed
            return f"failed ({self.diagnostics})"
        if self.signal:
            return f"was killed by signal {self.signal}"
        if self.user_error and self.diagnostics:    # e.g. the shell's 127: what the agent made of it
            return self.diagnostics
        return f"exited with code {self.exit_code}"


@dataclass
class Run:
    """A launched learner."""

    rank: int
    held: Held
    state: str = "STARTING"     # STARTING, RUNNING, EXITED, FAILED_TO_START, LOST
    pid: int = 0
    exit_code: int = 0
    signal: int = 0
    extra: bool = False         # an elastic job's growth beyond its gang (am/elastic.py)

    @property
    def live(self) -> bool:
        return self.state in ("STARTING", "RUNNING")


@dataclass
class Launch:
    """Start these learners (one per server); env holds the torchrun variables."""

    attempt: int
    learners: list[tuple[Held, int, dict[str, str]]]   # (container, rank, env without MASTER_PORT)
    master_node: str


@dataclass
class Stop:
    held: Held
    grace_s: float
    reason: str


Action = Launch | Stop


@dataclass
class AttemptRecord:
    number: int
    state: JobState = JobState.ALLOCATING
    start_time: float = 0.0
    end_time: float = 0.0
    learners: list[Learner] = field(default_factory=list)
    failure: FailureKind = FailureKind.NONE
    cause: str = ""
    exit_code: int = 0
    counts_as_failure: bool = False
    level: str = ""
    waiting_reason: str = ""
    launched_at: float = -1.0      # when every learner ran; -1 = never (or unknown after adoption)


@dataclass
class Final:
    state: JobState
    diagnostics: str
    exit_code: int = 0


class Master:
    def __init__(self, spec: JobSpec, now: float, rng: random.Random | None = None, first_attempt: int = 1,
                 relax: CostRelax | None = None) -> None:
        self.spec = spec
        self.spread = spec.placement is Placement.SPREAD
        self.cap = 0                   # a spread job's most GPUs per server now (0: no cap); see _first_cap
        # None: wait `locality.timeout` at each level (the default). A CostRelax: wait while the time waited is
        # below the run time the level saves (see am/relax.py).
        self.relax = relax
        self.frees = FreeRate()
        self.rng = rng or random.Random()
        self.phase = Phase.PLANNING
        self.view: View = View([])
        self.held: dict[str, Held] = {}
        self.runs: dict[str, Run] = {}
        self.avoid: set[str] = set()
        self.releases: list[str] = []
        self.actions: list[Action] = []
        self.attempts: list[AttemptRecord] = []
        self.dirty: set[int] = set()
        self.final: Final | None = None
        self.plan: Plan | None = None
        self.level = self._first_level()
        self.level_since = now
        self.backoffs = 0              # back-offs taken in this attempt (the exponent)
        self.backoff_until = 0.0
        self.stop_since = 0.0
        self.pending_end: tuple[FailureKind, str, int, bool] | None = None   # kind, cause, exit code, fatal
        self.plan_replies = 0          # allocate replies since the current plan's asks went out
        self.salt = self.rng.getrandbits(32)   # this AM's own order among equally good servers
        self.skipped = ""              # the levels the cluster's shape ruled out on entering this one, and why
        self.target = spec.most_gpus   # elastic: the size to grow or shrink toward (`gpurm scale`)
        self.growth_paused_until = 0.0
        self._new_attempt(first_attempt, now)

    # ------------------------------------------------------------ outputs

    @property
    def attempt(self) -> AttemptRecord:
        return self.attempts[-1]

    def asks(self) -> list[tuple[str, int, tuple[int, ...]]]:
        """Outstanding asks: (node, GPUs, preferred indices) for every part of the plan not yet held."""
        if self.phase is not Phase.ACQUIRING or self.plan is None:
            return []
        return [(p.node_id, p.gpus, p.gpu_indices if p.node_id else ()) for p in self._missing_parts()]

    def growth_asks(self, now: float) -> list[tuple[str, int, tuple[int, ...]]]:
        """An elastic job's asks to grow toward its target (sent as elastic asks): only while it runs."""
        if not self.spec.elastic or self.phase is not Phase.RUNNING or now < self.growth_paused_until:
            return []
        if not self._gang_runs():
            return []                   # a learner of its gang has ended: the job is finishing, not growing
        live = self._live_runs()
        gang = [r for r in live if not r.extra]
        master = min(gang, key=lambda r: r.rank).held.node_id
        level = LocalityLevel.parse(self.attempt.level) if self.attempt.level else self.level
        if self.spec.locality.mode is LocalityMode.ANY:
            level = LocalityLevel.ANY
        return growth_parts(self.view, self.target - self.live_gpus,
                            [r.held.node_id for r in live], master, level, self.avoid)

    def set_target(self, gpus: int, now: float) -> None:
        """The RM's target for an elastic job (0: its max). Above the live size, growth asks for more; below it,
        the newest grown learners are stopped and given back (never the gang)."""
        if not self.spec.elastic:
            return
        self.target = min(max(gpus or self.spec.max_gpus, self.spec.gpus), self.spec.max_gpus)
        if self.phase is not Phase.RUNNING:
            return
        size = self.live_gpus
        for run in sorted((r for r in self._live_runs() if r.extra), key=lambda r: -r.rank):
            if size <= self.target or size - run.held.gpus < self.target:
                break
            size -= run.held.gpus
            self._drop_extra(run, f"scaled to {self.target} GPUs", SHRINK_GRACE_S)

    def _drop_extra(self, run: Run, reason: str, grace_s: float) -> None:
        run.state = "EXITED"
        self.actions.append(Stop(run.held, grace_s, reason))
        self.releases.append(run.held.container_id)
        self._sync_learners()

    def on_reply(self) -> None:
        """The shell processed an allocate reply (its grants are in). A plan's servers can be judged taken only
        after two replies without them: a grant comes in the reply to the asks, or the next when passes are
        coalesced; before that, the view showing them busy may be showing our own grant."""
        if self.phase is Phase.ACQUIRING:
            self.plan_replies += 1

    def take_releases(self) -> list[str]:
        out, self.releases = self.releases, []
        return out

    def take_actions(self) -> list[Action]:
        out, self.actions = self.actions, []
        return out

    def take_reports(self, now: float | None = None) -> list[AttemptRecord]:
        """Attempt records that changed; with `now`, a waiting attempt's reason is brought up to date first
        (it is only rendered here, not on every step)."""
        if now is not None and self.phase in (Phase.PLANNING, Phase.ACQUIRING, Phase.BACKOFF):
            self._waiting(now)
        if not self.dirty:
            return []
        out = [a for a in self.attempts if a.number in self.dirty]
        self.dirty.clear()
        return out

    def next_deadline(self) -> float | None:
        """When `step` next has something to do by itself (a level timing out, a back-off ending, a stop wait
        running out); None when only an event can move it on."""
        if self.phase in (Phase.PLANNING, Phase.ACQUIRING):
            return self._level_deadline()
        if self.phase is Phase.BACKOFF:
            return self.backoff_until
        if self.phase is Phase.STOPPING:
            return self.stop_since + STOP_WAIT_S
        return None

    def catch_up(self, now: float) -> None:
        """Run, in order, every timer that fell due before `now`, as if stepped at each deadline. Lets a driver
        skip timer events while the AM holds and asks for nothing (its timers then matter to nobody else)."""
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > now:
                return
            if self._idle_at_any():
                self._skip_idle_cycles(now)
                continue
            self.step(deadline)

    def _idle_at_any(self) -> bool:
        """Backing off at the last level it will try (`any`; a strict job's own level), holding nothing, in a
        view where nothing fits at that level."""
        return (self.phase is Phase.BACKOFF and self.level is self._next_level() and not self.held
                and self.view.cannot_fit(self.spec.gpus, self.level)
                and (not self.spread or self._next_cap() == self.cap))

    def _skip_idle_cycles(self, now: float) -> None:
        """Back-off → plan at the last level (nothing fits) → time out → back-off, as many whole cycles as end before
        `now`, without planning: the view proves every plan would fail. Same clock and random draws as stepping
        through them; a job waiting for days in a full cluster would otherwise replan hundreds of times."""
        timeout = self.spec.locality.timeout_s
        while self.backoff_until + timeout <= now:
            self.level_since = self.backoff_until
            cap = self._backoff_cap()
            self.backoffs += 1
            self.backoff_until = self.level_since + timeout + self.rng.uniform(0.0, cap)
        if self.backoff_until <= now:
            self.step(self.backoff_until)        # the last back-off ends before now: plan (and fail) for real
        self.attempt.level = self._label()
        self.dirty.add(self.attempt.number)

    @property
    def idle(self) -> bool:
        """Planning or backing off with nothing held or asked: only GPUs coming free can move it on."""
        return self.phase in (Phase.PLANNING, Phase.BACKOFF) and not self.held and not self.asks()

    @property
    def live_gpus(self) -> int:
        """GPUs of the learners still running (an elastic job's size now)."""
        return sum(r.held.gpus for r in self._live_runs())

    @property
    def held_gpus(self) -> int:
        return sum(h.gpus for h in self.held.values())

    # ------------------------------------------------------------ inputs

    def on_view(self, servers: View | Sequence[ServerView], now: float) -> None:
        view = as_view(servers)
        if self.relax is not None:
            self.frees.observe(self.view, view, now)
        self.view = view
        self.step(now)

    def on_grant(self, held: Held, now: float) -> None:
        if held.container_id in self.held or held.container_id in self.runs:
            return
        if self.phase is Phase.ACQUIRING and self._wanted(held):
            self.held[held.container_id] = held
        elif self.phase is Phase.RUNNING and self.spec.elastic and self._gang_runs() and \
                self.live_gpus + held.gpus <= self.target:
            self._launch_extra(held)
        else:
            # Granted for an ask we no longer have (a stale plan, or the gang is complete): give it back.
            self.releases.append(held.container_id)
        self.step(now)

    def on_ended(self, ended: Ended, now: float) -> None:
        cid = ended.container_id
        run = self.runs.get(cid)
        held = self.held.pop(cid, None)
        if run is None or not run.live:
            if held is not None and self.phase is Phase.ACQUIRING and (ended.lost or ended.infra):
                self.avoid.add(held.node_id)
            self.step(now)
            return
        run.state = "LOST" if ended.lost else "FAILED_TO_START" if ended.failed_to_start else "EXITED"
        run.exit_code, run.signal = ended.exit_code, ended.signal
        self._sync_learners()
        ok = not ended.stopped and not ended.lost and not ended.failed_to_start and ended.exit_code == 0 \
            and ended.signal == 0
        if run.extra and self.phase is Phase.RUNNING and not ok:
            # A grown learner went (taken back, or failed): the job goes on with its others.
            if not ended.stopped:
                self.growth_paused_until = now + GROWTH_PAUSE_S
            self.step(now)
            return
        if self.phase in (Phase.RUNNING, Phase.LAUNCHING):
            if not ended.stopped and not ended.lost and not ended.failed_to_start and ended.exit_code == 0 \
                    and ended.signal == 0:
                self._succeeded_learner(run, now)
            else:
                user = ended.user_error and not ended.lost
                kind = FailureKind.INFRA if (ended.lost or ended.infra) and not user else FailureKind.USER
                if kind is FailureKind.INFRA:
                    self.avoid.add(run.held.node_id)
                cause = f"rank {run.rank} on {run.held.node_id} {ended.describe()}"
                self._end_attempt(kind, cause, ended.exit_code if not ended.signal else 128 + ended.signal, now,
                                  fatal=user)
        self.step(now)

    def on_started(self, container_id: str, ok: bool, pid: int, diagnostics: str, infra: bool,
                   now: float, user_error: bool = False) -> None:
        """The shell's report of one learner launch; `user_error`: the agent judged the failure the job's own
        (command not found, workdir missing), the same wherever it runs: the job fails without a retry."""
        run = self.runs.get(container_id)
        if run is None or run.state != "STARTING":
            return
        if ok:
            run.state, run.pid = "RUNNING", pid
            self._sync_learners()
            if self.phase is Phase.LAUNCHING and all(r.state == "RUNNING" for r in self.runs.values()):
                self.phase = Phase.RUNNING
                self.attempt.state = JobState.RUNNING
                self.attempt.launched_at = now
                self.attempt.waiting_reason = ""
                self.dirty.add(self.attempt.number)
        elif run.extra:
            run.state = "FAILED_TO_START"
            self._sync_learners()
            self.releases.append(container_id)
            self.growth_paused_until = now + GROWTH_PAUSE_S
        else:
            run.state = "FAILED_TO_START"
            self._sync_learners()
            infra = infra and not user_error
            if infra:
                self.avoid.add(run.held.node_id)
            kind = FailureKind.INFRA if infra else FailureKind.USER
            self._end_attempt(kind, f"rank {run.rank} on {run.held.node_id} failed to start: {diagnostics}",
                              0, now, fatal=user_error)
        self.step(now)

    def on_preempted(self, container_ids: Iterable[str], grace_s: float, now: float, reason: str = "") -> None:
        """The RM takes these containers back; `reason` is the RM's (fair share or in-queue, and for whom)."""
        ids = set(container_ids)
        if not ids & (set(self.held) | {cid for cid, r in self.runs.items() if r.live}):
            return
        extras = {cid for cid in ids if (r := self.runs.get(cid)) is not None and r.extra}
        if extras and extras == ids - set(self.held) and self.phase is Phase.RUNNING:
            # Only grown learners are taken back (rm/elastic.py): the job shrinks and goes on.
            for cid in sorted(extras):
                self._drop_extra(self.runs[cid], reason or "elastic GPUs taken back", grace_s)
            return
        if self.phase in (Phase.RUNNING, Phase.LAUNCHING):
            self._end_attempt(FailureKind.PREEMPTED, reason or "preempted: the RM took its GPUs back",
                              0, now, grace_s=grace_s)
        else:
            for cid in ids:
                if cid in self.held:
                    self.held.pop(cid)
                    self.releases.append(cid)
        self.step(now)

    def on_room(self, now: float) -> None:
        """The RM says GPUs wait for this job (idle, or freed for it by preemption): a back-off ends now."""
        if self.phase is Phase.BACKOFF and self.backoff_until > now:
            self.backoff_until = now
            self.step(now)

    def on_kill(self, reason: str, now: float) -> None:
        if self.final is not None:
            return
        for run in self._live_runs():
            self.actions.append(Stop(run.held, 0.0, "job killed"))
        self.releases.extend(self.held)
        self.held.clear()
        attempt = self.attempt
        if not attempt.state.terminal:
            attempt.state, attempt.failure, attempt.cause, attempt.end_time = (
                JobState.KILLED, FailureKind.KILLED, reason or "killed", now)
            self.dirty.add(attempt.number)
        self.final = Final(JobState.KILLED, reason or "killed")
        self.phase = Phase.DONE

    def adopt(self, attempts: Sequence[AttemptRecord], held: Sequence[Held], ended: Sequence[Ended],
              now: float) -> None:
        """A restarted AM takes over: learners of a running attempt keep running; anything else held is
        released and the attempt is acquired again."""
        self.attempts = [a for a in attempts] or self.attempts
        held_by_id = {h.container_id: h for h in held}
        last = self.attempts[-1]
        if last.state is JobState.RUNNING and last.learners and all(
                ln.container_id in held_by_id or any(e.container_id == ln.container_id for e in ended)
                for ln in last.learners):
            self.runs = {}
            for ln in last.learners:
                h = held_by_id.pop(ln.container_id, None)
                if h is None:
                    h = Held(ln.container_id, ln.node_id, "", ln.host, 0, tuple(ln.gpu_indices))
                self.runs[ln.container_id] = Run(ln.rank, h, state="RUNNING", pid=ln.pid)
            self.phase = Phase.RUNNING
            self.releases.extend(held_by_id)        # grants that never became learners
            for e in ended:
                if e.container_id in self.runs:
                    self.on_ended(e, now)
            return
        self.releases.extend(held_by_id)
        if last.state.terminal:
            self._new_attempt(last.number + 1, now)
        else:
            last.state = JobState.ALLOCATING
            last.learners = []
            self.dirty.add(last.number)
            self.cap = self._first_cap()
            self._enter_level(self._first_level(), now)
        self.step(now)

    # ------------------------------------------------------------ the machine

    def step(self, now: float) -> None:
        if self.phase is Phase.DONE or self.phase is Phase.RUNNING or self.phase is Phase.LAUNCHING:
            return         # only events move these on
        if self.phase is Phase.STOPPING:
            if self._live_runs() and now < self.stop_since + STOP_WAIT_S:   # same expression as next_deadline
                return
            self._after_stop(now)
            if cast(Phase, self.phase) is not Phase.PLANNING:   # _after_stop moved it on
                return
        if self.phase is Phase.BACKOFF:
            if now < self.backoff_until:
                return
            if self.spread:
                self.cap = self._next_cap()
            self._enter_level(self._next_level(), now)
        if self.phase is Phase.PLANNING and self._shape_floor(self.level) is not self.level:
            self._enter_level(self.level, now)    # the cluster's shape can never hold the job here: skip at once
        if self.phase is Phase.PLANNING and self.spread and self._cap_floor(self.cap) != self.cap:
            self._enter_level(self.level, now)    # the same for a spread job's cap (the view came after entering)
        if self.phase is Phase.PLANNING:
            self.plan = self._plan() if len(self.view) else None
            if self.plan is not None:
                self.phase = Phase.ACQUIRING
                self.plan_replies = 0
        if self.phase is Phase.ACQUIRING and self.plan is not None and not self._missing_parts():
            self._launch(now)
            return
        if self.phase is Phase.ACQUIRING and not self.held:
            if not self._plan_taken():
                self.plan_replies = 0          # its servers look free: a grant may well be on its way
            elif self.plan_replies >= 2:
                # Somebody got the planned servers first (many AMs plan from one view). Holding nothing, plan
                # again at the same level at once; the level's clock keeps running.
                self.plan = self._plan()
                self.plan_replies = 0
                if self.plan is None:
                    self.phase = Phase.PLANNING
        if self.phase in (Phase.PLANNING, Phase.ACQUIRING) and \
                now >= self._level_deadline():   # same expression as next_deadline
            self._give_up_level(now)

    def _plan(self) -> Plan | None:
        if self.spec.shared:
            # A share of one GPU: the RM knows which shared GPUs have room (the view shows whole GPUs only), so the
            # plan names no server.
            return Plan(LocalityLevel.ANY, [Part("", "", (0,))])
        if self.spread:
            return plan_spread(self.spec.gpus, self.view, self.cap, self.avoid, self.salt)
        return plan(self.spec.gpus, self.view, self.level, self.avoid, self.salt)

    def _label(self) -> str:
        """The attempt's level as reported: a locality level, or for a spread job `spread:N` (at most N GPUs per
        server) or `spread:any` (no cap)."""
        if self.spread:
            return f"spread:{self.cap}" if self.cap else "spread:any"
        return self.level.label

    def _first_cap(self) -> int:
        """A spread job's first cap: one GPU per server, or no cap for `locality: any` (spread over whatever is
        free now, without waiting); _cap_floor raises it to what the cluster's shape allows."""
        return 0 if self.spec.locality.mode is LocalityMode.ANY else 1

    def _cap_floor(self, cap: int) -> int:
        """`cap`, or the least cap the cluster's shape allows when `cap` is below it (8 GPUs over 4 servers: 2 per
        server); 0 (no cap) once a cap no longer limits anything (it reaches the job's GPUs or the biggest server's).
        No change without a view."""
        if cap == 0:
            return 0
        gpus = self.spec.gpus
        if len(self.view):
            sizes = [s.total for s in self.view.servers]
            least = spread_shape_cap(gpus, sizes)
            if least == 0:
                return 0
            cap = max(cap, least)
            if cap >= max(sizes):
                return 0
        return 0 if cap >= gpus else cap

    def _next_cap(self) -> int:
        """A spread job's cap after a back-off: `strict` keeps its first (floored) cap, `prefer` allows one GPU more
        per server each time, up to no cap."""
        if self.spec.locality.mode is LocalityMode.STRICT:
            return self._cap_floor(self._first_cap())
        return 0 if self.cap == 0 else self._cap_floor(self.cap + 1)

    def _level_deadline(self) -> float:
        """When the current level is given up: its timeout, or with a cost policy (and a looser level to go to)
        when the time waited reaches the run time the level saves (am/relax.py)."""
        timeout_at = self.level_since + self.spec.locality.timeout_s
        if self.relax is None:
            return timeout_at
        nxt = self._shape_floor(self._next_level())
        if nxt is self.level:
            return timeout_at
        return self.relax.deadline(self.level, nxt, self.level_since, self.view, self.spec.gpus, self.frees)

    def _first_level(self) -> LocalityLevel:
        """Where an attempt starts: `any` for a job that does not care about locality (or a spread job, which has no
        locality level), else its start level."""
        if self.spec.locality.mode is LocalityMode.ANY or self.spread or self.spec.shared:
            return LocalityLevel.ANY
        return self.spec.locality.start_level

    def _shape_floor(self, level: LocalityLevel) -> LocalityLevel:
        """`level`, or the first level after it that the cluster's shape can satisfy for this job (a 24-GPU job
        on 8-GPU servers is never at `node`; a 48-GPU job on racks of 32 GPUs never in one rack): waiting at
        the others would only waste their timeouts. Decided from the view's servers (sizes, racks), not from
        what is free; `any` when the cluster is too small for the job altogether, and no skip without a view."""
        if not len(self.view) or self.view.satisfiable(self.spec.gpus, level):
            return level
        for candidate in (LocalityLevel.PACKED, LocalityLevel.RACK):
            if candidate > level and self.view.satisfiable(self.spec.gpus, candidate):
                return candidate
        return LocalityLevel.ANY

    def _why_skipped(self, wanted: LocalityLevel, level: LocalityLevel) -> str:
        """Why the levels from `wanted` up to `level` were skipped: the job's status says it, so a start level
        the cluster cannot give (`--start-level node` for 16 GPUs on 8-GPU servers) is not silently ignored."""
        gpus = self.spec.gpus
        why = {LocalityLevel.NODE: f"no server has {gpus} GPUs",
               LocalityLevel.PACKED: f"no rack holds {gpus} GPUs on {self.view.fewest_servers(gpus)} servers",
               LocalityLevel.RACK: f"no rack has {gpus} GPUs"}
        parts = [f"{lv.label} ({why[lv]})" for lv in (LocalityLevel.NODE, LocalityLevel.PACKED, LocalityLevel.RACK)
                 if wanted <= lv < level]
        return f"skipped {', '.join(parts)}: the cluster's shape can never give them" if parts else ""

    def _next_level(self) -> LocalityLevel:
        """The level to try after a back-off: one looser (`any` stays `any`); a strict job stays at the best level
        the cluster's shape allows it from its start level; so does a multi-GPU `prefer` job that fits on one
        server, once at `packed` (one server for it), unless its AM relaxes by cost: see _keeps_one_server."""
        if self.spec.locality.mode is LocalityMode.STRICT or self.spread:
            return self._shape_floor(self._first_level())
        if self._keeps_one_server():
            return self.level
        return LocalityLevel(min(self.level + 1, LocalityLevel.ANY))

    def _keeps_one_server(self) -> bool:
        """A multi-GPU job that fits on one server is not split across servers unless it says `locality: any`, or
        its AM relaxes by expected cost (then the cost decides, as for any job). Splitting it moves its all-reduce
        from NVLink / PCIe onto the network, and with small jobs packed best fit (placement.py) whole servers do come
        free. Measured on the Philly window (8x8x8, las, ideal run times,
        seeds 0-2): locality 68-70% -> 98%, average queueing delay down 10-20%, average JCT unchanged within the
        seeds' spread; letting such jobs split after 30 min, 2 h or 6 h of waiting did worse on all three."""
        gpus = self.spec.gpus
        return (self.relax is None and gpus > 1 and self.level is LocalityLevel.PACKED and len(self.view) > 0
                and self.view.fewest_servers(gpus) == 1)

    def _enter_level(self, level: LocalityLevel, now: float) -> None:
        wanted = level
        level = self._shape_floor(level)      # a level the job can never be at is skipped at once
        self.skipped = self._why_skipped(wanted, level) if level is not wanted else ""
        self.level = level
        if self.spread:
            self.cap = self._cap_floor(self.cap)
        self.level_since = now
        self.plan = None
        self.phase = Phase.PLANNING
        self.attempt.level = self._label()
        self.dirty.add(self.attempt.number)

    def _give_up_level(self, now: float) -> None:
        self.releases.extend(self.held)
        self.held.clear()
        self.plan = None
        cap = self._backoff_cap()
        self.backoffs += 1
        self.backoff_until = now + self.rng.uniform(0.0, cap)
        self.phase = Phase.BACKOFF

    def _backoff_cap(self) -> float:
        # 2^k stops growing long before it matters (and before it overflows a float): the cap rules.
        loc = self.spec.locality
        return float(min(loc.backoff_base_s * (2 ** min(self.backoffs, 60)), loc.backoff_max_s))

    @property
    def plan_looks_taken(self) -> bool:
        """Acquiring, holding nothing, with a plan whose servers the view shows busy: another reply or two
        settles whether to plan again (a driver should call again soon rather than wait for the timeout)."""
        return self.phase is Phase.ACQUIRING and not self.held and self._plan_taken()

    def plan_taken_in(self, view: View) -> bool:
        """Whether `view` (perhaps newer than the AM's) shows a server of its plan without the GPUs the plan needs
        there: a driver's cheap test of whether a grant to somebody else concerns this AM."""
        return self._plan_taken(view)

    def _plan_taken(self, view: View | None = None) -> bool:
        """Whether the view shows a server of the plan without the GPUs the plan needs there."""
        if self.plan is None:
            return False
        free_on = (view or self.view).free_on
        return any(p.node_id and free_on.get(p.node_id, 0) < p.gpus for p in self.plan.parts)

    def _missing_parts(self) -> list[Part]:
        assert self.plan is not None
        if not self.held:
            return list(self.plan.parts)
        free = list(self.held.values())
        missing = []
        for part in self.plan.parts:
            match = next((h for h in free if part.node_id in ("", h.node_id) and h.gpus == part.gpus), None)
            if match is not None:
                free.remove(match)
            else:
                missing.append(part)
        return missing

    def _wanted(self, held: Held) -> bool:
        if self.plan is None:
            return False
        return any(p.node_id in ("", held.node_id) and p.gpus == held.gpus for p in self._missing_parts())

    def _launch(self, now: float) -> None:
        assert self.plan is not None
        gang = sorted(self.held.values(), key=lambda h: (-h.gpus, h.node_id))
        world = sum(h.gpus for h in gang)
        master = gang[0]
        learners = []
        self.runs = {}
        for rank, h in enumerate(gang):
            env = {
                "MASTER_ADDR": master.host, "NNODES": str(len(gang)), "NODE_RANK": str(rank),
                "NPROC_PER_NODE": str(h.gpus), "WORLD_SIZE": str(world),
                "GPURM_ATTEMPT": str(self.attempt.number),
            }
            if self.spec.elastic:
                env.update(self._elastic_env(master, len(gang), rank == 0, h.gpus))
            learners.append((h, rank, env))
            self.runs[h.container_id] = Run(rank, h)
        self.held.clear()
        self.actions.append(Launch(self.attempt.number, learners, master.node_id))
        self.phase = Phase.LAUNCHING
        self.attempt.level = self._label() if self.spread else self.plan.level.label
        self.attempt.waiting_reason = "starting its learners"
        self._sync_learners()

    def _gang_runs(self) -> bool:
        """Whether every learner of the gang still runs (growth joins a running job, never a finishing one)."""
        gang = [r for r in self.runs.values() if not r.extra]
        return bool(gang) and all(r.live for r in gang)

    def _elastic_env(self, master: Held, gang_nodes: int, is_host: bool, gpus: int) -> dict[str, str]:
        """What an elastic job's learners need for torchrun's elastic rendezvous (c10d), also as torchrun's own
        PET_* defaults, so that `torchrun --nproc-per-node=$NPROC_PER_NODE train.py` is enough. The gang's first
        learner hosts the rendezvous store (is_host): it is never taken back. The shell adds the endpoint."""
        nodes = f"{gang_nodes}:{self.spec.max_gpus}"
        host = "1" if is_host else "0"
        return {"GPURM_MIN_GPUS": str(self.spec.gpus), "GPURM_MAX_GPUS": str(self.spec.max_gpus),
                "GPURM_MIN_NODES": str(gang_nodes), "GPURM_MAX_NODES": str(self.spec.max_gpus),
                "GPURM_RDZV_IS_HOST": host, "MASTER_ADDR": master.host,
                "PET_NNODES": nodes, "PET_NPROC_PER_NODE": str(gpus), "PET_RDZV_BACKEND": "c10d",
                "PET_RDZV_ID": f"{self.attempt.number}", "PET_RDZV_CONF": f"is_host={host}",
                "PET_MAX_RESTARTS": "100",
                # torchrun shares its rendezvous store with the workers by default, and then a learner joining a
                # running job never learns the workers' master address (torch 2.13): rebuild it every round.
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    def _launch_extra(self, held: Held) -> None:
        """Start a grown learner at once: it joins the others through the job's rendezvous."""
        gang = sorted((r for r in self.runs.values() if not r.extra), key=lambda r: r.rank)
        rank = max((r.rank for r in self.runs.values()), default=-1) + 1
        env = {"NNODES": str(len(self._live_runs()) + 1), "NODE_RANK": str(rank), "NPROC_PER_NODE": str(held.gpus),
               "WORLD_SIZE": str(self.live_gpus + held.gpus),
               "GPURM_ATTEMPT": str(self.attempt.number),
               **self._elastic_env(gang[0].held, len(gang), False, held.gpus)}
        self.runs[held.container_id] = Run(rank, held, extra=True)
        self.actions.append(Launch(self.attempt.number, [(held, rank, env)], gang[0].held.node_id))
        self._sync_learners()

    def _live_runs(self) -> list[Run]:
        return [r for r in self.runs.values() if r.live]

    def _succeeded_learner(self, run: Run, now: float) -> None:
        if self._live_runs():
            return          # the others are still finishing
        attempt = self.attempt
        attempt.state, attempt.end_time, attempt.failure = JobState.SUCCEEDED, now, FailureKind.NONE
        self.dirty.add(attempt.number)
        self.final = Final(JobState.SUCCEEDED, f"all learners of attempt {attempt.number} exited with code 0")
        self.phase = Phase.DONE

    def _end_attempt(self, kind: FailureKind, cause: str, exit_code: int, now: float,
                     grace_s: float = 10.0, fatal: bool = False) -> None:
        """The attempt is over: stop what still runs, give everything back, then decide in _after_stop (`fatal`:
        a user error that every retry would repeat; the job fails then)."""
        if self.phase is Phase.STOPPING or self.phase is Phase.DONE:
            return
        for run in self._live_runs():
            self.actions.append(Stop(run.held, grace_s, cause))
        self.releases.extend(self.held)
        self.held.clear()
        self.pending_end = (kind, cause, exit_code, fatal)
        self.phase = Phase.STOPPING
        self.stop_since = now
        attempt = self.attempt
        attempt.end_time = now
        attempt.failure, attempt.cause, attempt.exit_code = kind, cause, exit_code
        attempt.counts_as_failure = kind in (FailureKind.USER, FailureKind.INFRA)
        attempt.state = JobState.FAILED if attempt.counts_as_failure else JobState.KILLED
        self.dirty.add(attempt.number)

    def _after_stop(self, now: float) -> None:
        # Whatever did not confirm its end in time is released anyway; the RM stops it.
        self.releases.extend(r.held.container_id for r in self._live_runs())
        assert self.pending_end is not None
        kind, cause, code, fatal = self.pending_end
        self.pending_end = None
        failures = [a for a in self.attempts if a.counts_as_failure]
        if kind is FailureKind.PREEMPTED:
            self._new_attempt(self.attempt.number + 1, now)
            return
        if fatal:
            self._fail(f"{cause}: a user error (it would fail the same way again), not retried", code)
            return
        if len(failures) > self.spec.max_retries:
            causes = "; ".join(f"attempt {a.number}: {a.cause}" for a in self.attempts if a.counts_as_failure)
            self._fail(f"failed {len(failures)} times (max_retries {self.spec.max_retries}): {causes}", code)
            return
        if self._user_error(failures):
            self._fail(f"{cause}; the same exit code ({code}) within a minute of starting in attempts "
                       f"{failures[0].number} and {failures[1].number}: a user error, not retried", code)
            return
        self._new_attempt(self.attempt.number + 1, now)

    def _user_error(self, failures: list[AttemptRecord]) -> bool:
        if len(failures) != 2 or self.attempts[0] is not failures[0]:
            return False
        a, b = failures
        quick = all(x.launched_at >= 0 and x.end_time - x.launched_at <= USER_ERROR_WINDOW_S for x in (a, b))
        return (quick and a.failure is FailureKind.USER and b.failure is FailureKind.USER
                and a.exit_code == b.exit_code and a.exit_code != 0)

    def _fail(self, diagnostics: str, exit_code: int) -> None:
        self.final = Final(JobState.FAILED, diagnostics, exit_code)
        self.phase = Phase.DONE

    def _new_attempt(self, number: int, now: float) -> None:
        self.runs = {}
        self.attempts.append(AttemptRecord(number=number, start_time=now))
        self.dirty.add(number)
        self.backoffs = 0
        self.cap = self._first_cap() if self.spread else 0
        self._enter_level(self._first_level(), now)

    def _sync_learners(self) -> None:
        self.attempt.learners = [
            Learner(rank=r.rank, node_id=r.held.node_id, gpu_indices=list(r.held.gpu_indices),
                    container_id=r.held.container_id, host=r.held.host, state=r.state, exit_code=r.exit_code,
                    signal=r.signal, pid=r.pid, preemptible=r.held.preemptible)
            for r in sorted(self.runs.values(), key=lambda r: r.rank)]
        self.dirty.add(self.attempt.number)

    # ------------------------------------------------------------ why pending

    def _waiting(self, now: float) -> None:
        reason = self.waiting_reason(now)
        if reason != self.attempt.waiting_reason:
            self.attempt.waiting_reason = reason
            self.dirty.add(self.attempt.number)

    def waiting_reason(self, now: float) -> str:
        if self.spread:
            return self._spread_reason(now)
        if self.spec.shared and self.phase is not Phase.BACKOFF:
            return (f"waiting for {share_text(self.spec.gpu_share_milli)} of a GPU: no shared GPU has that much room "
                    f"and no GPU is free ({format_duration(now - self.level_since)})")
        gpus = self.spec.gpus
        level = self.level
        timeout = self.spec.locality.timeout_s if self.phase is Phase.BACKOFF else \
            max(0.0, self._level_deadline() - self.level_since)
        clock = f"level {level.label}, {format_duration(now - self.level_since)} of {format_duration(timeout)}"
        strict = self.spec.locality.mode is LocalityMode.STRICT
        if self.phase is Phase.BACKOFF:
            nxt = self._next_level()
            again = " again (locality strict: it never relaxes further)" if strict and nxt is level else \
                " again (it fits on one server: it is not split across servers unless its locality is any)" \
                if nxt is level and level is not LocalityLevel.ANY else ""
            return (f"backing off {format_duration(max(0.0, self.backoff_until - now))} after {level.label} "
                    f"timed out; then trying {nxt.label}{again}")
        if strict:
            clock += " (locality strict: it waits here, never relaxing further)"
        if self.skipped:
            clock += f"; {self.skipped}"
        want = _describe_level(gpus, level, self.view.fewest_servers(gpus) if len(self.view) else 1)
        if self.phase is Phase.ACQUIRING and self.plan is not None:
            missing = self._missing_parts()
            waits = ", ".join(f"{p.node_id} ({p.gpus})" for p in missing[:4])
            more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            return (f"waiting for {want}; {clock}; holding {self.held_gpus} of {gpus}, "
                    f"waiting on {waits}{more}")
        return f"waiting for {want}; {clock}; {self._best_hint(level)}"

    def _spread_reason(self, now: float) -> str:
        gpus = self.spec.gpus
        label = self._label()
        strict = self.spec.locality.mode is LocalityMode.STRICT
        if self.phase is Phase.BACKOFF:
            nxt = self._next_cap()
            then = f"spread:{nxt}" if nxt else "spread:any"
            again = " again (locality strict: never more GPUs per server)" if strict and nxt == self.cap else \
                " again" if nxt == self.cap else ""
            return (f"backing off {format_duration(max(0.0, self.backoff_until - now))} after {label} timed out; "
                    f"then trying {then}{again}")
        timeout = max(0.0, self._level_deadline() - self.level_since)
        clock = f"{label}, {format_duration(now - self.level_since)} of {format_duration(timeout)}"
        if strict:
            clock += " (locality strict: it waits here, never more GPUs per server)"
        per = "one GPU per server" if self.cap == 1 else f"at most {self.cap} per server" if self.cap else \
            "as many servers as are free"
        want = f"{gpus} GPUs spread, {per}"
        if self.phase is Phase.ACQUIRING and self.plan is not None:
            missing = self._missing_parts()
            waits = ", ".join(f"{p.node_id} ({p.gpus})" for p in missing[:4])
            more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            return f"waiting for {want}; {clock}; holding {self.held_gpus} of {gpus}, waiting on {waits}{more}"
        usable = [s for s in self.view.servers if s.node_id not in self.avoid and s.free]
        limit = self.cap or gpus
        room = sum(min(len(s.free), limit) for s in usable)
        return (f"waiting for {want}; {clock}; {len(usable)} server{'s' if len(usable) != 1 else ''} with a free GPU "
                f"offer {room} of them")

    def _best_hint(self, level: LocalityLevel) -> str:
        usable = [s for s in self.view.servers if s.node_id not in self.avoid]
        if not usable:
            return "no server is up"
        if level is LocalityLevel.NODE:
            best = max(usable, key=lambda s: (len(s.free), s.node_id))
            return f"the emptiest server, {best.node_id}, has {len(best.free)} free"
        if level is LocalityLevel.ANY:
            return f"{sum(len(s.free) for s in usable)} GPUs free in the whole cluster"
        by_domain: dict[str, list[ServerView]] = {}
        for s in usable:
            if s.free:
                by_domain.setdefault(s.domain, []).append(s)
        if not by_domain:
            return "no server has a free GPU"
        domain, members = max(by_domain.items(), key=lambda kv: (sum(len(s.free) for s in kv[1]), kv[0]))
        n = len(members)
        return (f"{n} server{'s' if n != 1 else ''} in rack {domain} hold "
                f"{sum(len(s.free) for s in members)} of them")


def _describe_level(gpus: int, level: LocalityLevel, fewest: int) -> str:
    if level is LocalityLevel.NODE:
        return f"{gpus} GPUs on one server"
    if level is LocalityLevel.PACKED:
        return f"{gpus} GPUs packed on {fewest} server{'s' if fewest != 1 else ''} in one rack"
    if level is LocalityLevel.RACK:
        return f"{gpus} GPUs in one rack"
    return f"{gpus} GPUs anywhere"
