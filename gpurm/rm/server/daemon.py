"""The RM daemon: the asyncio shell around RMCore. It owns the clock, the sockets, the store and the broker.

After every core call (`async with shell.mutation():`) it writes what changed to the store, then carries out the
core's effects: launching AMs on agents, pushing stop orders down the agents' heartbeat streams and publishing
job events and the cluster view over MQTT. Replies go out only after the store commit.

RMShell keeps what every part reads and writes: the core (replaced by a rollback after a failed write, so the
collaborators below read it through a getter), the mutation and the store flush with its fail-closed retry, the
order of the effects after each commit, the tasks it spawned, and the start/stop sequence in `run`. Each other
responsibility is a collaborator with its dependencies passed in, and RMShell's public methods (what service.py,
rm/http/ and process.py call) hand over to it:
- rm/server/publishing.py: job events, the cluster view loop and its cache, telemetry over MQTT;
- rm/server/agents.py: channels to agents, AM launches, stop orders pushed down heartbeat streams, log reads;
- rm/server/grants.py: container tokens, grants and AM tokens handed out and renewed;
- rm/server/access.py: admins, who may see a job's private parts, users' OS groups;
- rm/server/finished.py: retention passes, and jobs read back from the store once they left memory;
- rm/server/queuerefresh.py: the queue config at start and its live refresh;
- rm/server/loops.py: deferred scheduling passes, the tick, the event loop's lag probe;
- rm/server/startup.py: the start-up steps that stand alone (epoch, listen checks, gRPC and HTTP servers, pidfile).
The process around it (signals, watchdog, exit codes) is rm/server/process.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from gpurm.common.aio import stop_tasks
from gpurm.common.fields import ConfigError, parse_address
from gpurm.common.model import Container, Job
from gpurm.common.tokens import ClusterKeys
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.config import RMConfig
from gpurm.rm.forecast.worker import Forecaster
from gpurm.rm.sched.pacing import steady_allocate_interval
from gpurm.rm.security import brokerauth
from gpurm.rm.security.credentials import Credentials
from gpurm.rm.security.identity import Caller
from gpurm.rm.server import convert, pbviews
from gpurm.rm.server.access import Access
from gpurm.rm.server.agents import Agents
from gpurm.rm.server.broker import EmbeddedBroker
from gpurm.rm.server.finished import FinishedJobs
from gpurm.rm.server.grants import Grants
from gpurm.rm.server.listviews import ListViews
from gpurm.rm.server.loops import SchedulingPasses, loop_lag_loop, tick_loop
from gpurm.rm.server.metrics import RMMetrics
from gpurm.rm.server.paging import ListIndexes
from gpurm.rm.server.publisher import Publisher
from gpurm.rm.server.publishing import Publishing
from gpurm.rm.server.queuerefresh import QueueRefresh, initial_queues
from gpurm.rm.server.standby import Leadership
from gpurm.rm.server.startup import (
    backup_at_start,
    bump_epoch,
    check_listen,
    grpc_server,
    settle_heap,
    start_http,
    write_pidfile,
)
from gpurm.rm.server.telemetrybook import TelemetryBook
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import JobChanged, LaunchAM
from gpurm.rm.state.retention import Retention
from gpurm.rm.storage.persist import RETRY_S, Persister, rebuild_core
from gpurm.rm.storage.store import Snapshot, rows
from gpurm.rm.storage.url import open_store

log = logging.getLogger(__name__)

VERSION = "0.1.0"

MAX_RIGHTSIZE_TEXT = 300   # characters of a container's phase summary kept (ContainerUsage.rightsize)
STOP_TASKS_S = 2.0         # at a stop, how long the RM's own loops get to end (within shutdown.timeout)
INSECURE_WARNING = ("INSECURE MODE: no mTLS (no tls: section in rm.yaml). Identity is whatever a client claims; "
                    "agents run every job as their one local user; admin requests are taken only from this host. "
                    "Do not run a shared cluster like this: docs/security.md says how to set up mTLS.")


@dataclass
class Mutation:
    """What a request writes besides the core's changed records (e.g. the queue config it applied); as an async
    context manager (RMShell.mutation), it persists and carries out the request's changes when its body ends (a
    class, not a generator: every mutating request enters one)."""

    flush: Callable[[Mutation], Awaitable[None]]
    meta: dict[str, str] = field(default_factory=dict)

    async def __aenter__(self) -> Mutation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush(self)


class RMShell:
    def __init__(self, config: RMConfig) -> None:
        self.config = config
        # With several RMs (rm.yaml ha:) the lease and its fencing keep them apart, not the store's own lock.
        self.store = open_store(config.store_url, config.state_dir, exclusive=not config.ha.enabled)
        self.leadership = (Leadership(config.store_url, config.advertised, config.listen, config.ha.lease_s,
                                      config.tls, config.limits,
                                      config.http.listen if config.http.enabled else "")
                           if config.ha.enabled else None)
        self.core = RMCore(config.settings, initial_queues(config, self.store))
        self.persist = Persister(self.store, config.state_dir, self._roll_back)
        # The queue config: live refresh, and the tree the store holds (rm/server/queuerefresh.py).
        self.queue_refresh = QueueRefresh(config, self.persist, lambda: self.core, self.mutation)
        self.retention = Retention(config.retention)   # finished jobs leaving memory, then the store
        self.metrics = RMMetrics(lambda: self.core, lambda: self.retention.retired_counts)
        self._stale = False                            # memory is ahead of the store: rebuild before writing
        self.creds = Credentials(ClusterKeys.load(config.state_dir / "token.key"))
        self.grants = Grants(self.creds, lambda: self.core)   # tokens and grants handed out (rm/server/grants.py)
        self.access = Access(config, lambda: self.core)       # admins, private parts, OS groups (rm/server/access.py)
        self.epoch = bump_epoch(config.state_dir / "epoch")
        self.mqtt_url = config.mqtt_url
        try:
            self.broker_auth = brokerauth.resolve(
                config.state_dir, (config.mqtt_username, config.mqtt_password_file),
                (config.mqtt_reader_username, config.mqtt_reader_password_file))
        except brokerauth.BrokerAuthError as exc:
            raise ConfigError([f"mqtt: {exc}"]) from None
        self.broker: EmbeddedBroker | None = None
        self.usage: dict[str, str] = {}
        self.rightsize: dict[str, str] = {}   # phases and recommended request per container (ContainerUsage)
        self.pages = ListIndexes()            # the sorted keys list pages start from (rm/server/paging.py)
        self.list_views = ListViews()         # list pages' serialized pieces (rm/server/listviews.py)
        self.telemetry = TelemetryBook()      # each node's latest GPU reading and a short history (web UI)
        # Job events, the cluster view and telemetry over MQTT (rm/server/publishing.py).
        self.publishing = Publishing(config, self.epoch, lambda: self.core, self.telemetry, self.retention.note)
        # AM launches, stop orders down the heartbeat streams, log reads (rm/server/agents.py).
        self.agents = Agents(config, lambda: self.core, self.grants.sign, self.grants.fresh_am_token, self.mutation)
        self.streams = self.agents.streams    # node id -> its open heartbeat stream (the Heartbeat handler's)
        # Retention passes, and jobs that left memory read back from the store (rm/server/finished.py).
        self.finished = FinishedJobs(lambda: self.core, self.store, self.persist, self.retention, config,
                                     self.publishing.clear_job, self.usage, self.rightsize)
        self.http_url = ""                    # the web UI's address once it serves ("" = off)
        # Extra HTTP routes (e.g. /metrics) registered before run(): each gets the aiohttp app and this shell.
        self.http_routes: list[Callable[[Any, RMShell], None]] = []
        self.started = time.time()
        self._tasks: set[asyncio.Task[None]] = set()
        # Scheduling passes deferred under load, and the replies that wait for them (rm/server/loops.py).
        # Start-time forecasts for waiting jobs, replayed in a worker process (rm/forecast/worker.py)
        self.forecaster = Forecaster(config.forecast, lambda: self.core) if config.forecast.enabled else None
        self.passes = SchedulingPasses(config, self.persist, lambda: self.core, self.mutation, self.metrics)

    # ------------------------------------------------------------ persistence and effects

    def mutation(self) -> Mutation:
        """`async with` it: run a core call (the body: no awaits in it), then persist its changes and carry out its
        effects before the caller replies. While the store refuses writes: RequestError(UNAVAILABLE) before
        anything changes (rm/storage/persist.py)."""
        self.persist.check_writable()
        return Mutation(self.flush)

    async def flush(self, m: Mutation | None = None) -> None:
        """Write what changed, then carry out the core's effects; nothing is carried out unless written. What is
        written and done is taken now, before the commit's wait, so it is exactly this request's (and any
        background change before it). A failed write rolls memory back to the store and raises
        RequestError(UNAVAILABLE)."""
        if not self.persist.writable:
            return
        core = self.core
        if not core.dirty and not core.outbox and not core.stop_orders.pending and (m is None or not m.meta):
            if core.cluster.changed:           # (a heartbeat that changed nothing: the usual case)
                self.publishing.view_changed()
            return
        dirty = core.take_dirty()
        batch = rows([core.jobs[j] for j in dirty.jobs if j in core.jobs],
                     [core.containers[c] for c in dirty.containers if c in core.containers],
                     [core.cluster.nodes[n] for n in dirty.nodes if n in core.cluster.nodes],
                     {**(core.meta() if dirty.meta else {}), **(m.meta if m is not None else {})})
        effects = core.take_outbox()
        now = time.time()
        stops = {node_id: core.take_stops(node_id, now) for node_id in core.nodes_with_stops()
                 if node_id in self.streams}
        if batch:
            began = time.perf_counter()
            await self.persist.commit(batch)
            self.metrics.commit_seconds.observe(time.perf_counter() - began)
        for effect in effects:
            if isinstance(effect, LaunchAM):
                self._spawn(self.agents.launch_am(effect))
            elif isinstance(effect, JobChanged):
                self.publishing.job_event_soon(effect.job_id)
        self.agents.push_stops(stops)
        if self.core.cluster.changed:
            self.publishing.view_changed()

    def _roll_back(self, snap: Snapshot | None = None) -> None:
        """After a failed write: forget everything not on disk (the core, with its queued effects and stop orders,
        is rebuilt from the store as on a restart). `snap`: the store, read already."""
        self._stale = True
        self.core = rebuild_core(self.store, self.config.settings, self.queue_refresh.committed_tree, self.core,
                                 time.time(), snap)
        self._stale = False
        self.publishing.view_changed()

    async def _store_retry_loop(self) -> None:
        while True:
            await asyncio.sleep(RETRY_S)
            if self.persist.writable:
                continue
            try:
                if self._stale:
                    # Read off the loop: a database server that does not answer must not stall the reads served
                    # meanwhile (writes are refused, so nothing writes the store while it is read).
                    snap = await asyncio.to_thread(self.store.load)
                    if self._stale:
                        self._roll_back(snap)
                if not self._stale:
                    await self.persist.try_resume()
            except Exception as exc:   # a store that cannot even be read: keep refusing writes, keep trying
                log.warning("the store still cannot be used: %s", exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ agents (rm/server/agents.py)

    def agent_channel(self, node_id: str) -> grpc.aio.Channel:
        return self.agents.channel(node_id)

    async def read_logs(self, request: pb.GetLogsRequest, tail: int = 0) -> pb.GetLogsResponse:
        """`tail` > 0: the last `tail` bytes instead of from `request.offset` (the web UI's job page)."""
        job, containers = self.job_records(request.job_id)
        return await self.agents.read_log(request, job, containers, tail)

    def new_session(self) -> str:
        return uuid.uuid4().hex

    def record_usage(self, beat: pb.NodeHeartbeat) -> None:
        for u in beat.usage:
            if u.summary:
                self.usage[u.container_id] = u.summary[:200]
            if u.rightsize:
                self.rightsize[u.container_id] = u.rightsize[:MAX_RIGHTSIZE_TEXT]

    # ------------------------------------------------------------ grants and tokens (rm/server/grants.py)

    def sign(self, c: Container, expiry_s: float, purpose: pb.TokenPurpose = pb.TOKEN_CONTAINER) -> pb.ContainerToken:
        return self.grants.sign(c, expiry_s, purpose)

    def rightsize_on(self, c: Container) -> bool:
        """Whether a learner's queue (as configured now) has `rightsize: on`."""
        return self.grants.rightsize_on(c)

    def grant_pb(self, container_id: str) -> pb.ContainerGrant:
        return self.grants.grant_pb(container_id)

    def check_join(self, request: pb.RegisterNodeRequest) -> str:
        return self.grants.check_join(request)

    def fresh_am_token(self, job_id: str, am_attempt: int, ttl_s: float | None = None) -> str:
        return self.grants.fresh_am_token(job_id, am_attempt, ttl_s)

    def renew_am_token(self, job_id: str, am_attempt: int, presented: str) -> str:
        return self.grants.renew_am_token(job_id, am_attempt, presented)

    def renew_grants(self, job_id: str, skip: set[str]) -> list[pb.ContainerGrant]:
        """Grants of this job's live learners whose tokens are past a third of their life, re-signed."""
        return self.grants.renew_grants(job_id, skip)

    # ------------------------------------------------------------ access (rm/server/access.py)

    def is_admin(self, who: Caller) -> bool:
        """An RM admin: named in rm.yaml `admins` and, without mTLS, calling from the RM's own host."""
        return self.access.is_admin(who)

    def may_see(self, who: Caller, job: Job) -> bool:
        """Whether `who` may see a job's private parts (env values, logs): its owner, its queue's admins, RM
        admins."""
        return self.access.may_see(who, job)

    def groups_of(self, user: str) -> list[str]:
        """The OS groups of `user` on the RM host (for @group ACL entries), cached for a minute."""
        return self.access.groups_of(user)

    # ------------------------------------------------------------ scheduling passes (rm/server/loops.py)

    def schedule_soon(self) -> bool:
        """Whether an allocate call should run the scheduling pass itself now (else it is deferred)."""
        return self.passes.soon()

    def pass_written(self) -> None:
        """A scheduling pass is done and its grants are on disk: replies held for it may take them."""
        self.passes.written()

    async def next_pass(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) for the next scheduling pass to be done and written; whether one was."""
        return await self.passes.next(timeout_s)

    def steady_interval_ms(self) -> int:
        """How long a running AM waits between Allocate calls, spread by the number of live AMs (rm/sched/pacing.py)."""
        s = self.core.settings
        return round(1000 * steady_allocate_interval(s.allocate_interval_s, len(self.core.ams.with_am),
                                                     s.max_allocate_rate, s.am_liveness_timeout_s))

    # ------------------------------------------------------------ finished jobs (rm/server/finished.py)

    async def retire_finished(self, now: float) -> int:
        """One retention pass (FinishedJobs.retire); the jobs retired."""
        return await self.finished.retire(now)

    def job_records(self, job_id: str) -> tuple[Job, Mapping[str, Container]]:
        """A job and its containers, from memory or (a job that left memory) the store."""
        return self.finished.records(job_id)

    def find_job(self, job_id: str) -> Job:
        """A job from memory or (a job that left memory) the store; NOT_FOUND saying why."""
        return self.finished.find(job_id)

    # ------------------------------------------------------------ MQTT (rm/server/publishing.py)

    @property
    def publisher(self) -> Publisher | None:
        """The MQTT client, once run() has started it."""
        return self.publishing.publisher

    @publisher.setter
    def publisher(self, publisher: Publisher | None) -> None:
        self.publishing.publisher = publisher

    def publish_telemetry(self, node_id: str, payload: bytes) -> str:
        """Republish a node's telemetry (from its heartbeat) retained on its own topic; a reason when refused."""
        return self.publishing.publish_telemetry(node_id, payload)

    # ------------------------------------------------------------ queues (rm/server/queuerefresh.py)

    async def refresh_queues(self, text: str) -> pb.RefreshQueuesResponse:
        """Apply a queue config, all or nothing (QueueRefresh.refresh); "" rereads the configured file."""
        return await self.queue_refresh.refresh(text)

    # ------------------------------------------------------------ views

    def view_bytes(self) -> bytes:
        """The full cluster view, encoded (shared by every reader of this view version)."""
        return self.publishing.view_bytes()

    def view_pb(self) -> pb.ClusterView:
        return pb.ClusterView.FromString(self.view_bytes())

    def job_pb(self, job: Job, full: bool = True, preemptible_jobs: set[str] | None = None,
               private: bool = True) -> pb.Job:
        return pbviews.job(self.core, job, self.usage, full=full, preemptible_jobs=preemptible_jobs,
                           private=private, rightsize=self.rightsize, forecasts=self.forecasts_view())

    def forecasts_view(self) -> pbviews.Forecasts | None:
        """The start forecasts the job views show (None: rm.yaml `forecast.enabled: false`)."""
        f = self.forecaster
        return (f.get, f.horizon_s) if f is not None else None

    def queues_pb(self) -> pb.ListQueuesResponse:
        return pbviews.queues(self.core, now=time.time())

    def cluster_info(self, who: Caller | None = None) -> pb.ClusterInfo:
        cluster = self.core.cluster
        reader = self.broker_auth.reader
        info = pb.ClusterInfo(mqtt_url=self.mqtt_url, version=VERSION, gpus_total=cluster.total_gpus,
                              nodes=len(cluster.nodes), started_ms=convert.ms(self.started),
                              insecure=self.config.tls is None, epoch=self.epoch, warnings=self.security_warnings(),
                              mqtt_username=reader.username, mqtt_password=reader.password,
                              store_error=self.persist.error, http_url=self.http_url)
        if who is not None:
            info.caller = who.describe()
            info.caller_admin = self.is_admin(who)
        return info

    def security_warnings(self) -> list[str]:
        if self.config.tls is not None:
            return []
        return [INSECURE_WARNING]

    # ------------------------------------------------------------ lifecycle

    async def _tick(self) -> None:
        """The periodic work (tick_loop): the core's time-driven work, written; a retention pass; the tokens of
        containers no longer live forgotten."""
        async with self.mutation():
            self.core.tick(time.time())
        await self.retire_finished(time.time())
        self.grants.forget_ended()

    async def run(self, stop: asyncio.Event) -> None:
        t0 = time.monotonic()
        check_listen(self.config)
        if self.leadership is not None:
            # One of several RMs on one PostgreSQL: stand by (answering with the leader's address) until this one
            # leads; from then on every write it makes is fenced by its epoch (rm/server/leadership.py).
            if not await self.leadership.acquire(stop):
                return
            t0 = time.monotonic()
            assert self.leadership.lease is not None
            self.store.fence_with(self.leadership.lease.holder, self.leadership.term.epoch)
            log.info("leading at epoch %d; loading the store", self.leadership.term.epoch)
        snap = self.store.load()
        log.info("store %s: %d jobs, %d containers, %d nodes", self.store.where, len(snap.jobs),
                 len(snap.containers), len(snap.nodes))
        self.core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, time.time(), snap.learned)
        del snap
        settle_heap()
        self.retention.retired_counts = self.store.retired_counts()
        backup_at_start(self.store, self.config)
        if not self.mqtt_url:
            host, port = parse_address(self.config.mqtt_listen)
            self.broker = EmbeddedBroker(host, port, self.broker_auth)
            await self.broker.start()
            self.mqtt_url = self.broker.url
        self.publisher = publisher = Publisher(self.mqtt_url, "rm", self.broker_auth.rm)
        publisher.start()
        server, host, bound = grpc_server(self, self.config)
        await server.start()
        try:
            web, http_url = await start_http(self, self.config, self.http_routes)
        except OSError:          # taken since the check above: stop what started, then say why
            await server.stop(grace=0)
            await publisher.stop()
            if self.broker is not None:
                await self.broker.stop()
            raise
        if web is not None:
            self.http_url = http_url
            if self.leadership is not None:
                await self.leadership.advertise_http(self.http_url)
        write_pidfile(self.config.state_dir, f"{host}:{bound}", self.mqtt_url, self.http_url)
        for line in self.security_warnings():
            log.warning("%s", line)
        live = sum(1 for j in self.core.jobs.values() if not j.state.terminal)
        log.info("RM serving on %s:%d%s (MQTT %s); restart to serving took %.0f ms; %d jobs (%d live), %d nodes "
                 "known", host, bound, " with mTLS" if self.config.tls else "", self.mqtt_url,
                 (time.monotonic() - t0) * 1000, len(self.core.jobs), live, len(self.core.cluster.nodes))
        async with self.mutation():
            for job in self.core.jobs.values():
                self.publishing.publish_job(job.job_id)
        self.publishing.view_changed()
        tick_interval_s = min(1.0, self.core.settings.heartbeat_interval_s / 2)
        tasks = [asyncio.create_task(tick_loop(tick_interval_s, self.persist, self._tick)),
                 asyncio.create_task(self.publishing.view_loop()),
                 asyncio.create_task(self.passes.loop()), asyncio.create_task(self._store_retry_loop()),
                 asyncio.create_task(loop_lag_loop(self.metrics))]
        if self.leadership is not None:
            tasks.append(asyncio.create_task(self.leadership.keep(stop)))
        if self.forecaster is not None:
            tasks.append(asyncio.create_task(self.forecaster.loop()))
        try:
            await stop.wait()
        finally:
            log.info("RM stopping")
            for t in tasks:
                t.cancel()
            self.agents.close_streams()
            if web is not None:
                await web.stop()
            await server.stop(grace=self.config.shutdown_grace_s)
            # Ended for sure before the store closes (a cancellation can be lost: gpurm/common/aio.py).
            await stop_tasks([*tasks, *self._tasks], give_up_s=STOP_TASKS_S)
            if self.forecaster is not None:
                self.forecaster.close()
            self.publishing.publish_due_job_events()     # before the publisher stops
            await self.agents.close_channels()
            await publisher.stop()
            if self.broker is not None:
                await self.broker.stop()
            await asyncio.to_thread(self.persist.close)
            if self.leadership is not None:
                await self.leadership.release()
