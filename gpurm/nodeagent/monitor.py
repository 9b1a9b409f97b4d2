"""The agent's health and telemetry loops (the shell around `health.py` and `telemetry.py`).

- GPU health, every `health.gpu_interval`: the provider's observations (XID events, lost GPUs, ECC) go through
  `GpuHealthBook`; a GPU that turns unhealthy is marked on the shared `GpuDevice` (the ContainerManager then
  refuses to start anything on it), every container using it is stopped and reported as an infrastructure
  failure with a diagnostic naming the GPU, and the next heartbeat (sent at once) tells the RM, which stops
  offering it.
- The admin health script, every `health.interval` (when `health.script` is set): see `health.py` for what its
  output means; a changed verdict goes to the RM at once (node UNHEALTHY: offered nothing).
- Telemetry, every `telemetry.interval`: the node's reading (JSON) goes in the next heartbeat
  (`NodeHeartbeat.telemetry`; the RM republishes it retained on `gpurm/telemetry/<node_id>`: agents publish
  nothing on the broker) and is summarised per container (`ContainerUsage`).
- Container usage, every `telemetry.container_interval` (15 s): each live container's CPU cores, resident memory
  (`procstats.py`: its cgroup's counters, else summed over its processes) and GPU utilisation (the latest GPU
  telemetry) are appended to its bounded series (`series.py`, `<container dir>/usage.jsonl`). Its phases
  (`gpurm/rightsize/phases.py`) are found again from the agent's own copy once a minute, or sooner while the series
  is young, and a changed one-line summary (phases, recommended request) rides the next heartbeat
  (`ContainerUsage.rightsize`) to `gpurm status JOB`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from gpurm.common.aio import stop_tasks, within
from gpurm.nodeagent.cgroups import set_memory_high
from gpurm.nodeagent.config import AgentConfig
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.gpus import GpuDevice, GpuProvider
from gpurm.nodeagent.health import (
    GpuHealthBook,
    HealthChange,
    NodeHealth,
    ScriptOutcome,
    ScriptResult,
    describe_xid,
    interpret_script,
)
from gpurm.nodeagent.metrics import GpuReading, GpuTally
from gpurm.nodeagent.procstats import CpuMeter, Reading, read_container
from gpurm.nodeagent.records import ContainerRecord
from gpurm.nodeagent.series import ContainerSeries, series_path
from gpurm.nodeagent.sharing import GpuMemoryGuard
from gpurm.nodeagent.telemetry import node_payload, summarise
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rightsize.limit import RAISE_AT, ceiling_mib, phase_limit_mib
from gpurm.rightsize.phases import PhaseModel, discover

log = logging.getLogger(__name__)

MAX_SCRIPT_OUTPUT = 64 * 1024
PHASES_EVERY_S = 60.0          # phases are found again at least this often ...
PHASES_GROWTH = 20             # ... or when the series grew by 1/20 since the last time (young series: often)


async def run_health_script(script: Path, timeout_s: float) -> ScriptResult:
    """Run the admin health script once (own session, killed with its group on timeout)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            str(script), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return interpret_script("", None, cannot_run=f"{script}: {exc.strerror or exc}")
    try:
        out, _ = await within(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        return interpret_script("", proc.returncode, timed_out=True)
    return interpret_script(out[:MAX_SCRIPT_OUTPUT].decode(errors="replace"), proc.returncode)


class AgentMonitor:
    def __init__(self, cfg: AgentConfig, provider: GpuProvider, gpus: Sequence[GpuDevice],
                 supervisor: ContainerSupervisor, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.provider = provider
        self.gpus = list(gpus)
        self.supervisor = supervisor
        self.clock = clock
        self.book = GpuHealthBook(self.gpus)
        self.node = NodeHealth()
        self.on_change: Callable[[], None] | None = None   # the tracker's wake(): report now
        self.samples = 0
        self._usage: dict[str, str] = {}                   # summaries not yet sent to the RM
        self._registered: dict[int, tuple[bool, str]] = {}  # GPU health as the last registration carried it
        self._telemetry = b""                              # the latest reading not yet sent to the RM
        self._tasks: set[asyncio.Task[Any]] = set()
        self.series: dict[str, ContainerSeries] = {}       # live containers' usage series
        self._cpu: dict[str, CpuMeter] = {}
        self._gpu_util: dict[str, float | None] = {}       # latest GPU utilisation per container
        self._phases: dict[str, str] = {}                  # phase summaries not yet sent to the RM
        self._phases_sent: dict[str, str] = {}
        self._phases_at: dict[str, tuple[int, float]] = {}  # (samples, time) when phases were last found
        self._models: dict[str, PhaseModel] = {}           # the latest phases per container
        self.memory_high: dict[str, float] = {}            # `rightsize: on`: the memory.high written, MiB
        self.tally = GpuTally()                            # XIDs and ECC events, for the Prometheus exporter
        self.gpu_memory = GpuMemoryGuard()                 # shared GPUs: each job held to its memory share
        self.reading = GpuReading()                        # the latest telemetry, for the Prometheus exporter
        self._rightsize_warned: set[str] = set()

    # ------------------------------------------------------------------ wiring

    def decorate(self, msg: pb.RegisterNodeRequest | pb.NodeHeartbeat) -> None:
        """Put node health, changed GPU health and fresh usage summaries into an outgoing message."""
        msg.healthy = self.node.healthy
        msg.health_report = self.node.report
        if isinstance(msg, pb.RegisterNodeRequest):
            # Its GpuInfo list was built from the same GpuDevice objects a moment ago: already current.
            self._registered = {g.index: (g.healthy, g.health_reason) for g in self.gpus}
            return
        for g in self.gpus:
            # Re-sent on every beat until the next registration: a lost beat loses nothing, and the RM's
            # update is idempotent.
            if (g.healthy, g.health_reason) != self._registered.get(g.index, (True, "")):
                msg.gpu_health.append(pb.GpuInfo(index=g.index, uuid=g.uuid, healthy=g.healthy,
                                                 health_reason=g.health_reason))
        usage, self._usage = self._usage, {}
        phases, self._phases = self._phases, {}
        msg.usage.extend(pb.ContainerUsage(container_id=cid, summary=usage.get(cid, ""),
                                           rightsize=phases.get(cid, ""))
                         for cid in sorted(usage.keys() | phases.keys()))
        msg.telemetry, self._telemetry = self._telemetry, b""

    # ------------------------------------------------------------------ GPU health

    def check_gpus(self) -> list[HealthChange]:
        """Poll the provider once and apply what it saw (also called before the first registration)."""
        events = self.provider.poll_events()
        return self._apply(events)

    def _apply(self, events: Sequence[Any]) -> list[HealthChange]:
        self.tally.observe(events)
        changes = self.book.observe(events, self.clock())
        for ev in self.book.ignored:
            log.info("GPU %d: %s (not a hardware fault: GPU stays in service)", ev.index, describe_xid(ev.xid))
        self.book.ignored = []
        if not changes:
            return changes
        holders = self.supervisor.gpus_in_use()
        for change in changes:
            log.error("%s: taken out of service", change.diagnostic)
            cid = holders.get(change.index)
            if cid is not None:
                self._fail_container(cid, change)
        if self.on_change is not None:
            self.on_change()
        return changes

    def _fail_container(self, cid: str, change: HealthChange) -> None:
        rec = self.supervisor.record(cid)
        if rec is None or rec.terminal or rec.stopped:
            return
        rec.infra_failure = True  # reported with its end: the job's attempt fails as an infrastructure fault
        log.warning("container %s (job %s): stopping, %s", cid, rec.job_id, change.diagnostic)
        self._spawn(self.supervisor.stop(cid, self.cfg.containers.stop_grace_s, change.diagnostic))

    async def _gpu_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health.gpu_interval_s)
            try:
                events = await asyncio.to_thread(self.provider.poll_events)
            except Exception:
                log.exception("GPU health check failed")
                continue
            self._apply(events)

    # ------------------------------------------------------------------ the admin script

    async def _script_loop(self, script: Path) -> None:
        while True:
            result = await run_health_script(script, self.cfg.health.timeout_s)
            self.apply_script(result)
            await asyncio.sleep(self.cfg.health.interval_s)

    def apply_script(self, result: ScriptResult) -> None:
        if result.outcome is ScriptOutcome.TIMED_OUT:
            log.warning("health script %s did not finish in %.0fs: killed; the node's health is unchanged",
                        self.cfg.health.script, self.cfg.health.timeout_s)
        elif result.outcome is ScriptOutcome.OK and result.exit_code:
            log.info("health script exited with %d and printed no ERROR line: the node stays healthy",
                     result.exit_code)
        if self.node.apply(result, self.clock()):
            if self.node.healthy:
                log.info("health script: node healthy again")
            else:
                log.error("health script: node unhealthy: %s", self.node.report)
            if self.on_change is not None:
                self.on_change()

    # ------------------------------------------------------------------ telemetry

    async def sample_once(self) -> None:
        holders = self.supervisor.gpus_in_use()
        samples = await asyncio.to_thread(self.provider.sample, holders)
        self.samples += 1
        containers = {r.container_id: list(r.gpu_indices) for r in self.supervisor.records()
                      if r.live and r.gpu_indices}
        summaries = summarise(samples, containers)
        self._gpu_util = {cid: s.util_avg_pct for cid, s in summaries.items()}
        self._usage.update({cid: s.text() for cid, s in summaries.items()})
        self._telemetry = node_payload(self.cfg.node_id, int(time.time() * 1000), self.gpus, samples, holders,
                                       summaries)
        records = self.supervisor.records()
        await self._guard_shares([r for r in records if r.live and r.share_milli and r.gpu_memory_mib])
        self.reading = GpuReading(list(samples), dict(holders), {r.container_id: r.job_id for r in records},
                               Counter(pb.ContainerState.Name(r.state).removeprefix("CONTAINER_") for r in records))

    async def _guard_shares(self, shared: Sequence[ContainerRecord]) -> None:
        """Stop a container on a shared GPU that keeps more GPU memory than its share (nodeagent/sharing.py)."""
        self.gpu_memory.forget({r.container_id for r in shared})
        if not shared:
            return
        indices = sorted({g for r in shared for g in r.gpu_indices})
        usage = await asyncio.to_thread(self.provider.process_memory, indices)
        for rec in shared:
            if rec.stopped or not any(g in usage for g in rec.gpu_indices):
                continue                 # stopping already, or the GPU cannot tell per process
            pids = self.supervisor.processes(rec.container_id)
            used = sum(mib for g in rec.gpu_indices for pid, mib in usage.get(g, {}).items() if pid in pids)
            why = self.gpu_memory.observe(rec.container_id, used, rec.gpu_memory_mib)
            if why:
                log.warning("container %s (job %s): %s", rec.container_id, rec.job_id, why)
                rec.user_error = True    # the job's own doing: reported with its end
                rec.diagnostics = why
                self._spawn(self.supervisor.stop(rec.container_id, self.cfg.containers.stop_grace_s, why))

    async def _telemetry_loop(self) -> None:
        while True:
            try:
                await self.sample_once()
            except Exception:
                log.exception("GPU telemetry failed")
            await asyncio.sleep(self.cfg.telemetry.interval_s)

    # ------------------------------------------------------------------ container usage series

    def _read_containers(self, wanted: dict[str, Path | None]) -> dict[str, Reading]:
        """Blocking (/proc scans): run in a thread."""
        return {cid: read_container(self.supervisor.processes(cid), cgroup) for cid, cgroup in wanted.items()}

    async def sample_containers(self) -> None:
        live = {r.container_id: (Path(r.cgroup) if r.cgroup else None) for r in self.supervisor.records() if r.live}
        for cid in set(self.series) - set(live):
            for book in (self.series, self._cpu, self._phases_sent, self._phases_at, self._models,
                         self.memory_high):
                book.pop(cid, None)
            self._rightsize_warned.discard(cid)
        readings = await asyncio.to_thread(self._read_containers, live)
        now = self.clock()
        for cid, reading in readings.items():
            cores = self._cpu.setdefault(cid, CpuMeter()).update(now, reading.cpu_s)
            if cores is None:
                continue   # the first reading only starts the CPU meter
            series = self.series.get(cid)
            if series is None:
                try:
                    path: Path | None = series_path(self.supervisor.container_dir(cid))
                except Exception:
                    path = None
                series = self.series[cid] = ContainerSeries(path)
            sample = series.add(now, cores, reading.rss_bytes / (1024 * 1024), self._gpu_util.get(cid))
            await self._find_phases(cid, series, now)
            high = self.memory_high.get(cid)
            model = self._models.get(cid)
            if high is not None and model is not None and sample.mem_mib > RAISE_AT * high:
                # Outgrowing its phase's limit before the phases are looked at again: the largest phase's, now.
                self.apply_rightsize(cid, ceiling_mib(model, sample.mem_mib), "outgrew its phase")

    async def _find_phases(self, cid: str, series: ContainerSeries, now: float) -> None:
        count = len(series.samples)
        last_count, last_time = self._phases_at.get(cid, (0, now))
        if cid in self._phases_at and count - last_count < max(1, count // PHASES_GROWTH) \
                and now - last_time < PHASES_EVERY_S:
            return
        self._phases_at[cid] = (count, now)
        # Up to a second for the longest, noisiest series: in a thread, so heartbeats go on meanwhile.
        model = self._models[cid] = await asyncio.to_thread(discover, list(series.samples))
        text = model.summary()
        if text and text != self._phases_sent.get(cid):
            self._phases_sent[cid] = self._phases[cid] = text
        rec = self.supervisor.record(cid)
        if rec is not None and rec.rightsize and model.labels:
            limit = phase_limit_mib(model, series.samples[-1].mem_mib)
            if limit is not None:
                self.apply_rightsize(cid, limit, f"phase {model.labels[-1]} of {len(model.phases)}")

    def apply_rightsize(self, cid: str, limit_mib: float, why: str) -> None:
        """`rightsize: on`: the container's memory.high to `limit_mib` (unless within 5% of what is set), where
        cgroup v2 memory control is available; otherwise one warning per container."""
        rec = self.supervisor.record(cid)
        if rec is None:
            return
        problem = self._memory_control_problem(rec)
        if problem:
            if cid not in self._rightsize_warned:
                self._rightsize_warned.add(cid)
                log.warning("container %s (job %s): its queue has rightsize: on, but %s: its phases are reported, "
                            "its memory is not limited", cid, rec.job_id, problem)
            return
        old = self.memory_high.get(cid)
        if old is not None and abs(limit_mib - old) <= 0.05 * old:
            return
        try:
            set_memory_high(Path(rec.cgroup), limit_mib)
        except OSError as exc:
            if cid not in self._rightsize_warned:
                self._rightsize_warned.add(cid)
                log.warning("container %s: cannot write memory.high: %s", cid, exc.strerror or exc)
            return
        self.memory_high[cid] = limit_mib
        log.info("container %s (job %s): rightsize: memory.high %.0f MiB (%s)", cid, rec.job_id, limit_mib, why)

    def _memory_control_problem(self, rec: ContainerRecord) -> str:
        cgroups = self.supervisor.cgroups
        if not rec.cgroup:
            return cgroups.warning or "the container has no cgroup v2"
        if "memory" not in cgroups.controllers:
            return cgroups.warning or "cgroup v2 has no memory controller for gpurm"
        return ""

    async def _container_loop(self) -> None:
        while True:
            try:
                await self.sample_containers()
            except Exception:
                log.exception("container usage sampling failed")
            await asyncio.sleep(self.cfg.telemetry.container_interval_s)

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        """All loops, until cancelled."""
        loops: list[Coroutine[Any, Any, None]] = [self._gpu_loop()]
        if self.cfg.health.script is not None:
            loops.append(self._script_loop(self.cfg.health.script))
        if self.cfg.telemetry.interval_s > 0:
            loops.append(self._telemetry_loop())
        if self.cfg.telemetry.container_interval_s > 0:
            loops.append(self._container_loop())
        await asyncio.gather(*loops)

    async def close(self) -> None:
        await stop_tasks(list(self._tasks))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping a container on a failed GPU failed: %s", task.exception())
