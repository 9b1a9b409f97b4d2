"""The RM daemon: the asyncio shell around RMCore. It owns the clock, the sockets, the store and the broker.

After every core call (`async with shell.mutation():`) it writes what changed to the store, then carries out the
core's effects: launching AMs on agents, pushing stop orders down the agents' heartbeat streams and publishing
job events and the cluster view over MQTT. Replies go out only after the store commit.

Why it is one file of over 800 lines: RMShell is the one owner of the loop's mutable state (the mutation lock,
the store flush and its fail-closed retry, the agents' streams and channels, the publisher), and each part below
reads and writes that state: the effects, the view publishing loop, queue refresh, log access over the agents and
the start/stop sequence. What does not need that state lives elsewhere: the credentials in rm/credentials.py, the
protobuf views in rm/pbviews.py, which container a log request names in rm/views.py, the process around it
(signals, watchdog, exit codes) in rm/process.py. The next part to move out is the MQTT publishing (job events,
telemetry, the view loop), behind a small interface of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import grp
import json
import logging
import os
import pwd
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.queues.config import MAX_YAML_BYTES, capacity_warnings, parse_queues
from gpurm.queues.fields import ConfigError, parse_address
from gpurm.queues.tree import QueueTree, default_tree
from gpurm.rm import brokerauth, convert, mqtt, pbviews, tls
from gpurm.rm.aio import stop_tasks, wait_set
from gpurm.rm.broker import EmbeddedBroker
from gpurm.rm.config import RMConfig
from gpurm.rm.core import RMCore
from gpurm.rm.credentials import Credentials
from gpurm.rm.identity import Caller, CallerKind
from gpurm.rm.limits import make_server
from gpurm.rm.messages import ErrorCode, JobChanged, LaunchAM, RequestError
from gpurm.rm.metrics import RMMetrics
from gpurm.rm.model import Container, ContainerKind, Job
from gpurm.rm.netcheck import listen_problem
from gpurm.rm.pacing import steady_allocate_interval
from gpurm.rm.paging import ListIndexes
from gpurm.rm.persist import RETRY_S, Persister, rebuild_core
from gpurm.rm.retention import Retention
from gpurm.rm.service import AdminService, AMService, BeatStream, ClientService, DecodeGuard, TrackerService
from gpurm.rm.standby import Leadership
from gpurm.rm.statedir import rotate_backup
from gpurm.rm.store import Snapshot, SqliteStore, StoreWriteError, rows
from gpurm.rm.storeurl import open_store
from gpurm.rm.telemetrybook import TelemetryBook
from gpurm.rm.tokens import ClusterKeys, write_secret_file
from gpurm.rm.viewcache import ViewCache
from gpurm.rm.views import log_container

log = logging.getLogger(__name__)

VERSION = "0.1.0"
AGENT_CALL_TIMEOUT_S = 10.0
LAG_PROBE_S = 0.1             # the event loop's lag is sampled this often (gpurm_event_loop_lag_seconds)
JOB_EVENT_COALESCE_S = 0.02   # a job's state events within this go out as one (its latest state)


READ_LOG_TOKEN_S = 60.0
MAX_RIGHTSIZE_TEXT = 300   # characters of a container's phase summary kept (ContainerUsage.rightsize)
INSECURE_WARNING = ("INSECURE MODE: no mTLS (no tls: section in rm.yaml). Identity is whatever a client claims; "
                    "agents run every job as their one local user; admin requests are taken only from this host. "
                    "Do not run a shared cluster like this: docs/security.md says how to set up mTLS.")


def bump_epoch(path: Path) -> int:
    """The RM's epoch: one more than the last start's, written (fsync) before the RM serves anything, so views
    from this start never compare with an older start's by version alone."""
    try:
        last = int(path.read_text().strip() or "0")
    except FileNotFoundError:
        last = 0
    except ValueError:
        raise ConfigError([f"{path}: not an epoch number; delete the file (the RM starts a new epoch)"]) from None
    epoch = last + 1
    write_secret_file(path, str(epoch))     # 0600, fsynced, replaced atomically (not secret, but private)
    return epoch


@dataclass
class Mutation:
    """What a request writes besides the core's changed records (e.g. the queue config it applied)."""

    meta: dict[str, str] = field(default_factory=dict)


class RMShell:
    def __init__(self, config: RMConfig) -> None:
        self.config = config
        # With several RMs (rm.yaml ha:) the lease and its fencing keep them apart, not the store's own lock.
        self.store = open_store(config.store_url, config.state_dir, exclusive=not config.ha.enabled)
        self.leadership = (Leadership(config.store_url, config.advertised, config.listen, config.ha.lease_s,
                                      config.tls, config.limits,
                                      config.http.listen if config.http.enabled else "")
                           if config.ha.enabled else None)
        self.core = RMCore(config.settings, self._initial_queues())
        self.committed_tree = self.core.queues.tree    # the queue config the store holds (a rollback keeps it)
        self.persist = Persister(self.store, config.state_dir, self._roll_back)
        self.retention = Retention(config.retention)   # finished jobs leaving memory, then the store
        self.metrics = RMMetrics(lambda: self.core, lambda: self.retention.retired_counts)
        self._stale = False                            # memory is ahead of the store: rebuild before writing
        self._refresh_lock = asyncio.Lock()
        self.creds = Credentials(ClusterKeys.load(config.state_dir / "token.key"))
        self.epoch = bump_epoch(config.state_dir / "epoch")
        self.mqtt_url = config.mqtt_url
        try:
            self.broker_auth = brokerauth.resolve(
                config.state_dir, (config.mqtt_username, config.mqtt_password_file),
                (config.mqtt_reader_username, config.mqtt_reader_password_file))
        except brokerauth.BrokerAuthError as exc:
            raise ConfigError([f"mqtt: {exc}"]) from None
        self.publisher: mqtt.Publisher | None = None
        self.broker: EmbeddedBroker | None = None
        self.streams: dict[str, BeatStream] = {}     # node id -> its open heartbeat stream
        self.usage: dict[str, str] = {}
        self.rightsize: dict[str, str] = {}   # phases and recommended request per container (ContainerUsage)
        self.pages = ListIndexes()            # the sorted keys list pages start from (rm/paging.py)
        self.telemetry = TelemetryBook()      # each node's latest GPU reading and a short history (web UI)
        self.http_url = ""                    # the web UI's address once it serves ("" = off)
        # Extra HTTP routes (e.g. /metrics) registered before run(): each gets the aiohttp app and this shell.
        self.http_routes: list[Callable[[Any, RMShell], None]] = []
        self.started = time.time()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._view_dirty = asyncio.Event()
        self._job_events: dict[str, None] = {}       # jobs whose state event is due (coalesced)
        self._job_events_timer: asyncio.TimerHandle | None = None
        self.views = ViewCache()
        self._groups: dict[str, tuple[float, list[str]]] = {}
        self._last_pass = 0.0
        self._pass_pending = False
        self._pass_done = asyncio.Event()    # set (and replaced) after each deferred pass

    # ------------------------------------------------------------ persistence and effects

    @contextlib.asynccontextmanager
    async def mutation(self) -> AsyncIterator[Mutation]:
        """Run a core call (the body: no awaits in it), then persist its changes and carry out its effects before
        the caller replies. While the store refuses writes: RequestError(UNAVAILABLE) before anything changes
        (rm/persist.py)."""
        self.persist.check_writable()
        m = Mutation()
        try:
            yield m
        finally:
            await self.flush(m)

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
                self._view_dirty.set()
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
                self._spawn(self._launch_am(effect))
            elif isinstance(effect, JobChanged):
                self._job_event_soon(effect.job_id)
        for node_id, orders in stops.items():
            stream = self.streams.get(node_id)
            if stream is not None and orders:
                stream.push(pb.HeartbeatResponse(stop=[
                    pb.StopOrder(container_id=o.container_id, grace_ms=round(o.grace_s * 1000), reason=o.reason)
                    for o in orders]))
        if self.core.cluster.changed:
            self._view_dirty.set()

    def _roll_back(self, snap: Snapshot | None = None) -> None:
        """After a failed write: forget everything not on disk (the core, with its queued effects and stop orders,
        is rebuilt from the store as on a restart). `snap`: the store, read already."""
        self._stale = True
        self.core = rebuild_core(self.store, self.config.settings, self.committed_tree, self.core, time.time(), snap)
        self._stale = False
        self._view_dirty.set()

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

    # ------------------------------------------------------------ agents

    def agent_channel(self, node_id: str) -> grpc.aio.Channel:
        node = self.core.cluster.nodes[node_id]
        address = f"{node.host}:{node.port}"
        channel = self._channels.get(address)
        if channel is None:
            channel = tls.aio_channel(address, self.config.tls)
            self._channels[address] = channel
        return channel

    def sign(self, c: Container, expiry_s: float, purpose: pb.TokenPurpose = pb.TOKEN_CONTAINER) -> pb.ContainerToken:
        return self.creds.sign(c, expiry_s, time.time(), purpose, rightsize=self.rightsize_on(c))

    def rightsize_on(self, c: Container) -> bool:
        """Whether a learner's queue (as configured now) has `rightsize: on`."""
        if c.kind is not ContainerKind.LEARNER:
            return False
        job = self.core.jobs.get(c.job_id)
        q = self.core.queues.tree.by_path.get(job.queue) if job is not None else None
        return q is not None and q.effective_rightsize

    # ------------------------------------------------------------ credentials

    def is_admin(self, who: Caller) -> bool:
        """An RM admin: named in rm.yaml `admins` and, without mTLS, calling from the RM's own host."""
        return who.kind is CallerKind.USER and who.name in self.config.admins and (who.verified or who.local)

    def may_see(self, who: Caller, job: Job) -> bool:
        """Whether `who` may see a job's private parts (env values, logs): its owner, its queue's admins, RM
        admins."""
        if who.kind is not CallerKind.USER:
            return False
        return self.is_admin(who) or self.core.may_kill(job, who.name, self.groups_of(who.name))

    def check_join(self, request: pb.RegisterNodeRequest) -> str:
        return self.creds.check_join(request, time.time())

    def steady_interval_ms(self) -> int:
        """How long a running AM waits between Allocate calls, spread by the number of live AMs (rm/pacing.py)."""
        s = self.core.settings
        return round(1000 * steady_allocate_interval(s.allocate_interval_s, len(self.core.ams.with_am),
                                                     s.max_allocate_rate, s.am_liveness_timeout_s))

    def fresh_am_token(self, job_id: str, am_attempt: int, ttl_s: float | None = None) -> str:
        ttl = ttl_s if ttl_s is not None else self.core.settings.token_ttl_s
        return self.creds.am_token(job_id, am_attempt, ttl, time.time())

    def renew_am_token(self, job_id: str, am_attempt: int, presented: str) -> str:
        return self.creds.renew_am_token(job_id, am_attempt, presented, self.core.settings.token_ttl_s, time.time())

    def renew_grants(self, job_id: str, skip: set[str]) -> list[pb.ContainerGrant]:
        """Grants of this job's live learners whose tokens are past a third of their life, re-signed."""
        ttl = self.core.settings.token_ttl_s
        due = time.time() + ttl * 2 / 3
        out = []
        for c in self.core.job_containers(job_id):
            if c.kind is ContainerKind.AM or c.container_id in skip or not c.phase.live:
                continue
            if self.creds.due_for_renewal(c.container_id, due) and c.node_id in self.core.cluster.nodes:
                out.append(self.grant_pb(c.container_id))
        return out

    def _forget_tokens(self) -> None:
        self.creds.forget(lambda cid: (c := self.core.containers.get(cid)) is not None and c.phase.live)

    async def _launch_am(self, effect: LaunchAM) -> None:
        c = self.core.containers.get(effect.container_id)
        node = self.core.cluster.nodes.get(effect.node_id)
        if c is None or node is None or not c.phase.live:
            return
        env = {
            # The agent replaces this with its own agent.yaml rm (the whole active/standby list, as its node reaches
            # the RMs); this RM's own address is what an AM of an older agent dials.
            "GPURM_RM": self.config.advertised,
            "GPURM_JOB_ID": effect.job_id,
            "GPURM_AM_ATTEMPT": str(effect.am_attempt),
            "GPURM_AM_RETRY_FOR": f"{self.config.am_rm_retry_for_s:g}",
            "GPURM_AM_TOKEN": self.fresh_am_token(effect.job_id, effect.am_attempt,
                                                  max(self.core.settings.token_ttl_s,
                                                      self.core.settings.am_register_timeout_s + 60)),
        }
        request = pb.StartContainerRequest(token=self.sign(c, self.core.settings.am_register_timeout_s + 60),
                                           launch=pb.LaunchContext(argv=[], env=env))
        stub = pbg.ContainerManagerStub(self.agent_channel(effect.node_id))
        failure = ""
        unreachable = job_fault = False
        try:
            reply = await stub.StartContainer(request, timeout=AGENT_CALL_TIMEOUT_S)
            if reply.status.state == pb.CONTAINER_FAILED_TO_START:
                failure = reply.status.diagnostics or "failed to start"
                job_fault = not reply.status.infra_failure
            else:
                log.info("AM %s of %s started on %s (pid %d)", c.container_id, effect.job_id, effect.node_id,
                         reply.status.pid)
        except grpc.aio.AioRpcError as exc:
            failure = f"agent {effect.node_id} refused or unreachable: {exc.code().name}: {exc.details()}"
            unreachable = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        if failure:
            log.warning("could not start AM %s: %s", c.container_id, failure)
            try:
                async with self.mutation():
                    self.core.am_launch_failed(c.container_id, failure, time.time(), agent_unreachable=unreachable,
                                               job_fault=job_fault)
            except RequestError as exc:   # the store refuses writes: the AM's start timeout catches it later
                log.warning("AM %s launch failure not recorded: %s", c.container_id, exc.message)

    # ------------------------------------------------------------ retention (rm/retention.py)

    async def retire_finished(self, now: float) -> int:
        """One retention pass: finished jobs past `retention.memory` leave memory (their records move to the
        store's `retired` table in one transaction, written before memory forgets them) and their retained MQTT
        topics are cleared; detail past `retention.store` leaves the store. Returns the jobs retired."""
        if not self.persist.writable:
            return 0
        p = self.retention.plan(self.core, now)
        if not p.retired and p.purge_before is None:
            return 0
        try:
            # On the writer thread, after the writes queued before it (the jobs' last saves among them).
            purged = await asyncio.wrap_future(self.persist.writer.call(
                lambda: self.store.retire(p.retired, p.purge_before, self.retention.settings.batch)))
        except StoreWriteError as exc:
            self.retention.give_back(p)    # memory still holds them; the next pass tries again
            log.warning("finished jobs not retired (the store refused the write: %s); trying again", exc)
            return 0
        self.retention.apply(self.core, p)
        self.retention.purged(purged)
        for r in p.retired:
            if self.publisher is not None:   # an empty retained payload deletes the topic's retained message
                self.publisher.publish_retained(mqtt.TOPIC_JOB.format(job_id=r.job.job_id), b"")
            for c in r.containers:
                self.usage.pop(c.container_id, None)
                self.rightsize.pop(c.container_id, None)
        if p.retired or purged:
            log.info("retention: %d finished jobs left memory, %d jobs' detail left the store", len(p.retired),
                     purged)
        return len(p.retired)

    def job_records(self, job_id: str) -> tuple[Job, Mapping[str, Container]]:
        """A job and its containers by id: from memory, else (a job that left memory) from the store, so its logs
        stay readable while the agents keep them (agent.yaml containers.keep_finished)."""
        job = self.core.jobs.get(job_id)
        if job is not None:
            return job, self.core.containers
        found = self.store.load_retired(job_id)
        if found is None:
            return self.find_job(job_id), {}       # raises NOT_FOUND, saying why
        return found[0], {c.container_id: c for c in found[1]}

    def find_job(self, job_id: str) -> Job:
        """A job in memory, else one that left memory read from the store (off the hot path: `gpurm status`);
        NOT_FOUND saying so when its detail has left the store too."""
        try:
            return self.core.get_job(job_id)
        except RequestError as exc:
            if exc.code is not ErrorCode.NOT_FOUND or not job_id:
                raise
            found = self.store.load_retired(job_id)
            if found is not None:
                return found[0]
            row = self.store.finished_row(job_id)
            if row is None:
                raise
            ret = self.config.retention
            raise RequestError(ErrorCode.NOT_FOUND, f"job {job_id} finished ({row.state}) at "
                               f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(row.finish_time))} and its record "
                               f"was retired after {ret.store_s / 86400:g} days (rm.yaml retention.store); "
                               f"`gpurm acct` still counts it") from None

    # ------------------------------------------------------------ MQTT

    def _job_event_soon(self, job_id: str) -> None:
        """Publish the job's state shortly: the changes one job goes through within JOB_EVENT_COALESCE_S (a
        submit and its AM's start, a gang's learners starting) go out as one event, its latest state."""
        self._job_events[job_id] = None
        if self._job_events_timer is None:
            self._job_events_timer = asyncio.get_running_loop().call_later(JOB_EVENT_COALESCE_S,
                                                                          self._publish_job_events)

    def _publish_job_events(self) -> None:
        self._job_events_timer = None
        events, self._job_events = self._job_events, {}
        for job_id in events:
            self._publish_job(job_id)

    def _publish_job(self, job_id: str) -> None:
        job = self.core.jobs.get(job_id)
        if job is not None:
            self.retention.note(job)        # a finished job becomes a candidate to leave memory
        if job is None or self.publisher is None:
            return
        attempt = job.current_attempt
        event = {
            "job_id": job.job_id, "state": job.state.name, "queue": job.queue, "user": job.user,
            "gpus": job.spec.gpus, "attempt": attempt.number if attempt else 0,
            "diagnostics": job.diagnostics, "waiting_reason": job.waiting_reason, "exit_code": job.exit_code,
            "live_containers": self.core.live_count(job_id), "time": time.time(),
        }
        self.publisher.publish_retained(mqtt.TOPIC_JOB.format(job_id=job_id), json.dumps(event).encode())

    def publish_telemetry(self, node_id: str, payload: bytes) -> str:
        """Republish a node's telemetry (from its heartbeat) retained on its own topic; a reason when refused."""
        problem = mqtt.telemetry_problem(node_id, payload)
        if problem:
            return problem
        self.telemetry.record(node_id, payload)
        if self.publisher is not None:
            self.publisher.publish_retained(mqtt.TOPIC_TELEMETRY.format(node_id=node_id), payload)
        return ""

    async def _publish_view_loop(self) -> None:
        """Deltas (only the changed nodes, each whole) as the cluster changes, at most every
        `view_publish_interval`; a retained full snapshot every `view_snapshot_interval` when anything changed,
        so a new subscriber starts from a recent snapshot and follows the deltas. Both are cut from the view
        cache: each node is encoded once per change (rm/viewcache.py)."""
        published = 0                 # version of the last view sent (delta or snapshot)
        snapshot_at = 0.0
        snapshot_version = -1
        while True:
            await self._view_dirty.wait()
            self._view_dirty.clear()
            if self.publisher is not None:
                core = self.core
                version = core.cluster.version
                changed = self.views.take_delta(core)
                if changed:
                    header = pb.ClusterView(version=version, time_ms=convert.ms(time.time()),
                                            base_version=published, epoch=self.epoch, delta=True)
                    self.publisher.publish(mqtt.TOPIC_VIEW_DELTA,
                                           header.SerializeToString() + self.views.entries(changed))
                    published = version
                due = time.monotonic() - snapshot_at >= self.config.view_snapshot_interval_s
                if version != snapshot_version and due:
                    self.publisher.publish_retained(mqtt.TOPIC_VIEW, self.view_bytes())
                    snapshot_at, snapshot_version = time.monotonic(), version
                    published = max(published, version)
                elif version != snapshot_version:
                    self._view_dirty.set()      # a snapshot is due later; come back for it
            await asyncio.sleep(self.config.view_publish_interval_s)

    # ------------------------------------------------------------ views

    def view_bytes(self) -> bytes:
        """The full cluster view, encoded (shared by every reader of this view version)."""
        return self.views.full(self.core, self.epoch, time.time())

    def view_pb(self) -> pb.ClusterView:
        return pb.ClusterView.FromString(self.view_bytes())

    def job_pb(self, job: Job, full: bool = True, preemptible_jobs: set[str] | None = None,
               private: bool = True) -> pb.Job:
        return pbviews.job(self.core, job, self.usage, full=full, preemptible_jobs=preemptible_jobs,
                           private=private, rightsize=self.rightsize)

    def grant_pb(self, container_id: str) -> pb.ContainerGrant:
        c = self.core.containers[container_id]
        node = self.core.cluster.nodes[c.node_id]
        return pb.ContainerGrant(container_id=c.container_id, node_id=c.node_id, host=node.host,
                                 agent_port=node.port, gpu_indices=c.gpu_indices,
                                 token=self.sign(c, self.core.settings.token_ttl_s), preemptible=c.preemptible,
                                 rack=node.rack, attempt=c.attempt, gpu_share_milli=c.share_milli)

    def record_usage(self, beat: pb.NodeHeartbeat) -> None:
        for u in beat.usage:
            if u.summary:
                self.usage[u.container_id] = u.summary[:200]
            if u.rightsize:
                self.rightsize[u.container_id] = u.rightsize[:MAX_RIGHTSIZE_TEXT]

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

    def _initial_queues(self) -> QueueTree:
        """The configured queues file wins; without one, the config last applied by refresh-queues; else one
        `default` queue."""
        path = self.config.queues_file
        if path:
            try:
                return parse_queues(Path(path).read_text(), path)
            except OSError as exc:
                raise ConfigError([f"queues: cannot read {path}: {exc.strerror}"]) from None
        text = self.store.load_meta().get("queues_yaml", "")
        if text:
            try:
                return parse_queues(text, "the last applied queue config")
            except ConfigError as exc:
                log.error("ignoring the stored queue config: %s", "; ".join(exc.problems))
        return default_tree()

    def queues_pb(self) -> pb.ListQueuesResponse:
        return pbviews.queues(self.core)

    async def refresh_queues(self, text: str) -> pb.RefreshQueuesResponse:
        """All or nothing: an invalid config, or one that drops a queue still holding jobs, changes nothing.
        Reading, parsing and validating run in a worker thread (a big config does not stall other clients); the
        swap runs on the loop. One refresh at a time."""
        async with self._refresh_lock:
            return await self._refresh_queues(text)

    async def _refresh_queues(self, text: str) -> pb.RefreshQueuesResponse:
        source = "the uploaded config"
        self.persist.check_writable()
        if not text:
            if not self.config.queues_file:
                return pb.RefreshQueuesResponse(applied=False, errors=[
                    "the RM was started without a queues file: pass one (gpurm admin refresh-queues FILE)"])
            source = self.config.queues_file
            try:
                text = await asyncio.to_thread(read_queues_file, Path(source))
            except ConfigError as exc:
                return pb.RefreshQueuesResponse(applied=False, errors=exc.problems)
        try:
            tree = await asyncio.to_thread(parse_queues, text, source)
        except ConfigError as exc:
            log.warning("queue config rejected (%d problems); the old one stays", len(exc.problems))
            return pb.RefreshQueuesResponse(applied=False, errors=exc.problems)
        async with self.mutation() as m:
            problems = self.core.replace_tree(tree)
            if not problems:
                m.meta["queues_yaml"] = text
                self.core.schedule(time.time())
        if not problems:
            self.committed_tree = tree      # written: a later rollback keeps it
        if problems:
            log.warning("queue config rejected: %s", "; ".join(problems))
            return pb.RefreshQueuesResponse(applied=False, errors=problems)
        log.info("queue config applied from %s: %d leaf queues", source, len(tree.leaves))
        warnings = capacity_warnings(tree, self.core.cluster.capacity)
        for warning in warnings:
            log.warning("queue config: %s", warning)
        return pb.RefreshQueuesResponse(applied=True, queues=self.queues_pb().queues, warnings=warnings)

    def groups_of(self, user: str) -> list[str]:
        """The OS groups of `user` on the RM host (for @group ACL entries), cached for a minute."""
        cached = self._groups.get(user)
        now = time.monotonic()
        if cached is not None and now - cached[0] < 60:
            return cached[1]
        names: list[str] = []
        try:
            pw = pwd.getpwnam(user)
            for gid in os.getgrouplist(user, pw.pw_gid):
                with contextlib.suppress(KeyError):
                    names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
        self._groups[user] = (now, names)
        return names

    def schedule_soon(self) -> bool:
        """Whether an allocate call should run the scheduling pass itself now. Under load passes are
        coalesced to one per `scheduler_interval`; the loop below runs the deferred ones."""
        now = time.monotonic()
        if now - self._last_pass >= self.config.scheduler_interval_s:
            self._last_pass = now
            return True
        self._pass_pending = True
        return False

    async def _schedule_loop(self) -> None:
        took = 0.0
        while True:
            # Passes take at most half the loop's time: a slow pass (a burst on a big cluster) spaces them out.
            await asyncio.sleep(max(self.config.scheduler_interval_s, took))
            if self._pass_pending and self.persist.writable:
                self._pass_pending = False
                self._last_pass = time.monotonic()
                with contextlib.suppress(RequestError):   # a failed write: logged already
                    async with self.mutation():
                        began = time.perf_counter()
                        self.core.schedule(time.time())
                        took = time.perf_counter() - began
                        self.metrics.schedule_seconds.observe(took)
                self.pass_written()

    def pass_written(self) -> None:
        """A scheduling pass is done and its grants are on disk: replies held for it may take them."""
        done, self._pass_done = self._pass_done, asyncio.Event()
        done.set()

    async def next_pass(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) for the next scheduling pass to be done and written; whether one was."""
        return await wait_set(self._pass_done, timeout_s)

    def new_session(self) -> str:
        return uuid.uuid4().hex

    async def read_logs(self, request: pb.GetLogsRequest, tail: int = 0) -> pb.GetLogsResponse:
        """`tail` > 0: the last `tail` bytes instead of from `request.offset` (the web UI's job page)."""
        job, containers = self.job_records(request.job_id)
        container_id, node_id = log_container(containers, job, request.am, request.attempt, request.rank)
        node = self.core.cluster.nodes.get(node_id)
        if node is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"node {node_id} is unknown to this RM; logs unreachable")
        stub = pbg.ContainerManagerStub(self.agent_channel(node_id))
        try:
            c = containers[container_id]
            token = self.sign(c, READ_LOG_TOKEN_S, pb.TOKEN_READ_LOG)
            offset = -tail if tail > 0 else max(request.offset, 0)   # negative: that many bytes before the end
            reply = await stub.ReadLog(pb.ReadLogRequest(container_id=container_id, offset=offset,
                                                         max_bytes=request.max_bytes or 65536, token=token),
                                       timeout=AGENT_CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise RequestError(ErrorCode.UNAVAILABLE,
                               f"cannot read the log of {container_id} from {node_id} "
                               f"({node.state.name.lower()}): {exc.details()}") from None
        return pb.GetLogsResponse(data=reply.data, next_offset=reply.next_offset, size=reply.size,
                                  container_id=container_id, node_id=node_id, container_done=reply.container_done)

    # ------------------------------------------------------------ lifecycle

    async def _loop_lag_loop(self) -> None:
        """Measure how late the event loop runs a timer: when it is busy, everything waits that long."""
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            self.metrics.loop_lag_seconds.observe(max(0.0, loop.time() - began - LAG_PROBE_S))

    async def _tick_loop(self) -> None:
        interval = min(1.0, self.core.settings.heartbeat_interval_s / 2)
        while True:
            await asyncio.sleep(interval)
            if not self.persist.writable:
                continue       # the store refuses writes: the periodic work waits for it
            try:
                async with self.mutation():
                    self.core.tick(time.time())
                await self.retire_finished(time.time())
                self._forget_tokens()
            except RequestError:
                pass           # the store refused this tick's write (logged once by the persister)
            except Exception:
                log.exception("tick failed")

    async def run(self, stop: asyncio.Event) -> None:
        t0 = time.monotonic()
        problem = listen_problem(self.config.listen)
        if problem:
            raise OSError(f"cannot listen on {self.config.listen}: {problem}")
        problem = listen_problem(self.config.http.listen) if self.config.http.enabled else ""
        if problem:
            raise OSError(f"cannot listen on {self.config.http.listen} (http.listen): {problem}; choose another "
                          "port, or http.enabled: false")
        if self.leadership is not None:
            # One of several RMs on one PostgreSQL: stand by (answering with the leader's address) until this one
            # leads; from then on every write it makes is fenced by its epoch (rm/leadership.py).
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
        # The automatic backup at start is SQLite's (its online backup API); a PostgreSQL store is backed up
        # with `gpurm admin store backup --url` (pg_dump) on the operator's schedule (docs/operations.md).
        kept = (rotate_backup(self.store, self.config.state_dir, self.config.store_backups)
                if isinstance(self.store, SqliteStore) else None)
        if kept is not None:
            log.info("store backed up to %s (keeping the last %d)", kept, self.config.store_backups)
        if not self.mqtt_url:
            host, port = parse_address(self.config.mqtt_listen)
            self.broker = EmbeddedBroker(host, port, self.broker_auth)
            await self.broker.start()
            self.mqtt_url = self.broker.url
        self.publisher = mqtt.Publisher(self.mqtt_url, "rm", self.broker_auth.rm)
        self.publisher.start()
        server = make_server(self.config.limits, [DecodeGuard()])
        pbg.add_ClientServicer_to_server(ClientService(self), server)
        pbg.add_AdminServicer_to_server(AdminService(self), server)
        pbg.add_ApplicationMasterServicer_to_server(AMService(self), server)
        pbg.add_ResourceTrackerServicer_to_server(TrackerService(self), server)
        host, port = parse_address(self.config.listen)
        try:
            bound = tls.add_port(server, f"{host}:{port}", self.config.tls)
        except RuntimeError:
            bound = 0
        if not bound:
            raise OSError(f"cannot listen on {self.config.listen}: address in use or not available")
        await server.start()
        try:
            web = await self._start_http()
        except OSError:          # taken since the check above: stop what started, then say why
            await server.stop(grace=0)
            await self.publisher.stop()
            if self.broker is not None:
                await self.broker.stop()
            raise
        if web is not None and self.leadership is not None:
            await self.leadership.advertise_http(self.http_url)
        self._write_pidfile(host, bound)
        for line in self.security_warnings():
            log.warning("%s", line)
        live = sum(1 for j in self.core.jobs.values() if not j.state.terminal)
        log.info("RM serving on %s:%d%s (MQTT %s); restart to serving took %.0f ms; %d jobs (%d live), %d nodes "
                 "known", host, bound, " with mTLS" if self.config.tls else "", self.mqtt_url,
                 (time.monotonic() - t0) * 1000, len(self.core.jobs), live, len(self.core.cluster.nodes))
        async with self.mutation():
            for job in self.core.jobs.values():
                self._publish_job(job.job_id)
        self._view_dirty.set()
        tasks = [asyncio.create_task(self._tick_loop()), asyncio.create_task(self._publish_view_loop()),
                 asyncio.create_task(self._schedule_loop()), asyncio.create_task(self._store_retry_loop()),
                 asyncio.create_task(self._loop_lag_loop())]
        if self.leadership is not None:
            tasks.append(asyncio.create_task(self.leadership.keep(stop)))
        try:
            await stop.wait()
        finally:
            log.info("RM stopping")
            for t in tasks:
                t.cancel()
            for stream in list(self.streams.values()):
                stream.close()
            if web is not None:
                await web.stop()
            await server.stop(grace=self.config.shutdown_grace_s)
            # Ended for sure before the store closes (a cancellation can be lost: rm/aio.py).
            await stop_tasks([*tasks, *self._tasks], give_up_s=STOP_TASKS_S)
            if self._job_events_timer is not None:      # what is due goes out before the publisher stops
                self._job_events_timer.cancel()
                self._publish_job_events()
            for ch in self._channels.values():
                await ch.close()
            await self.publisher.stop()
            if self.broker is not None:
                await self.broker.stop()
            await asyncio.to_thread(self.persist.close)
            if self.leadership is not None:
                await self.leadership.release()

    async def _start_http(self) -> Any:
        """The web UI and REST API in this event loop (rm.yaml `http:`); None when turned off."""
        if not self.config.http.enabled:
            log.info("HTTP (web UI, REST API) off: http.enabled is false")
            return None
        from gpurm.rm.http.server import HttpServer

        web = HttpServer(self, self.config.http, self.config.tls, extra=self.http_routes)
        self.http_url = await web.start()
        log.info("web UI and REST API on %s", self.http_url)
        return web

    def _write_pidfile(self, host: str, port: int) -> None:
        path = self.config.state_dir / "rm.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "address": f"{host}:{port}", "mqtt_url": self.mqtt_url,
                                   "http_url": self.http_url}))
        os.replace(tmp, path)


# Allocations between young collections, and young / middle collections between older ones (CPython's defaults,
# 700 / 10 / 10, suit small heaps): a full collection at most every 40M allocations, minutes apart under load.
GC_THRESHOLDS = (20_000, 20, 100)
SWITCH_INTERVAL_S = 0.0005    # how often the loop hands the GIL to a waiting thread (the store writer)
STOP_TASKS_S = 2.0            # at a stop, how long the RM's own loops get to end (within shutdown.timeout)


def settle_heap() -> None:
    """After loading the store: move what was loaded out of the cyclic collector's sight, and collect less
    often. A full collection walks every tracked object: with 10,000 nodes and their records that stalled the
    event loop for hundreds of milliseconds at a time (every heartbeat waited). The records are not garbage; what
    the RM allocates per request is short-lived and freed by reference counting."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    # The store's writer thread (rm/storewriter.py) needs the GIL back after each SQLite call, and a busy event
    # loop gives it up only every switch interval: at the default 5 ms a commit waited 25 ms at 10,000 nodes.
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def read_queues_file(path: Path) -> str:
    """The text of a queues file, at most MAX_YAML_BYTES (ConfigError naming the file and the reason)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"cannot read {path}: {exc.strerror}"]) from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError([f"{path}: larger than {MAX_YAML_BYTES} bytes (the limit for a queue config)"])
    return raw.decode("utf-8", errors="replace")
