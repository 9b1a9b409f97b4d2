"""`Agents`: the node agents' part in the simulator. Learners start the moment their AM launches them (one
RUNNING heartbeat per server), end when their work is done (the FINISH event), when the RM or the AM stops them
(stop orders, preemption deadlines, an AM's stop: at once), or when an injected failure takes one (the FAIL
event: LOST); every end goes to the RM as the agent's heartbeat report would, and to the run-time model
(sim/progress.py). Each attempt's FINISH event and its failure draw are queued here as it starts."""

from __future__ import annotations

from gpurm.am.records import Launch
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ContainerReport
from gpurm.sim.clock import FINISH, EventQueue
from gpurm.sim.failures import FailureInjector
from gpurm.sim.progress import RunProgress
from gpurm.sim.runtime import RuntimeConfig
from gpurm.sim.simam import SimAM


class Agents:
    def __init__(self, core: RMCore, ams: dict[str, SimAM], dirty: dict[str, None], beneficiary: dict[str, str],
                 queue: EventQueue, progress: RunProgress, failures: FailureInjector,
                 runtime: RuntimeConfig | None) -> None:
        self.core = core
        self.ams = ams
        self.dirty = dirty                  # the engine's AMs to drive (shared)
        self.beneficiary = beneficiary      # in-queue preemption victim -> the job it makes room for (shared)
        self.queue = queue
        self.progress = progress
        self.failures = failures
        self.runtime = runtime              # the `placement` model's constants; None: `ideal`

    # ------------------------------------------------------------ learners starting

    def launch(self, am: SimAM, launch: Launch, now: float) -> None:
        if all((r := am.master.runs.get(h.container_id)) is not None and r.extra for h, _, _ in launch.learners):
            if am.run is not None and not am.run.ended and self.runtime is not None:
                self.grow(am, launch, now)
            else:
                # Granted in the reply that also brought the end of its gang, which the AM had not heard yet:
                # the learners start into an attempt that is over, and its AM stops them with the others.
                self.start_learners(am, launch, now)
            return
        containers = {h.container_id: h.node_id for h, _, _ in launch.learners}
        run = self.progress.new_run(containers, now)
        am.run = run
        self.start_learners(am, launch, now)
        if am.first_start is None:
            am.first_start = now
        remaining = max(0.0, am.trace.duration_s - am.progress_s)
        if self.runtime is None:
            self.queue.push(now + remaining, FINISH, (am.job_id, run.token, 0))
        else:
            self.progress.start_timed(am, self.runtime, now)
        self.failures.draw(am.job_id, am.trace.gpus, run.token, containers, remaining, now)
        self.dirty[am.job_id] = None

    def start_learners(self, am: SimAM, launch: Launch, now: float) -> None:
        """The agents report the learners running (one heartbeat per server) and the AM hears they started."""
        by_node: dict[str, list[ContainerReport]] = {}
        for h, _, _ in launch.learners:
            by_node.setdefault(h.node_id, []).append(ContainerReport(h.container_id, "RUNNING", pid=1))
        for node_id, reports in by_node.items():
            self.report(node_id, reports, now)
        for h, _, _ in launch.learners:
            am.master.on_started(h.container_id, True, 1, "", False, now)

    def grow(self, am: SimAM, launch: Launch, now: float) -> None:
        """Grown learners of a running elastic job start (`placement` model): the job re-forms with them."""
        assert am.run is not None and self.runtime is not None
        self.start_learners(am, launch, now)
        grown = {**am.run.containers, **{h.container_id: h.node_id for h, _, _ in launch.learners}}
        self.progress.resize(am, grown, self.runtime, now)
        self.dirty[am.job_id] = None

    # ------------------------------------------------------------ learners ending

    def learners_done(self, job_id: str, token: int, seq: int, now: float) -> None:
        am = self.ams.get(job_id)          # a stale event: the job may have ended another way meanwhile
        if am is None or am.run is None or am.run.token != token or am.run.ended or am.run.finish_seq != seq:
            return
        by_node: dict[str, list[str]] = {}
        for cid, node in am.run.containers.items():
            by_node.setdefault(node, []).append(cid)
        for node, cids in by_node.items():
            for cid in cids:
                self.end_container(cid, node, ContainerReport(cid, "EXITED", exit_code=0), now)

    def learner_failed(self, job_id: str, token: int, node: str, now: float) -> None:
        am = self.ams.get(job_id)
        if am is None or am.run is None or am.run.token != token or am.run.ended:
            return
        cid = next(c for c, n in am.run.containers.items() if n == node)
        self.end_container(cid, node, ContainerReport(cid, "LOST", diagnostics="injected failure", infra_failure=True),
                           now)

    def end_container(self, cid: str, node: str, report: ContainerReport, now: float) -> None:
        c = self.core.live.get(cid)
        if c is None:
            return
        job_id = c.job_id
        am = self.ams.get(job_id)
        if c.elastic and am is not None and am.run is not None and cid in am.run.containers and not am.run.ended \
                and not (report.state == "EXITED" and report.exit_code == 0 and not report.stopped) \
                and self.runtime is not None:
            # A grown learner taken back (or failed): the job re-forms without it and goes on.
            self.progress.resize(am, {k: v for k, v in am.run.containers.items() if k != cid}, self.runtime, now)
            self.report(node, [report], now)
            self.dirty[job_id] = None
            return
        if am is not None and am.run is not None and cid in am.run.containers and not am.run.ended:
            am.run.ended = True                           # the attempt's work stops with its first learner
            if self.runtime is None:
                am.progress_s += now - am.run.start       # instant checkpoints: every second counts
            else:
                self.progress.end_timed(am, self.runtime, report, now)
        self.report(node, [report], now)
        self.dirty[job_id] = None
        waiting = self.beneficiary.pop(job_id, None)
        if waiting is not None and waiting in self.ams:
            # GPUs came free for it: let it look (its plan may be elsewhere), before the victim asks again.
            self.dirty.pop(waiting, None)
            self.dirty.pop(job_id, None)
            self.dirty[waiting] = None
            self.dirty[job_id] = None

    def apply_stop_orders(self, now: float) -> None:
        """The RM's stop orders (preemption deadlines, kills, finished jobs): the processes stop at once."""
        for node_id in self.core.nodes_with_stops():
            for order in self.core.take_stops(node_id, now):
                c = self.core.live.get(order.container_id)
                if c is not None:
                    self.end_container(order.container_id, node_id,
                                       ContainerReport(order.container_id, "EXITED", signal=15, stopped=True), now)

    def report(self, node_id: str, reports: list[ContainerReport], now: float) -> None:
        """A heartbeat from the node's agent carrying these container reports."""
        self.core.node_heartbeat(node_id, node_id, reports, now)
