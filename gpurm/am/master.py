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

This module holds the `Master`: its state (the fields that every part reads: level, hold, back-off, runs), the
shell's inputs and outputs, and `step`, which moves the machine on. The parts of the workflow are functions of the
Master in their own modules: its vocabulary (records.py: phases, grants, ends, actions, attempt records), which
level or spread cap comes next (levels.py), acquiring within a level's time and backing off (acquire.py), the
launches (launch.py), an attempt's bookkeeping and retries (attempts.py), an elastic job's size (resize.py) and why
a job waits (waiting.py); the planner (placement.py), relax-by-cost (relax.py) and the view (view.py) stand alone.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import cast

from gpurm.am.acquire import (
    enter_level,
    give_up_level,
    idle_at_last_level,
    is_wanted,
    level_deadline,
    make_plan,
    missing_parts,
    plan_taken,
    skip_idle_cycles,
    stuck_at_last_level,
)
from gpurm.am.attempts import (
    STOP_WAIT_S,
    after_stop,
    end_attempt,
    learner_succeeded,
    live_runs,
    new_attempt,
    sync_learners,
)
from gpurm.am.launch import launch_extra, launch_gang
from gpurm.am.levels import cap_floor, first_cap, first_level, next_cap, next_level, shape_floor
from gpurm.am.placement import Plan, ServerView, View, as_view
from gpurm.am.records import Action, AttemptRecord, Ended, Final, Held, Launch, Phase, Run, Stop
from gpurm.am.relax import CostRelax, FreeRate
from gpurm.am.resize import GROWTH_PAUSE_S, apply_target, asks_to_grow, drop_extra, gang_runs
from gpurm.am.waiting import refresh_waiting, why_waiting
from gpurm.common.jobspec import JobSpec, Placement
from gpurm.common.model import FailureKind, JobState

# The vocabulary lives in am/records.py; importing it from here keeps working.
__all__ = ["Action", "AttemptRecord", "Ended", "Final", "Held", "Launch", "Master", "Phase", "Run", "Stop"]


class Master:
    """One job's AM state machine: fed events with `now` (on_*), stepped by its timers (step, catch_up), and read
    for what to do (asks, take_actions, take_releases, take_reports, final)."""

    def __init__(self, spec: JobSpec, now: float, rng: random.Random | None = None, first_attempt: int = 1,
                 relax: CostRelax | None = None, job_id: str = "") -> None:
        self.spec = spec
        self.job_id = job_id
        # How long the RM expects the job to run (its allocate replies say): where it may use GPUs reserved for
        # another job, i.e. when it would vacate them before that job needs them (View.for_job).
        self.expected_run_s = 0.0
        self.spread = spec.placement is Placement.SPREAD
        self.cap = 0                   # a spread job's most GPUs per server now (0: no cap); see levels.first_cap
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
        self.level = first_level(self)
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
        new_attempt(self, first_attempt, now)

    # ------------------------------------------------------------ outputs

    @property
    def attempt(self) -> AttemptRecord:
        return self.attempts[-1]

    def asks(self) -> list[tuple[str, int, tuple[int, ...]]]:
        """Outstanding asks: (node, GPUs, preferred indices) for every part of the plan not yet held."""
        if self.phase is not Phase.ACQUIRING or self.plan is None:
            return []
        return [(p.node_id, p.gpus, p.gpu_indices if p.node_id else ()) for p in missing_parts(self)]

    def growth_asks(self, now: float) -> list[tuple[str, int, tuple[int, ...]]]:
        """An elastic job's asks to grow toward its target (sent as elastic asks): only while it runs."""
        return asks_to_grow(self, now)

    def set_target(self, gpus: int, now: float) -> None:
        """The RM's target for an elastic job (0: its max). Above the live size, growth asks for more; below it,
        the newest grown learners are stopped and given back (never the gang)."""
        apply_target(self, gpus)

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
            refresh_waiting(self, now)
        if not self.dirty:
            return []
        out = [a for a in self.attempts if a.number in self.dirty]
        self.dirty.clear()
        return out

    def waiting_reason(self, now: float) -> str:
        """Why the attempt is still waiting, at `now`, in words (am/waiting.py)."""
        return why_waiting(self, now)

    def next_deadline(self) -> float | None:
        """When `step` next has something to do by itself (a level timing out, a back-off ending, a stop wait
        running out); None when only an event can move it on."""
        if self.phase in (Phase.PLANNING, Phase.ACQUIRING):
            return level_deadline(self)
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
            if idle_at_last_level(self):
                skip_idle_cycles(self, now)
                continue
            self.step(deadline)

    def stuck(self, view: View | None = None) -> bool:
        """Idle at its last level with a plan that fails in `view` (its own by default): until the view gains free
        GPUs its timers only cycle through failing plans, which catch_up skips (a driver need not time it)."""
        return stuck_at_last_level(self, view)

    @property
    def idle(self) -> bool:
        """Planning or backing off with nothing held or asked: only GPUs coming free can move it on."""
        return self.phase in (Phase.PLANNING, Phase.BACKOFF) and not self.held and not self.asks()

    @property
    def live_gpus(self) -> int:
        """GPUs of the learners still running (an elastic job's size now)."""
        return sum(r.held.gpus for r in live_runs(self))

    @property
    def held_gpus(self) -> int:
        return sum(h.gpus for h in self.held.values())

    # ------------------------------------------------------------ inputs

    def on_view(self, servers: View | Sequence[ServerView], now: float) -> None:
        view = as_view(servers).for_job(self.job_id, now, self.expected_run_s)
        if self.relax is not None:
            self.frees.observe(self.view, view, now)
        self.view = view
        self.step(now)

    def on_grant(self, held: Held, now: float) -> None:
        if held.container_id in self.held or held.container_id in self.runs:
            return
        if self.phase is Phase.ACQUIRING and is_wanted(self, held):
            self.held[held.container_id] = held
        elif self.phase is Phase.RUNNING and self.spec.elastic and gang_runs(self) and \
                self.live_gpus + held.gpus <= self.target:
            launch_extra(self, held)
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
        sync_learners(self)
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
                learner_succeeded(self, run, now)
            else:
                user = ended.user_error and not ended.lost
                kind = FailureKind.INFRA if (ended.lost or ended.infra) and not user else FailureKind.USER
                if kind is FailureKind.INFRA:
                    self.avoid.add(run.held.node_id)
                cause = f"rank {run.rank} on {run.held.node_id} {ended.describe()}"
                end_attempt(self, kind, cause, ended.exit_code if not ended.signal else 128 + ended.signal, now,
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
            sync_learners(self)
            if self.phase is Phase.LAUNCHING and all(r.state == "RUNNING" for r in self.runs.values()):
                self.phase = Phase.RUNNING
                self.attempt.state = JobState.RUNNING
                self.attempt.launched_at = now
                self.attempt.waiting_reason = ""
                self.dirty.add(self.attempt.number)
        elif run.extra:
            run.state = "FAILED_TO_START"
            sync_learners(self)
            self.releases.append(container_id)
            self.growth_paused_until = now + GROWTH_PAUSE_S
        else:
            run.state = "FAILED_TO_START"
            sync_learners(self)
            infra = infra and not user_error
            if infra:
                self.avoid.add(run.held.node_id)
            kind = FailureKind.INFRA if infra else FailureKind.USER
            end_attempt(self, kind, f"rank {run.rank} on {run.held.node_id} failed to start: {diagnostics}",
                        0, now, fatal=user_error)
        self.step(now)

    def on_preempted(self, container_ids: Iterable[str], grace_s: float, now: float, reason: str = "") -> None:
        """The RM takes these containers back; `reason` is the RM's (fair share or in-queue, and for whom)."""
        ids = set(container_ids)
        if not ids & (set(self.held) | {cid for cid, r in self.runs.items() if r.live}):
            return
        extras = {cid for cid in ids if (r := self.runs.get(cid)) is not None and r.extra}
        if extras and extras == ids - set(self.held) and self.phase is Phase.RUNNING:
            # Only grown learners are taken back (rm/sched/elastic.py): the job shrinks and goes on.
            for cid in sorted(extras):
                drop_extra(self, self.runs[cid], reason or "elastic GPUs taken back", grace_s)
            return
        if self.phase in (Phase.RUNNING, Phase.LAUNCHING):
            end_attempt(self, FailureKind.PREEMPTED, reason or "preempted: the RM took its GPUs back",
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
        for run in live_runs(self):
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
            new_attempt(self, last.number + 1, now)
        else:
            last.state = JobState.ALLOCATING
            last.learners = []
            self.dirty.add(last.number)
            self.cap = first_cap(self)
            enter_level(self, first_level(self), now)
        self.step(now)

    # ------------------------------------------------------------ the machine

    def step(self, now: float) -> None:
        if self.phase is Phase.DONE or self.phase is Phase.RUNNING or self.phase is Phase.LAUNCHING:
            return         # only events move these on
        if self.phase is Phase.STOPPING:
            if live_runs(self) and now < self.stop_since + STOP_WAIT_S:   # same expression as next_deadline
                return
            after_stop(self, now)
            if cast(Phase, self.phase) is not Phase.PLANNING:   # after_stop moved it on
                return
        if self.phase is Phase.BACKOFF:
            if now < self.backoff_until:
                return
            if self.spread:
                self.cap = next_cap(self)
            enter_level(self, next_level(self), now)
        if self.phase is Phase.PLANNING and shape_floor(self, self.level) is not self.level:
            enter_level(self, self.level, now)    # the cluster's shape can never hold the job here: skip at once
        if self.phase is Phase.PLANNING and self.spread and cap_floor(self, self.cap) != self.cap:
            enter_level(self, self.level, now)    # the same for a spread job's cap (the view came after entering)
        if self.phase is Phase.PLANNING:
            self.plan = make_plan(self) if len(self.view) else None
            if self.plan is not None:
                self.phase = Phase.ACQUIRING
                self.plan_replies = 0
        if self.phase is Phase.ACQUIRING and self.plan is not None and not missing_parts(self):
            launch_gang(self)
            return
        if self.phase is Phase.ACQUIRING and not self.held:
            if not plan_taken(self):
                self.plan_replies = 0          # its servers look free: a grant may well be on its way
            elif self.plan_replies >= 2:
                # Somebody got the planned servers first (many AMs plan from one view). Holding nothing, plan
                # again at the same level at once; the level's clock keeps running.
                self.plan = make_plan(self)
                self.plan_replies = 0
                if self.plan is None:
                    self.phase = Phase.PLANNING
        if self.phase in (Phase.PLANNING, Phase.ACQUIRING) and \
                now >= level_deadline(self):   # same expression as next_deadline
            give_up_level(self, now)

    @property
    def plan_looks_taken(self) -> bool:
        """Acquiring, holding nothing, with a plan whose servers the view shows busy: another reply or two
        settles whether to plan again (a driver should call again soon rather than wait for the timeout)."""
        return self.phase is Phase.ACQUIRING and not self.held and plan_taken(self)

    def plan_taken_in(self, view: View) -> bool:
        """Whether `view` (perhaps newer than the AM's) shows a server of its plan without the GPUs the plan needs
        there: a driver's cheap test of whether a grant to somebody else concerns this AM."""
        return plan_taken(self, view)

