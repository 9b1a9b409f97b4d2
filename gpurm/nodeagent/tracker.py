"""The agent's side of the ResourceTracker protocol: register with the RM, then heartbeat on one stream.

Container changes are deltas: each one stays pending until the RM acknowledges (ack_seq) the first beat
that carried it, and beats go out at once (coalesced ~20 ms) when something changes, not only on the
interval. The interval is the RM's: named at registration and again in every heartbeat reply (it grows with the
fleet, rm/state/heartbeats.py), with the fence's lease, which the agent follows from that reply on. Any failure (RM
down, restarted, stream broken, no reply in time) leads back to registration after a jittered back-off;
registration reports every container the agent knows, so an RM restart loses nothing and no container is touched
by it.

With several RMs (agent.yaml `rm: [a:7070, b:7070]`, an active/standby set) a failure moves the agent to the
leader a standby named, when it is one of the list, else to the next RM (`gpurm.common.rmlist`); the back-off sleeps
only once every RM of the list failed, and rm_retry.give_up_after bounds the whole outage as before.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gpurm.common import tls
from gpurm.common.aio import stop_tasks, wait_set
from gpurm.common.lease import agent_wait_s
from gpurm.common.retry import Outage
from gpurm.common.rmlist import LeaderFollower, rpc_failure
from gpurm.common.tokens import TokenKey, join_proof
from gpurm.nodeagent.backoff import Backoff
from gpurm.nodeagent.config import AgentConfig
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.fence import Fence
from gpurm.nodeagent.gpus import GpuDevice
from gpurm.nodeagent.records import ContainerRecord
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

COALESCE_S = 0.02
REGISTER_TIMEOUT_S = 10.0
LATE_S = 0.5                # a watchdog woken this much late: the agent, not the RM, was stopped
MIN_REGISTER_WAIT_S = 2.0   # a registration writes to the store: never given less, whatever the lease
DEFAULT_INTERVAL_S = 1.0
BACKOFF_BASE_S = 0.2
BACKOFF_MAX_S = 5.0

HeartbeatCall = grpc.aio.StreamStreamCall[pb.NodeHeartbeat, pb.HeartbeatResponse]


def agent_version() -> str:
    try:
        return importlib.metadata.version("gpurm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Registration:
    """What one successful RegisterNode handed the agent."""

    session: str
    interval_s: float
    token_key: TokenKey | None   # signs this node's container tokens (None: the RM gave none, the agent has none)
    mqtt_url: str
    resync_spread_s: float = 0.0  # after losing the RM, wait up to this (at random) before registering again


@dataclass
class _Pending:
    status: pb.ContainerStatus
    version: int                  # the record version this status shows
    sent_seq: int | None = None   # the first beat that carried this version


class _StreamEnded(Exception):
    pass


class RMUnreachable(Exception):
    """The RM stayed unreachable past agent.yaml's rm_retry.give_up_after."""


def _tracker_stub(channel: grpc.aio.Channel) -> Any:
    # Through a typed name: the generated module has no annotations.
    make: Callable[[grpc.aio.Channel], Any] = pb_grpc.ResourceTrackerStub
    return make(channel)


class Tracker:
    def __init__(self, cfg: AgentConfig, supervisor: ContainerSupervisor, gpus: Sequence[GpuDevice], *,
                 agent_port: int, on_registered: Callable[[Registration], None] | None = None,
                 metrics_port: int = 0,
                 agent_instance: str | None = None, backoff: Backoff | None = None) -> None:
        self.cfg = cfg
        self.supervisor = supervisor
        self.gpus = list(gpus)
        self.agent_port = agent_port
        self.metrics_port = metrics_port
        self.agent_instance = agent_instance or uuid.uuid4().hex
        self.on_registered = on_registered
        # Fills health and telemetry into each RegisterNodeRequest / NodeHeartbeat before it leaves (monitor.py).
        self.decorate: Callable[[pb.RegisterNodeRequest | pb.NodeHeartbeat], None] | None = None
        self.registration: Registration | None = None
        self.registered = asyncio.Event()   # set while a session is open
        self.registrations = 0
        self._backoff = backoff or Backoff(cfg.rm_retry.base_s, cfg.rm_retry.max_s)
        self._outage: Outage | None = None   # since when the RM has been unreachable (None: it answers)
        self.follower = LeaderFollower(cfg.rm_list)   # which RM of agent.yaml's list to dial now
        self.clock: Callable[[], float] = time.monotonic
        self._seq = 0
        self._pending: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._outage_logged = False
        self._last_reply = 0.0  # loop time of the last heartbeat reply
        self.interval_s = DEFAULT_INTERVAL_S   # the heartbeat interval the RM named last
        self.fence: Fence | None = None    # renewed by every answer from the RM (nodeagent/fence.py)
        self._sent_at: dict[int, float] = {}   # beat seq -> when it left (the fence's clock), until answered
        supervisor.add_listener(self._on_change)

    # ------------------------------------------------------------------ public

    async def run(self) -> None:
        """Register and heartbeat until cancelled, reconnecting after any failure."""
        while True:
            address = self.follower.current
            try:
                async with tls.aio_channel(address, self.cfg.tls) as channel:
                    stub = _tracker_stub(channel)
                    reg = await self._register(stub, address)
                    await self._heartbeat(stub, reg)
                log.info("the RM asked this agent to register again")
            except Exception as exc:  # whatever broke, the agent must come back to the RM
                self._lost(exc, address)
                now = self.clock()
                if self._outage is None:
                    self._outage = Outage(self.cfg.rm_retry, now)
                left = self._outage.left(now)
                if left is not None and left <= 0:
                    rms = (f"RM at {address} has" if not self.follower.several
                           else f"RMs {self.follower.tried()} have")
                    raise RMUnreachable(f"the {rms} been unreachable for {self._outage.elapsed(now):.0f}s "
                                        "(rm_retry.give_up_after)") from exc
                failure = rpc_failure(exc) if isinstance(exc, grpc.RpcError) else None
                if failure is None or failure.failover:   # away, silent or a standby: the next RM, or the leader
                    due = self.follower.failed(failure.why if failure else str(exc) or type(exc).__name__,
                                               failure.hint if failure else "")
                    if failure is not None and failure.hint and self.follower.current == failure.hint:
                        log.info("the RM at %s is a standby: following it to the leader at %s", address,
                                 failure.hint)
                    elif self.follower.current != address:
                        log.debug("trying the RM at %s next", self.follower.current)
                else:
                    due = True                              # the RM refused: ask it again after the back-off
                delay = self._backoff.next() if due else 0.0
                if self.registered.is_set() and self.registration is not None:
                    # A session just broke (most often: the RM restarted). Every agent of the fleet saw it at
                    # once: come back at a random point of the spread the RM asked for, not all together.
                    delay = max(delay, random.uniform(0, self.registration.resync_spread_s))
                if self.fence is not None and (held := self.fence.lease.left(self.fence.clock())):
                    delay = min(delay, max(0.1, held / 4))   # a lease runs: try again well before it runs out
                await asyncio.sleep(delay if left is None else min(delay, left))
            finally:
                self.registered.clear()

    def wake(self) -> None:
        """Send a beat now (health changed)."""
        self._wake.set()

    async def flush(self, timeout_s: float) -> bool:
        """Push pending container changes now and wait until the RM acknowledged them (best effort)."""
        if self._pending:
            self._drained.clear()
        self._wake.set()
        return await wait_set(self._drained, timeout_s)

    async def close(self) -> None:
        await stop_tasks(list(self._tasks))

    @property
    def pending(self) -> list[str]:
        """Container ids whose latest change the RM has not acknowledged yet."""
        return list(self._pending)

    # ------------------------------------------------------------------ registration

    async def _register(self, stub: Any, address: str) -> Registration:
        records = self.supervisor.records()
        request = pb.RegisterNodeRequest(
            node_id=self.cfg.node_id, host=self.cfg.host, agent_port=self.agent_port, rack=self.cfg.rack,
            metrics_port=self.metrics_port,
            container_engine=engine.kind.value if (engine := self.supervisor.engine) is not None else "",
            gpu_passing=engine.gpu_passing.value if engine is not None else "",
            ib_domain=self.cfg.ib_domain, gpus=[g.to_proto() for g in self.gpus], cpus=self.cfg.cpus,
            memory_mib=self.cfg.memory_mib, containers=[r.to_proto() for r in records],
            agent_version=agent_version(), agent_instance=self.agent_instance, healthy=True,
            follows_interval=True,
        )
        if self.decorate is not None:
            self.decorate(request)
        if self.cfg.node_secret is not None and self.cfg.tls is None:
            # Without mTLS the node proves itself with its secret; the secret itself never crosses the wire.
            request.join_time_ms = int(time.time() * 1000)
            request.join_proof = join_proof(self.cfg.node_secret.secret, self.cfg.node_id, self.agent_instance,
                                            request.join_time_ms)
        versions = {r.container_id: r.version for r in records}
        sent_at = self.fence.clock() if self.fence is not None else 0.0
        # With several RMs a registration hung on a stopped leader must leave time to try the next within the lease;
        # with one there is nothing else to try, and a fleet re-registering at once may need the full wait.
        timeout = max(MIN_REGISTER_WAIT_S, self._wait_s(REGISTER_TIMEOUT_S)) if self.follower.several \
            else REGISTER_TIMEOUT_S
        reply: pb.RegisterNodeResponse = await stub.RegisterNode(request, timeout=timeout)
        if self.fence is not None:
            self.fence.set_terms(reply.lease_ms / 1000, reply.fence_grace_ms / 1000)
            self.fence.renew(sent_at)
        stopped = [r for r in records if r.terminal and r.stopped and r.stop_reason.startswith("fenced")]
        if stopped:
            log.warning("reported %d containers the fence stopped while the RM was out of reach: %s",
                        len(stopped), ", ".join(sorted(r.container_id for r in stopped)))
        # The reply acknowledges every container the request carried, at the version it carried.
        for cid, version in versions.items():
            self._acknowledged(cid, version)
        interval_ms = reply.heartbeat_interval_ms
        reg = Registration(
            session=reply.session,
            interval_s=interval_ms / 1000 if interval_ms > 0 else DEFAULT_INTERVAL_S,
            token_key=(TokenKey(reply.token_key_id, bytes(reply.token_key)) if reply.token_key
                       else self.cfg.node_secret),
            mqtt_url=self.cfg.mqtt_advertise or reply.mqtt_url,
            resync_spread_s=reply.resync_spread_ms / 1000,
        )
        self.registration = reg
        self.interval_s = reg.interval_s
        self.registrations += 1
        self._outage = None
        self.follower.succeeded()
        log.info("registered with the RM at %s: session %s, %d containers, heartbeat every %.1fs",
                 address, reg.session, len(records), reg.interval_s)
        self._outage_logged = False
        if self.on_registered is not None:
            self.on_registered(reg)
        for cid in reply.stop_containers:
            self._order_stop(cid, 0, "the RM does not know this container")
        self.registered.set()
        return reg

    # ------------------------------------------------------------------ heartbeat stream

    async def _heartbeat(self, stub: Any, reg: Registration) -> None:
        """Returns when the RM asks for a new registration; raises when the stream fails."""
        call: HeartbeatCall = stub.Heartbeat()
        self._last_reply = asyncio.get_running_loop().time()
        tasks = [asyncio.create_task(self._send_loop(call, reg)),
                 asyncio.create_task(self._read_loop(call)),
                 asyncio.create_task(self._watchdog(reg))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            # Cancel the call before the tasks: a task cancelled inside grpc's read() can swallow the
            # cancellation and hang; a cancelled call ends the read at once.
            call.cancel()
            await stop_tasks(tasks)

    async def _send_loop(self, call: HeartbeatCall, reg: Registration) -> None:
        while True:
            self._wake.clear()
            await call.write(self._next_beat(reg))
            if await wait_set(self._wake, self.interval_s):
                await asyncio.sleep(COALESCE_S)  # let a burst of changes (a gang ending) share one beat

    async def _read_loop(self, call: HeartbeatCall) -> None:
        loop = asyncio.get_running_loop()
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                raise _StreamEnded("the RM closed the heartbeat stream")
            assert isinstance(response, pb.HeartbeatResponse)
            self._last_reply = loop.time()
            self._backoff.reset()
            self._outage = None
            self._on_ack(response.ack_seq)
            if response.action != pb.HEARTBEAT_REREGISTER:   # (a node the RM lost: the lease is not renewed)
                if response.heartbeat_interval_ms > 0:
                    self._follow(response)
                self._renew_lease(response.ack_seq)
            for order in response.stop:
                self._order_stop(order.container_id, order.grace_ms, order.reason or "stop ordered by the RM")
            if response.action == pb.HEARTBEAT_REREGISTER:
                return

    async def _watchdog(self, reg: Registration) -> None:
        """The RM answers every beat: this long a silence (three of the intervals it names and 5 s, or a quarter
        of the lease if less) means the connection is dead, even when TCP has not noticed yet (a paused leader)."""
        loop = asyncio.get_running_loop()
        while (left := self._last_reply + self._silence_s() - loop.time()) > 0:
            due = loop.time() + left
            await asyncio.sleep(left)
            if loop.time() - due > LATE_S:
                # This process was frozen or starved: not the RM's silence (its answers may be waiting in the
                # socket, and the reader has not had its turn yet). Count the silence from now.
                self._last_reply = max(self._last_reply, loop.time())
        raise _StreamEnded(f"no heartbeat reply for {self._silence_s():.0f}s")

    def _silence_s(self) -> float:
        return self._wait_s(3 * self.interval_s + 5.0)

    def _wait_s(self, default_s: float) -> float:
        """`default_s`, or less while a lease runs: a stopped leader must leave time to find the next RM (with
        several) before the fence stops every container (gpurm/common/lease.py)."""
        return agent_wait_s(self.fence.lease.lease_s if self.fence is not None else 0.0, self.interval_s, default_s)

    def _follow(self, response: pb.HeartbeatResponse) -> None:
        """The terms a heartbeat reply names: the interval to beat at from now on, the lease and its grace (set
        before this reply renews the lease, so the renewal runs under them)."""
        interval_s = response.heartbeat_interval_ms / 1000
        if interval_s != self.interval_s:
            log.info("the RM names a heartbeat interval of %gs (was %gs), lease %gs", interval_s, self.interval_s,
                     response.lease_ms / 1000)
            self.interval_s = interval_s
        if self.fence is not None and response.lease_ms > 0 and (
                response.lease_ms / 1000, response.fence_grace_ms / 1000) != (self.fence.lease.lease_s,
                                                                              self.fence.lease.grace_s):
            self.fence.set_terms(response.lease_ms / 1000, response.fence_grace_ms / 1000)

    def _renew_lease(self, ack_seq: int) -> None:
        sent_at = self._sent_at.get(ack_seq)
        if sent_at is None or self.fence is None:
            return
        for seq in [s for s in self._sent_at if s <= ack_seq]:
            del self._sent_at[seq]
        self.fence.renew(sent_at)

    def _next_beat(self, reg: Registration) -> pb.NodeHeartbeat:
        self._seq += 1
        if self.fence is not None:
            if len(self._sent_at) > 1000:        # a silent RM: keep the newest only (their answers renew most)
                self._sent_at = dict(list(self._sent_at.items())[-100:])
            self._sent_at[self._seq] = self.fence.clock()
        statuses = []
        for p in self._pending.values():
            if p.sent_seq is None:
                p.sent_seq = self._seq
            statuses.append(p.status)
        beat = pb.NodeHeartbeat(node_id=self.cfg.node_id, session=reg.session, seq=self._seq,
                                containers=statuses, healthy=True)
        if self.decorate is not None:
            self.decorate(beat)
        return beat

    # ------------------------------------------------------------------ pending changes

    def _on_change(self, rec: ContainerRecord) -> None:
        self._pending[rec.container_id] = _Pending(rec.to_proto(), rec.version)
        self._drained.clear()
        self._wake.set()

    def _on_ack(self, ack_seq: int) -> None:
        for cid, p in list(self._pending.items()):
            if p.sent_seq is not None and p.sent_seq <= ack_seq:
                self._acknowledged(cid, p.version)

    def _acknowledged(self, cid: str, version: int) -> None:
        p = self._pending.get(cid)
        if p is not None and p.version != version:
            return  # it changed again since: that change is still owed to the RM
        self._pending.pop(cid, None)
        rec = self.supervisor.record(cid)
        if rec is not None and rec.terminal and rec.version == version:
            self.supervisor.forget(cid)
        if not self._pending:
            self._drained.set()

    # ------------------------------------------------------------------ orders and failures

    def _order_stop(self, cid: str, grace_ms: int, reason: str) -> None:
        rec = self.supervisor.record(cid)
        if rec is None or rec.terminal:
            log.debug("stop order for %s: nothing to stop", cid)
            return
        grace = grace_ms / 1000 if grace_ms > 0 else self.cfg.containers.stop_grace_s
        self._spawn(self.supervisor.stop(cid, grace, reason))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("stop order failed: %s", task.exception())

    def _lost(self, exc: BaseException, address: str) -> None:
        expected = isinstance(exc, grpc.aio.AioRpcError | _StreamEnded | TimeoutError | OSError)
        if isinstance(exc, grpc.aio.AioRpcError):
            why = f"{exc.code().name}: {exc.details() or ''}".rstrip(": ")
        else:
            why = str(exc) or type(exc).__name__
        was = "lost the RM" if self.registered.is_set() else "cannot reach the RM"
        # One warning per outage; the retries in between are debug noise. A surprise gets its traceback.
        level = logging.DEBUG if self._outage_logged else logging.WARNING
        log.log(level, "%s at %s (%s); retrying with back-off, containers keep running",
                was, address, why, exc_info=None if expected else exc)
        self._outage_logged = True
