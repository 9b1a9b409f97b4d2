"""`AMShells`: the AM processes' part in the simulator, around one real `Master` per job: starting an AM when the
RM launches one (its Master, its random stream, its relax policy), driving it (the current view, an allocate
call with its asks, releases and reports, then the reply's grants, preemption notices, ends and kills handed to
the Master, as am/runner.py does), carrying out what the Master decides (launches and stops, through the agents),
and its end (the final report to the RM, the job's result)."""

from __future__ import annotations

import random
import zlib

from gpurm.am.master import Master
from gpurm.am.records import AttemptRecord, Ended, Held, Launch, Phase, Stop
from gpurm.am.relax import CostRelax
from gpurm.common.model import Container, ExitKind
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import AttemptUpdate, ContainerReport, LaunchAM
from gpurm.sim.agents import Agents
from gpurm.sim.clusterview import SharedView
from gpurm.sim.options import RelaxPolicy, SimOptions
from gpurm.sim.recorder import Recorder
from gpurm.sim.runtime import RuntimeConfig, sensitivity_of
from gpurm.sim.simam import SimAM
from gpurm.sim.trace import TraceJob
from gpurm.sim.waking import Waker


class AMShells:
    def __init__(self, core: RMCore, ams: dict[str, SimAM], dirty: dict[str, None], pending: dict[str, TraceJob],
                 options: SimOptions, views: SharedView, agents: Agents, waker: Waker, recorder: Recorder) -> None:
        self.core = core
        self.ams = ams                      # the live AMs by job id (shared)
        self.dirty = dirty                  # the AMs to drive next (shared)
        self.pending = pending              # submitted jobs whose AM has not started yet (shared)
        self.options = options
        self.runtime = options.runtime      # the `placement` model's constants; None: `ideal`
        self.views = views
        self.agents = agents
        self.waker = waker
        self.recorder = recorder

    def start_ams(self, now: float) -> None:
        outbox = self.core.take_outbox()
        if not outbox:
            return
        for effect in [e for e in outbox if type(e) is LaunchAM]:
            tj = self.pending.pop(effect.job_id)
            self.agents.report(effect.node_id, [ContainerReport(effect.container_id, "RUNNING", pid=1)], now)
            job, _ = self.core.register_am(effect.job_id, effect.am_attempt, now)
            seed = zlib.crc32(f"{self.options.seed}:{tj.job_id}".encode())
            sensitivity = (sensitivity_of(tj.job_id, tj.name, tj.sensitivity, self.runtime, self.options.seed,
                                          tj.locality.mode if tj.locality is not None else None)
                           if self.runtime is not None else 0.0)
            # The simulator's cost-based AM knows each job's run time from the trace (an oracle, like srtf).
            # Its slowdowns come from the run-time model's constants (the defaults under `ideal`).
            relax = (CostRelax(tj.duration_s, sensitivity=sensitivity if self.runtime is not None else 1.0,
                               config=self.runtime or RuntimeConfig())
                     if self.options.relax is RelaxPolicy.COST else None)
            master = Master(job.spec, now, rng=random.Random(seed), relax=relax, job_id=effect.job_id)
            master.expected_run_s = self.core.expected_run_s(job)
            am = SimAM(effect.job_id, tj, master, effect.am_attempt, effect.container_id, effect.node_id)
            am.sensitivity = sensitivity
            self.ams[effect.job_id] = am
            master.on_view(self.views.current(), now)
            self.dirty[effect.job_id] = None

    def drive(self, am: SimAM, now: float) -> None:
        m = am.master
        waker = self.waker
        if am.job_id in waker.idle_key:
            waker.set_idle(am, now, False)
        m.catch_up(now)
        m.on_view(self.views.current(), now)     # the current view, and a step
        planned = m.asks()
        asks = [Ask(gpus=g, node_id=n, preferred=idx) for n, g, idx in planned]
        if am.trace.max_gpus:
            asks += [Ask(gpus=g, node_id=n, preferred=idx, elastic=True) for n, g, idx in m.growth_asks(now)]
        waker.track_asks(am.job_id, tuple(n for n, _, _ in planned) if not m.held else ())
        reports = [_update(a) for a in m.take_reports(None)] if m.dirty else []
        r = self.core.allocate(am.job_id, am.am_attempt, am.response_id, asks, m.take_releases(), reports, now,
                               schedule=False)
        am.response_id = r.response_id
        m.expected_run_s = r.expected_run_s
        if asks:
            waker.run_pass(now)      # an RM under light load answers asks at once: later AMs see the grants
        for g in r.grants:
            node = self.core.cluster.nodes[g.node_id]
            m.on_grant(Held(g.container_id, g.node_id, node.rack, node.host, 1, tuple(g.gpu_indices),
                            preemptible=g.preemptible), now)
        if r.preempt_ids:          # the notice before the ends, as the AM process does (am/runner.py)
            m.on_preempted(r.preempt_ids, max(0.0, r.preempt_deadline - now), now, r.preempt_reason)
        for c in r.completed:
            m.on_ended(_ended(c), now)
        if r.kill_requested:
            m.on_kill("killed", now)
        if r.plan_now:
            m.on_room(now)
        m.on_reply()
        self.execute(am, m.take_actions(), now)
        if m.final is not None:
            waker.growers.pop(am.job_id, None)
            self.finish(am, now)
            return
        if am.trace.max_gpus:
            if m.phase is Phase.RUNNING and m.live_gpus < m.target:
                waker.growers[am.job_id] = None
            else:
                waker.growers.pop(am.job_id, None)
        if m.releases or m.dirty or m.plan_looks_taken:
            self.dirty[am.job_id] = None          # more to tell the RM, or its plan to settle
        if m.idle:
            waker.set_idle(am, now, True)
            if self.views.current().total_free < am.trace.gpus or waker.stuck(am, m.view):
                return                            # nothing can fit until GPUs come free: wake_planners will call
        waker.arm_timer(am, now)
        waker.sync_dormant(am)

    def execute(self, am: SimAM, actions: list[Launch | Stop], now: float) -> None:
        for action in actions:
            if isinstance(action, Launch):
                self.agents.launch(am, action, now)
            else:
                self.agents.end_container(action.held.container_id, action.held.node_id,
                                          ContainerReport(action.held.container_id, "EXITED", signal=15, stopped=True),
                                          now)

    def finish(self, am: SimAM, now: float) -> None:
        m = am.master
        assert m.final is not None
        core = self.core
        core.finish_am(am.job_id, am.am_attempt, m.final.state, m.final.diagnostics, m.final.exit_code,
                       [_update(a) for a in m.take_reports(None)], now)
        self.agents.apply_stop_orders(now)
        self.agents.report(am.am_node, [ContainerReport(am.am_container, "EXITED", exit_code=0)], now)
        am.done = True
        self.waker.set_idle(am, now, False)
        self.waker.track_asks(am.job_id, ())
        self.recorder.finished(am, now)
        del self.ams[am.job_id]


def _update(a: AttemptRecord) -> AttemptUpdate:
    return AttemptUpdate(a.number, a.state, a.learners, "", a.level, a.failure, a.cause, a.exit_code,
                         a.counts_as_failure, a.start_time, a.end_time)


def _ended(c: Container) -> Ended:
    kind = c.exit.kind
    return Ended(c.container_id, exit_code=c.exit.exit_code, signal=c.exit.signal,
                 stopped=kind in (ExitKind.STOPPED, ExitKind.RELEASED),
                 failed_to_start=kind is ExitKind.FAILED_TO_START, lost=kind in (ExitKind.LOST, ExitKind.EXPIRED),
                 infra=c.exit.infra, diagnostics=c.exit.diagnostics)
