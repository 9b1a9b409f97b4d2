"""`RunProgress`: how far each running attempt's work has got, and so when its learners finish. Each attempt
gets a token (its FINISH and FAIL events name it; a stale one is dropped). Under the `placement` run-time model
(sim/runtime.py) an attempt's rate follows its spread, its racks and its neighbours (the multi-server jobs it
shares servers with), so an attempt starting or stopping re-times its neighbours' FINISH events; what an
interrupted attempt keeps is what it had done at its last checkpoint, and what it lost is charged to preemption
or failure. Elastic jobs re-form at each resize. Under `ideal` only the tokens are used here."""

from __future__ import annotations

from gpurm.am.placement import fewest_of
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ContainerReport
from gpurm.sim.clock import FINISH, EventQueue
from gpurm.sim.clusterspec import SimServer
from gpurm.sim.clusterview import SharedView
from gpurm.sim.runtime import RuntimeConfig, checkpointed, elastic_speedup, rate
from gpurm.sim.simam import Run, SimAM


class RunProgress:
    """The attempts' tokens, and the `placement` model's bookkeeping: the running multi-server jobs on each
    server, and the shape of the cluster."""

    def __init__(self, servers: list[SimServer], core: RMCore, ams: dict[str, SimAM], queue: EventQueue,
                 views: SharedView) -> None:
        self.core = core                        # its container records: the GPUs an elastic run holds
        self.ams = ams
        self.queue = queue
        self.views = views
        self._token = 0
        self.on_server: dict[str, dict[str, None]] = {}
        self.rack_of = {s.node_id: s.rack for s in servers}
        rack_gpus: dict[str, int] = {}
        for s in servers:
            rack_gpus[s.rack] = rack_gpus.get(s.rack, 0) + s.gpus
        self._rack_sizes = sorted(rack_gpus.values(), reverse=True)

    def new_run(self, containers: dict[str, str], now: float) -> Run:
        """A run under a fresh token: the events of the job's earlier runs no longer apply."""
        self._token += 1
        return Run(self._token, now, containers)

    def start_timed(self, am: SimAM, config: RuntimeConfig, now: float) -> None:
        """An attempt starts under the `placement` model: its rate, its neighbours' (it now shares their links),
        and its FINISH event."""
        run = am.run
        assert run is not None
        run.productive_from = now + (config.restart_cost_s if am.restart_after else 0.0)
        run.accounted_at = now
        run.gpus = am.trace.gpus
        touched: dict[str, None] = {am.job_id: None}
        self.join_servers(am.job_id, run, touched)
        self.retime(touched, config, now)

    def join_servers(self, job_id: str, run: Run, touched: dict[str, None]) -> None:
        """Note the run's servers and racks; a run on several servers shares their links with the multi-server
        jobs already there, which go into `touched` (their rates change)."""
        nodes = tuple(sorted(set(run.containers.values())))
        run.racks = len({self.rack_of[n] for n in nodes})
        if len(nodes) > 1:
            run.nodes = nodes
            for n in nodes:
                jobs = self.on_server.setdefault(n, {})
                touched.update(jobs)
                jobs[job_id] = None

    def leave_servers(self, job_id: str, run: Run, touched: dict[str, None]) -> None:
        """The run stops sharing its servers' links: the jobs left there go into `touched`."""
        for n in run.nodes:
            jobs = self.on_server.get(n)
            if jobs is not None:
                jobs.pop(job_id, None)
                touched.update(jobs)
        run.nodes = ()

    def end_timed(self, am: SimAM, config: RuntimeConfig, report: ContainerReport, now: float) -> None:
        """An attempt's work stops: keep what it finished or checkpointed, count what was lost, and re-time the
        jobs that shared its servers."""
        run = am.run
        assert run is not None
        self.accrue(am, run, now)
        gpus = am.trace.gpus
        restart_s = min(now, run.productive_from) - run.start
        finished = (report.state == "EXITED" and report.exit_code == 0 and not report.stopped
                    and not report.infra_failure)
        if finished:
            am.progress_s = am.trace.duration_s
            wasted = restart_s
        else:
            productive = now - run.productive_from
            saved = checkpointed(productive, config.checkpoint_interval_s)
            am.progress_s = min(am.trace.duration_s, am.progress_s + work_at(run, run.productive_from + saved))
            wasted = restart_s + max(0.0, productive - saved)
        cause = am.restart_after               # the restart paid in this attempt was caused by the last interruption
        if not finished:
            am.restart_after = "failure" if report.infra_failure else "preemption"
        # Restart time is charged to what caused it; work lost since the checkpoint to what ended this attempt.
        lost_restart = max(0.0, restart_s) * gpus
        lost_work = (wasted - max(0.0, restart_s)) * gpus
        for what, gpu_s in ((cause, lost_restart), ("" if finished else am.restart_after, lost_work)):
            if what == "failure":
                am.lost_failure_gpu_s += gpu_s
            elif what == "preemption":
                am.lost_preemption_gpu_s += gpu_s
        touched: dict[str, None] = {}
        self.leave_servers(am.job_id, run, touched)
        self.retime(touched, config, now)

    def accrue(self, am: SimAM, run: Run, now: float) -> None:
        """Count the work done at the current rate up to now."""
        begin = max(run.accounted_at, run.productive_from)
        if now > begin:
            run.work += (now - begin) * run.rate
            am.run_s += now - begin
            am.slow_s += (now - begin) / run.rate
        run.accounted_at = max(run.accounted_at, now)

    def retime(self, job_ids: dict[str, None], config: RuntimeConfig, now: float) -> None:
        """Recompute the rate of these running jobs and move their FINISH events to match."""
        view = self.views.current()
        for job_id in job_ids:
            am = self.ams.get(job_id)
            run = am.run if am is not None else None
            if am is None or run is None or run.ended:
                continue
            gpus = am.trace.gpus if not am.trace.max_gpus else run.gpus
            servers = max(len(run.nodes), 1)
            neighbours = max((len(self.on_server[n]) - 1 for n in run.nodes), default=0)
            new_rate = rate(config, am.sensitivity, servers, view.fewest_servers(gpus), run.racks,
                            fewest_of(gpus, self._rack_sizes), neighbours)
            if am.trace.max_gpus:
                new_rate *= elastic_speedup(config, gpus, am.trace.gpus)
            if run.breaks and new_rate == run.rate:
                continue
            self.accrue(am, run, now)
            run.rate = new_rate
            run.breaks.append((now, run.work, new_rate))
            left = max(0.0, am.trace.duration_s - am.progress_s - run.work)
            run.finish_seq += 1
            self.queue.push(max(now, run.productive_from) + left / new_rate, FINISH,
                            (job_id, run.token, run.finish_seq))

    def resize(self, am: SimAM, containers: dict[str, str], config: RuntimeConfig, now: float) -> None:
        """An elastic job's learners changed. Its workers restart from a checkpoint taken at the resize (all work
        so far is kept: torchrun's elastic restart), and after `resize_cost_s` it runs at the new size's rate: a
        new run, as far as the FINISH events and the run-time model know."""
        run = am.run
        assert run is not None
        self.accrue(am, run, now)
        am.progress_s = min(am.trace.duration_s, am.progress_s + run.work)
        touched: dict[str, None] = {am.job_id: None}
        self.leave_servers(am.job_id, run, touched)
        new = self.new_run(containers, now)
        new.productive_from = now + config.resize_cost_s
        new.accounted_at = now
        new.gpus = sum(self.core.containers[cid].gpus for cid in containers if cid in self.core.containers)
        self.join_servers(am.job_id, new, touched)
        am.run = new
        self.retime(touched, config, now)


def work_at(run: Run, t: float) -> float:
    """The work an attempt had done at time t (not after the last accrual): rates are constant between breaks."""
    work = 0.0
    for at, done, r in run.breaks:
        if at > t:
            break
        work = done + max(0.0, t - max(at, run.productive_from)) * r
    return work
