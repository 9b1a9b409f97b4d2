"""The AM process: the asyncio shell around `Master`. It talks to the RM (register, allocate, finish) and to
agents (start / stop learners), and feeds what it hears into the state machine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from gpurm.am.master import Master
from gpurm.am.placement import ServerView
from gpurm.am.records import Action, AttemptRecord, Ended, Held, Launch, Phase, Stop
from gpurm.am.view import ViewFollower
from gpurm.common import convert, mqtt, tls
from gpurm.common.aio import wait_set
from gpurm.common.callers import AM_TOKEN_KEY
from gpurm.common.jobspec import JobSpec, image_key, mounts_to_proto, spec_from_proto
from gpurm.common.model import FailureKind, JobState
from gpurm.common.mqtt import Credentials
from gpurm.common.retry import AM_POLICY, RECONNECT_OPTIONS, Outage, RetryPolicy
from gpurm.common.rmlist import Channels, LeaderFollower, parse_rm_list, rpc_failure
from gpurm.common.tls import TLSConfig
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg

log = logging.getLogger("gpurm.am")

T = TypeVar("T")
RM_RETRY_FOR_S = AM_POLICY.give_up_s     # ride out an RM restart for this long (rm.yaml am.rm_retry_for)
AGENT_TIMEOUT_S = 15.0
MAX_STEADY_S = 60.0          # the longest wait between calls an RM may ask of a running AM
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED)


class AMExit(Exception):
    """The AM must stop: its job ended elsewhere, or the RM no longer knows this AM attempt."""


def servers_from_view(view: pb.ClusterView, image: str = "") -> list[ServerView]:
    """The servers a job may plan on: running ones; for an image job (`image`), only those with a container
    engine, those that hold the image marked (preferred at equal locality). GPUs held by elastic jobs' growth
    count as free to plan on: the RM takes them back for a waiting ask."""
    key = image_key(image) if image else ""
    return [ServerView(node_id=n.node_id, rack=n.rack, total=n.gpus_healthy,
                       free=tuple(sorted({*n.free_gpus, *n.elastic_gpus})) if n.elastic_gpus else tuple(n.free_gpus),
                       islands=tuple(tuple(i.gpus) for i in n.islands), ib_domain=n.ib_domain,
                       reclaimable=tuple(n.elastic_gpus), reserved=tuple(n.reserved_gpus),
                       reserved_for=n.reserved_for, reserved_until=n.reserved_until_ms / 1000,
                       has_image=bool(key) and key in n.images)
            for n in view.nodes if n.state == pb.NODE_RUNNING and (n.container_engine or not image)]


def held_from_grant(g: pb.ContainerGrant) -> Held:
    return Held(container_id=g.container_id, node_id=g.node_id, rack=g.rack, host=g.host, port=g.agent_port,
                gpu_indices=tuple(g.gpu_indices), token=g.token, preemptible=g.preemptible)


def ended_from_status(s: pb.ContainerStatus) -> Ended:
    return Ended(container_id=s.container_id, exit_code=s.exit_code, signal=s.signal, stopped=s.stopped,
                 failed_to_start=s.state == pb.CONTAINER_FAILED_TO_START, lost=s.state == pb.CONTAINER_LOST,
                 infra=s.infra_failure, diagnostics=s.diagnostics, user_error=s.user_error)


def attempt_from_pb(a: pb.Attempt) -> AttemptRecord:
    return AttemptRecord(
        number=a.attempt, state=convert.JOB_STATE_FROM_PB.get(a.state, JobState.ALLOCATING),
        start_time=a.start_ms / 1000, end_time=a.end_ms / 1000,
        learners=[convert.learner_from_pb(x) for x in a.learners],
        failure=convert.FAILURE_FROM_PB.get(a.failure, FailureKind.NONE), cause=a.cause,
        exit_code=a.exit_code, counts_as_failure=a.counts_as_failure, level=a.level)


def report_pb(a: AttemptRecord) -> pb.AttemptReport:
    return pb.AttemptReport(
        attempt=a.number, state=convert.JOB_STATE_TO_PB[a.state],
        learners=[convert.learner_to_pb(x) for x in a.learners], waiting_reason=a.waiting_reason, level=a.level,
        failure=convert.FAILURE_TO_PB[a.failure], cause=a.cause, exit_code=a.exit_code,
        counts_as_failure=a.counts_as_failure, start_ms=convert.ms(a.start_time), end_ms=convert.ms(a.end_time))


class AMRunner:
    def __init__(self, rm_address: str | Sequence[str], job_id: str, am_attempt: int, am_token: str,
                 tls_config: TLSConfig | None = None, rm_retry_for: float = RM_RETRY_FOR_S) -> None:
        # GPURM_RM: the RM, or the active/standby list, as the node's agent dials them; the AM follows the leader.
        self.follower = LeaderFollower(parse_rm_list(rm_address))
        self.retry = RetryPolicy(AM_POLICY.base_s, AM_POLICY.max_s, rm_retry_for)
        self.tls = tls_config  # mTLS to the RM and the agents (the node's certificate), None = plaintext
        self.job_id = job_id
        self.am_attempt = am_attempt
        self.metadata = ((AM_TOKEN_KEY, am_token),)
        self.tokens: dict[str, pb.ContainerToken] = {}   # container id -> newest token (the RM renews them)
        self._agents: dict[str, grpc.aio.Channel] = {}
        self.channels: Channels[grpc.aio.Channel] | None = None
        self.am: Any
        self.client: Any
        self._wake: asyncio.Event
        self._tasks: set[asyncio.Task[None]] = set()
        self._ports: dict[int, int] = {}       # attempt -> the port reserved on its master (rendezvous)
        self.master: Master | None = None
        self.spec: JobSpec | None = None
        self.view: ViewFollower | None = None
        self.interval = 0.5
        self._steady = 2.0  # between calls while the job just runs (the RM says how long)
        self.rng = random.Random()

    # ------------------------------------------------------------ RM calls that ride out an RM restart

    async def _rm_call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Every AM call to the RM is safe to repeat (register and finish are idempotent, an allocate carries its
        response_id), so an unreachable RM is ridden out with the shared back-off (`gpurm.common.retry`) for up to
        rm.yaml's `am.rm_retry_for`; then the AM fails (its job's GPUs stay held until the RM, once back,
        restarts the AM)."""
        outage: Outage | None = None
        while True:
            address = self.follower.current
            try:
                reply = await call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                                  grpc.StatusCode.PERMISSION_DENIED):
                    raise AMExit(f"{what}: {exc.details()}") from None
                if exc.code() not in TRANSIENT:
                    raise
                failure = rpc_failure(exc)
                # Away or a standby: the leader it named, else the next RM of the list, at once until a whole round
                # of the list failed; then the back-off below.
                if failure.failover and not self.follower.failed(failure.why, failure.hint):
                    log.info("%s: RM at %s did not answer as leader (%s); trying %s", what, address,
                             failure.why, self.follower.current)
                    continue
                now = time.monotonic()
                rms = (f"RM at {address}" if not self.follower.several
                       else f"RMs {', '.join(self.follower.addresses)}")
                if outage is None:
                    outage = Outage(self.retry, now, self.rng)
                    log.warning("%s: %s unreachable (%s); retrying for %s", what, rms,
                                self.follower.tried() if self.follower.several else exc.code().name,
                                f"{self.retry.give_up_s:g}s" if self.retry.give_up_s else "ever")
                delay = outage.next_delay(now)
                if delay is None:
                    log.error("%s: %s still unreachable after %.0fs; giving up", what, rms, outage.elapsed(now))
                    raise
                await asyncio.sleep(delay)
                continue
            if outage is not None:
                log.info("%s: RM at %s answers again after %.1fs", what, address, outage.elapsed(time.monotonic()))
            self.follower.succeeded()
            return reply

    def _take_am_token(self, token: str) -> None:
        if token:
            self.metadata = ((AM_TOKEN_KEY, token),)

    def _token(self, held: Held) -> pb.ContainerToken:
        """The newest token for a held container (tokens expire in minutes; allocate replies renew them)."""
        token = self.tokens.get(held.container_id, held.token)
        return token if isinstance(token, pb.ContainerToken) else pb.ContainerToken()

    def _agent(self, host: str, port: int) -> pbg.ContainerManagerStub:
        address = f"{host}:{port}"
        ch = self._agents.get(address)
        if ch is None:
            ch = tls.aio_channel(address, self.tls)
            self._agents[address] = ch
        return pbg.ContainerManagerStub(ch)

    # ------------------------------------------------------------ main loop

    async def run(self) -> int:
        # grpc.aio channels belong to the loop they are made in: make them here, not in __init__.
        client_tls = self.tls
        self.channels = Channels(self.follower, lambda a: tls.aio_channel(a, client_tls, RECONNECT_OPTIONS))
        # Stubs that call the RM the follower is on at call time (the view follower's too).
        self.am = self.channels.stub(pbg.ApplicationMasterStub)
        self.client = self.channels.stub(pbg.ClientStub)
        self._wake = asyncio.Event()
        reg = await self._rm_call("register", lambda: self.am.RegisterApplicationMaster(
            pb.RegisterAMRequest(job_id=self.job_id, am_attempt=self.am_attempt, host=socket.gethostname()),
            metadata=self.metadata, timeout=10))
        self._take_am_token(reg.am_token)
        for g in reg.held:
            self.tokens[g.container_id] = g.token
        self.spec = spec_from_proto(reg.job.spec)
        self.interval = max(reg.allocate_interval_ms / 1000, 0.05) if reg.allocate_interval_ms else 0.5
        now = time.time()
        master = Master(self.spec, now, rng=self.rng, job_id=self.job_id)
        self.master = master
        mqtt_url = os.environ.get(mqtt.MQTT_URL_ENV) or reg.mqtt_url   # the node's mqtt.advertise, if set
        self.view = ViewFollower(mqtt_url, self.client, reg.view,
                                 Credentials(reg.mqtt_username, reg.mqtt_password) if reg.mqtt_username else None)
        await self.view.start()
        master.on_view(servers_from_view(self.view.current, self.spec.image), now)
        if reg.job.attempts:
            master.adopt([attempt_from_pb(a) for a in reg.job.attempts],
                         [held_from_grant(g) for g in reg.held],
                         [ended_from_status(s) for s in reg.held_status if s.state not in
                          (pb.CONTAINER_RUNNING, pb.CONTAINER_STARTING)], now)
            log.info("AM attempt %d adopted %s (%d learners running)", self.am_attempt, self.job_id,
                     len(master.runs))
        log.info("AM for %s: %d GPUs, start level %s, timeout %.0fs", self.job_id, self.spec.gpus,
                 self.spec.locality.start_level.label, self.spec.locality.timeout_s)
        response_id = 0
        try:
            while master.final is None:
                now = time.time()
                if self.view.changed:
                    master.on_view(servers_from_view(self.view.take(), master.spec.image), now)
                master.step(now)
                self._execute(master.take_actions())
                if master.final is not None:
                    break
                request = pb.AllocateRequest(
                    job_id=self.job_id, am_attempt=self.am_attempt, response_id=response_id,
                    asks=[pb.ResourceAsk(node_id=n, gpus=g, count=1, gpu_indices=idx,
                                         gpu_share_milli=master.spec.gpu_share_milli)
                          for n, g, idx in master.asks()]
                    + [pb.ResourceAsk(node_id=n, gpus=g, count=1, gpu_indices=idx, elastic=True)
                       for n, g, idx in master.growth_asks(now)],
                    releases=master.take_releases(), attempts=[report_pb(a) for a in master.take_reports(now)])
                resp = await self._rm_call("allocate", lambda req=request: self.am.Allocate(  # type: ignore[misc]
                    req, metadata=self.metadata, timeout=10))
                response_id = resp.response_id
                # A running job's AM calls less often; the RM stretches that with the number of AMs
                # (rm/sched/pacing.py).
                self._steady = max(self.interval * 4, min(resp.steady_interval_ms / 1000, MAX_STEADY_S))
                now = time.time()
                self._take_am_token(resp.am_token)
                master.set_target(resp.target_gpus, now)
                for g in [*resp.grants, *resp.renewed]:
                    self.tokens[g.container_id] = g.token
                for g in resp.grants:
                    master.on_grant(held_from_grant(g), now)
                # The notice before the ends: a grace shorter than this loop's interval kills the containers
                # before the AM hears why, and their ends must read as the preemption, not as the job's failure.
                if resp.preemption.container_ids:
                    grace = max(0.0, resp.preemption.deadline_ms / 1000 - now)
                    master.on_preempted(resp.preemption.container_ids, grace, now, resp.preemption.reason[:500])
                for s in resp.completed:
                    self.tokens.pop(s.container_id, None)
                    ended = ended_from_status(s)
                    log.info("container %s ended: %s", s.container_id, ended.describe())
                    master.on_ended(ended, now)
                if resp.kill_requested:
                    master.on_kill("killed", now)
                master.expected_run_s = resp.expected_run_ms / 1000
                if resp.plan_now:
                    master.on_room(now)      # GPUs wait for it (its reservation is ready, a room was made)
                master.on_reply()
                self._execute(master.take_actions())
                if master.final is None:
                    self._wake.clear()
                    fast = master.phase in (Phase.ACQUIRING, Phase.LAUNCHING, Phase.STOPPING)
                    await wait_set(self._wake, self.interval if fast else self._steady)
            await self._finish(master)
        except AMExit as exc:
            log.warning("AM stops: %s", exc)
            return 0
        finally:
            await self._close()
        return 0

    async def _finish(self, master: Master) -> None:
        assert master.final is not None
        final = master.final
        log.info("job %s ends %s: %s", self.job_id, final.state.name, final.diagnostics)
        # Stops must reach the agents before the AM goes; the RM would stop them anyway.
        self._execute(master.take_actions())
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=AGENT_TIMEOUT_S)
        request = pb.FinishAMRequest(job_id=self.job_id, am_attempt=self.am_attempt,
                                     final_state=convert.JOB_STATE_TO_PB[final.state],
                                     diagnostics=final.diagnostics, exit_code=final.exit_code,
                                     attempts=[report_pb(a) for a in master.take_reports(time.time())])
        # Finishing makes the RM stop and reclaim anything this job still holds.
        await self._rm_call("finish", lambda: self.am.FinishApplicationMaster(
            request, metadata=self.metadata, timeout=10))

    async def _close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self.view is not None:
            log.info("cluster view: %s", self.view.summary())
            await self.view.stop()
        for ch in self._agents.values():
            await ch.close()
        if self.channels is not None:
            for channel in self.channels.channels.values():
                await channel.close()

    # ------------------------------------------------------------ actions on agents

    def _execute(self, actions: list[Action]) -> None:
        for action in actions:
            coro = self._launch(action) if isinstance(action, Launch) else self._stop(action)
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _launch(self, launch: Launch) -> None:
        assert self.spec is not None and self.master is not None
        known = self._ports.get(launch.attempt)
        if known is not None:
            port = known          # a grown learner of an elastic job: the attempt's rendezvous port
        else:
            master_held = next(h for h, rank, _ in launch.learners if rank == 0)
            port = 29500
            try:
                reply = await self._agent(master_held.host, master_held.port).ReservePort(
                    pb.ReservePortRequest(job_id=self.job_id, token=self._token(master_held)),
                    timeout=AGENT_TIMEOUT_S)
                port = reply.port
            except grpc.aio.AioRpcError as exc:
                log.warning("could not reserve a port on %s (%s); using %d", master_held.node_id, exc.details(),
                            port)
            self._ports[launch.attempt] = port
        log.info("attempt %d: launching %d learners (ranks %s), master %s port %d", launch.attempt,
                 len(launch.learners), ",".join(str(r) for _, r, _ in launch.learners), launch.master_node, port)
        await asyncio.gather(*(self._start_one(h, rank, env, port) for h, rank, env in launch.learners))
        self._wake.set()

    async def _start_one(self, held: Held, rank: int, env: dict[str, str], port: int) -> None:
        assert self.spec is not None and self.master is not None
        full_env = {**self.spec.env, **env, "MASTER_PORT": str(port), "GPURM_JOB_ID": self.job_id}
        if self.spec.elastic:
            # torchrun's elastic rendezvous (see elastic_env in am/launch.py): one endpoint and id per attempt.
            full_env["GPURM_RDZV_ENDPOINT"] = full_env["PET_RDZV_ENDPOINT"] = f"{env.get('MASTER_ADDR', '')}:{port}"
            full_env["PET_RDZV_ID"] = f"{self.job_id}-{env.get('PET_RDZV_ID', '')}"
        request = pb.StartContainerRequest(token=self._token(held), launch=pb.LaunchContext(
            argv=self.spec.command, env=full_env, workdir=self.spec.workdir, image=self.spec.image,
            mounts=mounts_to_proto(self.spec.mounts), shm_size_mib=self.spec.shm_size_mib))
        try:
            reply = await self._agent(held.host, held.port).StartContainer(request, timeout=AGENT_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self.master.on_started(held.container_id, False, 0,
                                   f"agent {held.node_id} unreachable or refused: {exc.details()}", True, time.time())
            return
        status = reply.status
        if status.state == pb.CONTAINER_FAILED_TO_START:
            self.master.on_started(held.container_id, False, 0, status.diagnostics, status.infra_failure,
                                   time.time(), user_error=status.user_error)
        elif status.state in (pb.CONTAINER_RUNNING, pb.CONTAINER_STARTING, pb.CONTAINER_EXITED):
            # An already exited learner still started; its end arrives through the RM.
            self.master.on_started(held.container_id, True, status.pid, "", False, time.time())
        log.info("rank %d started on %s GPUs %s (pid %d)", rank, held.node_id, list(held.gpu_indices), status.pid)

    async def _stop(self, stop: Stop) -> None:
        h = stop.held
        if not h.port:
            return          # adopted without an address: the RM stops it
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._agent(h.host, h.port).StopContainer(
                pb.StopContainerRequest(container_id=h.container_id, token=self._token(h),
                                        grace_ms=round(stop.grace_s * 1000), reason=stop.reason[:200]),
                timeout=stop.grace_s + AGENT_TIMEOUT_S)
        self._wake.set()
