"""The RM's side of talking to its agents: one gRPC channel per agent address, an AM's launch (StartContainer with
a token signed for that node; a failed start recorded in the core), stop orders pushed down the agents' open
heartbeat streams between beats, and reading a container's log (ReadLog) for `gpurm logs` and the web UI.

RMShell (rm/server/daemon.py) calls these as the effects of a core call, after the store commit; it spawns the AM
launches as tasks of its own, so that they end before the store closes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import grpc

from gpurm.common import tls
from gpurm.common.model import Container, Job
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.config import RMConfig
from gpurm.rm.server.service import BeatStream
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ErrorCode, LaunchAM, RequestError
from gpurm.rm.state.stops import StopOrder
from gpurm.rm.state.views import log_container

log = logging.getLogger("gpurm.rm.server.daemon")     # the RM's one log name, whichever module writes the line

AGENT_CALL_TIMEOUT_S = 10.0
READ_LOG_TOKEN_S = 60.0


class Signer(Protocol):
    """RMShell.sign: a container token for `c`, valid `expiry_s`, for one purpose."""

    def __call__(self, c: Container, expiry_s: float, purpose: pb.TokenPurpose = ...) -> pb.ContainerToken: ...


class Agents:
    def __init__(self, config: RMConfig, core: Callable[[], RMCore], sign: Signer,
                 am_token: Callable[[str, int, float], str],
                 mutation: Callable[[], AbstractAsyncContextManager[object]]) -> None:
        """`core`: the shell's core now (a failed write replaces it). `am_token`: RMShell.fresh_am_token.
        `mutation`: RMShell.mutation, to record a failed AM launch in the store like any core call."""
        self.config = config
        self._core = core
        self._sign = sign
        self._am_token = am_token
        self._mutation = mutation
        self.streams: dict[str, BeatStream] = {}     # node id -> its open heartbeat stream
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, node_id: str) -> grpc.aio.Channel:
        """The channel to a node's agent, one per agent address, kept open."""
        node = self._core().cluster.nodes[node_id]
        address = f"{node.host}:{node.port}"
        channel = self._channels.get(address)
        if channel is None:
            channel = tls.aio_channel(address, self.config.tls)
            self._channels[address] = channel
        return channel

    def push_stops(self, stops: Mapping[str, list[StopOrder]]) -> None:
        """Send stop orders down the nodes' heartbeat streams now, between beats (those without a stream get
        theirs on their next beat's reply)."""
        for node_id, orders in stops.items():
            stream = self.streams.get(node_id)
            if stream is not None and orders:
                stream.push(pb.HeartbeatResponse(stop=[
                    pb.StopOrder(container_id=o.container_id, grace_ms=round(o.grace_s * 1000), reason=o.reason)
                    for o in orders]))

    async def launch_am(self, effect: LaunchAM) -> None:
        core = self._core()
        c = core.containers.get(effect.container_id)
        node = core.cluster.nodes.get(effect.node_id)
        if c is None or node is None or not c.phase.live:
            return
        settings = core.settings
        env = {
            # The agent replaces this with its own agent.yaml rm (the whole active/standby list, as its node reaches
            # the RMs); this RM's own address is what an AM of an older agent dials.
            "GPURM_RM": self.config.advertised,
            "GPURM_JOB_ID": effect.job_id,
            "GPURM_AM_ATTEMPT": str(effect.am_attempt),
            "GPURM_AM_RETRY_FOR": f"{self.config.am_rm_retry_for_s:g}",
            "GPURM_AM_TOKEN": self._am_token(effect.job_id, effect.am_attempt,
                                             max(settings.token_ttl_s, settings.am_register_timeout_s + 60)),
        }
        request = pb.StartContainerRequest(token=self._sign(c, settings.am_register_timeout_s + 60),
                                           launch=pb.LaunchContext(argv=[], env=env))
        stub = pbg.ContainerManagerStub(self.channel(effect.node_id))
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
                async with self._mutation():
                    self._core().am_launch_failed(c.container_id, failure, time.time(),
                                                  agent_unreachable=unreachable, job_fault=job_fault)
            except RequestError as exc:   # the store refuses writes: the AM's start timeout catches it later
                log.warning("AM %s launch failure not recorded: %s", c.container_id, exc.message)

    async def read_log(self, request: pb.GetLogsRequest, job: Job, containers: Mapping[str, Container],
                       tail: int = 0) -> pb.GetLogsResponse:
        """The log a request names, of `job` (from memory or the store), read from the agent that ran it. `tail`
        > 0: the last `tail` bytes instead of from `request.offset`."""
        container_id, node_id = log_container(containers, job, request.am, request.attempt, request.rank)
        node = self._core().cluster.nodes.get(node_id)
        if node is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"node {node_id} is unknown to this RM; logs unreachable")
        stub = pbg.ContainerManagerStub(self.channel(node_id))
        try:
            c = containers[container_id]
            token = self._sign(c, READ_LOG_TOKEN_S, pb.TOKEN_READ_LOG)
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

    def close_streams(self) -> None:
        """End every open heartbeat stream (the RM stops: the agents register again with the next RM)."""
        for stream in list(self.streams.values()):
            stream.close()

    async def close_channels(self) -> None:
        for ch in self._channels.values():
            await ch.close()
