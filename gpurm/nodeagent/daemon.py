"""The node agent daemon: discover GPUs, serve ContainerManager, keep the RM informed, stream logs, watch
GPU and node health and publish GPU telemetry (`monitor.py`).

Shutdown (SIGTERM / SIGINT) stops every container (TERM, grace, KILL of each process group) unless
`containers.keep_on_shutdown`, reports their final statuses to the RM (best effort, 2 s), and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurm.common import tls
from gpurm.common.aio import stop_tasks
from gpurm.common.limits import make_server
from gpurm.common.mqtt import MQTT_URL_ENV
from gpurm.common.netcheck import listen_problem
from gpurm.common.textsafe import setup_logging
from gpurm.nodeagent import engine as oci
from gpurm.nodeagent.config import NO_CREDENTIAL, AgentConfig
from gpurm.nodeagent.containers import ContainerSupervisor, supervisor_for
from gpurm.nodeagent.fence import LEASE_FILE, Fence
from gpurm.nodeagent.gpus import GpuDevice, GpuDiscoveryError, GpuProvider, make_provider
from gpurm.nodeagent.images import ImageReport
from gpurm.nodeagent.metrics import AgentCollector, MetricsServer
from gpurm.nodeagent.monitor import AgentMonitor
from gpurm.nodeagent.ports import PortReserver
from gpurm.nodeagent.private import make_dir, state_dir_mode
from gpurm.nodeagent.records import write_json_atomic
from gpurm.nodeagent.service import ContainerManagerServicer
from gpurm.nodeagent.sweep import sweep_loop
from gpurm.nodeagent.tracker import Registration, RMUnreachable, Tracker

log = logging.getLogger(__name__)

AGENT_FILE = "agent.json"
FINAL_REPORT_S = 2.0
EXIT_CONFIG = 2
EXIT_RM_UNREACHABLE = 3     # the RM stayed unreachable past rm_retry.give_up_after


def discover_gpus(cfg: AgentConfig) -> list[GpuDevice]:
    provider = make_provider(cfg)
    try:
        return provider.discover()
    finally:
        provider.close()


def open_gpus(cfg: AgentConfig) -> tuple[GpuProvider, list[GpuDevice]]:
    """The configured provider (kept open for health and telemetry) and the GPUs it found."""
    provider = make_provider(cfg)
    try:
        return provider, provider.discover()
    except BaseException:
        provider.close()
        raise


async def run_agent(cfg: AgentConfig, *, stop: asyncio.Event | None = None) -> int:
    """Run until `stop` is set or SIGTERM / SIGINT arrives. Returns the exit code (2: config, discovery)."""
    if cfg.tls is None and cfg.node_secret is None:
        log.error("agent %s: %s", cfg.node_id, NO_CREDENTIAL)
        return EXIT_CONFIG
    try:
        provider, gpus = open_gpus(cfg)
    except GpuDiscoveryError as exc:
        log.error("agent %s: %s", cfg.node_id, exc)
        return EXIT_CONFIG
    try:
        return await _run_with_gpus(cfg, provider, gpus, stop)
    finally:
        provider.close()


async def _run_with_gpus(cfg: AgentConfig, provider: GpuProvider, gpus: list[GpuDevice],
                         stop: asyncio.Event | None) -> int:
    try:
        # As root traversable, not listable (0711): each job's user reaches its own container dir (0700) below
        # it; else 0700. The agent's files in it are 0600.
        make_dir(cfg.state_dir, state_dir_mode())
    except OSError as exc:
        log.error("agent %s: cannot create state_dir %s: %s", cfg.node_id, cfg.state_dir, exc.strerror or exc)
        return EXIT_CONFIG

    supervisor = supervisor_for(cfg, len(gpus))  # cgroups, run-as, log rotation (cfg.containers)
    # The OCI engine of image jobs, checked with a real run (the registration reports it), and the images it holds:
    # both before any gRPC object exists, since some grpcio releases break when a process forks while their
    # threads start. What was chosen is logged once the agent listens (a busy port stays its one line).
    supervisor.engine, note = await oci.detect(cfg.containers.engine, fake_gpus=cfg.gpus.fake is not None,
                                               state_dir=str(cfg.state_dir), node_id=cfg.node_id)
    supervisor.gpu_uuids = {g.index: g.uuid for g in gpus}
    images = ImageReport(supervisor.engine) if supervisor.engine is not None else None
    if images is not None:
        await images.refresh()
    # One health check before anything is offered: the registration carries what it found.
    monitor = AgentMonitor(cfg, provider, gpus, supervisor)
    monitor.check_gpus()
    servicer = ContainerManagerServicer(supervisor, gpus, stop_grace_s=cfg.containers.stop_grace_s,
                                        ports=PortReserver(cfg.host))
    if cfg.tls is not None and cfg.am_tls is None:
        # AMs run as the agent's own user: they dial the RM and the agents with the node's certificate. With
        # am_tls, each AM gets that certificate as files of its own user instead (ContainerSupervisor.am_tls).
        servicer.am_env = cfg.tls.env()
    if cfg.mqtt_advertise:
        servicer.am_env = {**servicer.am_env, MQTT_URL_ENV: cfg.mqtt_advertise}   # this node's broker address
    # The AMs this agent starts dial the RMs it dials (agent.yaml rm: the whole active/standby list, as reached from
    # this node), not the one address the RM that launched them advertises: an AM must outlive a failover too.
    servicer.am_env = {**servicer.am_env, "GPURM_RM": cfg.rm}
    server = make_server(cfg.limits)
    servicer.add_to_server(server)
    why = listen_problem(cfg.listen)
    if why:
        log.error("agent %s: cannot listen on %s: %s", cfg.node_id, cfg.listen, why)
        return EXIT_CONFIG
    why = "address in use or not available"
    try:
        port = tls.add_port(server, cfg.listen, cfg.tls)
    except RuntimeError as exc:
        port, why = 0, str(exc)
    if not port:
        log.error("agent %s: cannot listen on %s: %s", cfg.node_id, cfg.listen, why)
        return EXIT_CONFIG
    await server.start()
    log.info("%s", note)
    supervisor.open()  # cgroups set up, the previous agent process's containers adopted
    if supervisor.engine is not None:   # engine containers of no live container of ours: left by a crash
        await oci.reap(supervisor.engine, supervisor.marker_prefix,
                       {r.engine_name for r in supervisor.records() if r.live and r.engine_name})
    agent_file = cfg.state_dir / AGENT_FILE
    write_json_atomic(agent_file,
                      {"node_id": cfg.node_id, "host": cfg.host, "port": port, "pid": os.getpid()})
    log.info("agent %s serving ContainerManager on %s:%d%s, %d GPUs", cfg.node_id, cfg.host, port,
             " with mTLS" if cfg.tls else "", len(gpus))

    def registered(reg: Registration) -> None:
        servicer.token_key = reg.token_key

    exporter: MetricsServer | None = None
    if cfg.telemetry.metrics_listen:
        try:
            collector = AgentCollector(cfg.host, lambda: gpus, lambda: monitor.reading, monitor.tally, cfg.node_id)
            exporter = MetricsServer(collector, cfg.telemetry.metrics_listen, cfg.tls)
        except OSError as exc:
            log.error("agent %s: %s", cfg.node_id, exc)
            await server.stop(grace=None)
            return EXIT_CONFIG
    tracker = Tracker(cfg, supervisor, gpus, agent_port=port, on_registered=registered,
                      metrics_port=exporter.port if exporter is not None else 0)
    tracker.decorate = monitor.decorate
    monitor.on_change = tracker.wake
    fence = Fence(supervisor, state_file=cfg.state_dir / LEASE_FILE)
    fence.restore()   # containers adopted from a previous agent process stay under its lease
    tracker.fence = fence
    servicer.fence = fence
    if images is not None:   # image locality: the registration carries the engine's images, beats the changes
        supervisor.add_listener(images.on_change)
        tracker.decorate = _both(monitor.decorate, images.decorate)
    refresh = cfg.containers.engine.image_refresh_s
    tasks = [*([asyncio.create_task(images.run(tracker.wake, refresh), name="images")] if images is not None else []),
             asyncio.create_task(tracker.run(), name="tracker"),
             asyncio.create_task(fence.run(), name="fence"),
             asyncio.create_task(monitor.run(), name="monitor"),
             asyncio.create_task(sweep_loop(supervisor.containers_dir, cfg.containers.keep_finished_s,
                                            lambda: [r.container_id for r in supervisor.records()], time.time),
                                 name="sweep")]

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    code = 0
    try:
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        for task in tasks:
            if task in done and isinstance(task.exception(), RMUnreachable):
                # Gave up on the RM (rm_retry.give_up_after): exit for the service manager to restart the agent,
                # leaving the containers running; the next agent adopts them.
                log.error("agent %s: %s; exiting, containers left running", cfg.node_id, task.exception())
                code = EXIT_RM_UNREACHABLE
            elif task in done:  # neither loop ends on its own: a bug, so shut down loudly
                log.error("agent %s: %s loop ended: %r", cfg.node_id, task.get_name(), task.exception())
                code = 1
        log.info("agent %s shutting down", cfg.node_id)
        if code != EXIT_RM_UNREACHABLE:
            await _shutdown(cfg, supervisor, servicer, tracker)
            if not cfg.containers.keep_on_shutdown:
                fence.forget()   # nothing left running that a lease must cover
    finally:
        await stop_tasks(tasks)
        await tracker.close()
        await fence.close()
        await monitor.close()
        if exporter is not None:
            await asyncio.to_thread(exporter.close)
        await server.stop(grace=1.0)
        await supervisor.close()
        for sig in handled:
            loop.remove_signal_handler(sig)
        with contextlib.suppress(OSError):
            agent_file.unlink()
    log.info("agent %s stopped", cfg.node_id)
    return code


async def _shutdown(cfg: AgentConfig, supervisor: ContainerSupervisor, servicer: ContainerManagerServicer,
                    tracker: Tracker) -> None:
    servicer.closing = True  # no new containers from here on
    live = [r for r in supervisor.records() if r.live]
    if cfg.containers.keep_on_shutdown:
        if live:
            log.info("leaving %d containers running (containers.keep_on_shutdown)", len(live))
        return
    if live:
        log.info("stopping %d containers (grace %.1fs)", len(live), cfg.containers.stop_grace_s)
        await supervisor.stop_all(cfg.containers.stop_grace_s, "agent shutdown")
    if not await tracker.flush(FINAL_REPORT_S):
        log.info("could not report the final container statuses to the RM")


def main(cfg: AgentConfig) -> int:
    """Blocking entry point for `gpurm agent`: run the agent, return its exit code."""
    if not logging.getLogger().handlers:
        setup_logging(logging.INFO)
    try:
        return asyncio.run(run_agent(cfg))
    except KeyboardInterrupt:  # a second Ctrl-C before the handlers were installed
        return 130


def read_agent_file(state_dir: Path) -> dict[str, object] | None:
    """The running agent's {node_id, host, port, pid}, or None when it is not serving."""
    import json

    try:
        data = json.loads((state_dir / AGENT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _both(first: Callable[[Any], None], second: Callable[[Any], None]) -> Callable[[Any], None]:
    def decorate(msg: Any) -> None:
        first(msg)
        second(msg)
    return decorate
