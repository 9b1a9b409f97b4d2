"""The ContainerManager gRPC service: AMs (and the RM) start, stop and inspect containers on this node.

Every call carries a container token the RM signed with this node's key (TOKEN_CONTAINER to start, stop, query
or reserve a port for a container; TOKEN_READ_LOG to read its output); the key is the node secret (without mTLS)
or arrives in the RM's registration reply (mTLS), so until then every call is refused as UNAVAILABLE.
Every failure leaves as a status code with a one-line message, never as a bare internal error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from gpurm.common.jobspec import JobSpec, container_problems, mounts_from_proto
from gpurm.common.tokens import TokenError, TokenKey, verify_container
from gpurm.nodeagent.containers import (
    ContainerExistsError,
    ContainerSupervisor,
    GpuBusyError,
    UnknownContainerError,
    now_ms,
)
from gpurm.nodeagent.fence import Fence
from gpurm.nodeagent.gpus import GpuDevice
from gpurm.nodeagent.imagerun import ImageSpec
from gpurm.nodeagent.ports import PortReserver
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]
T = TypeVar("T")

DEFAULT_LOG_BYTES = 64 * 1024
MAX_LOG_BYTES = 1024 * 1024
MAX_STATUS_TOKENS = 4096


class RpcFailure(Exception):
    """Ends an RPC with `code` and a one-line message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


class ContainerManagerServicer(pb_grpc.ContainerManagerServicer):
    def __init__(self, supervisor: ContainerSupervisor, gpus: Sequence[GpuDevice], *, stop_grace_s: float,
                 ports: PortReserver, token_key: TokenKey | None = None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self.supervisor = supervisor
        self.node_id = supervisor.node_id
        self.gpus = {g.index: g for g in gpus}
        self.stop_grace_s = stop_grace_s
        self.ports = ports
        self.token_key = token_key  # set by the tracker from each registration reply
        self.closing = False        # the agent is shutting down: no new containers
        self.fence: Fence | None = None   # no new containers while the RM's lease has run out (fence.py)
        self.am_env: dict[str, str] = {}  # added to AM containers' env (GPURM_TLS_*: the node's certificate)
        self._clock_ms = clock_ms

    def add_to_server(self, server: grpc.aio.Server) -> None:
        # Through a typed name: the generated module has no annotations.
        add: Callable[[ContainerManagerServicer, grpc.aio.Server], None] = (
            pb_grpc.add_ContainerManagerServicer_to_server)
        add(self, server)

    # ------------------------------------------------------------------ RPCs

    async def StartContainer(self, request: pb.StartContainerRequest,
                             context: Ctx) -> pb.StartContainerResponse:
        return await _guard(context, "StartContainer", lambda: self._start(request))

    async def StopContainer(self, request: pb.StopContainerRequest, context: Ctx) -> pb.StopContainerResponse:
        return await _guard(context, "StopContainer", lambda: self._stop(request))

    async def GetContainerStatus(self, request: pb.ContainerStatusRequest,
                                 context: Ctx) -> pb.ContainerStatusResponse:
        return await _guard(context, "GetContainerStatus", lambda: self._status(request))

    async def ReadLog(self, request: pb.ReadLogRequest, context: Ctx) -> pb.ReadLogResponse:
        return await _guard(context, "ReadLog", lambda: self._read_log(request))

    async def ReservePort(self, request: pb.ReservePortRequest, context: Ctx) -> pb.ReservePortResponse:
        return await _guard(context, "ReservePort", lambda: self._reserve_port(request))

    # ------------------------------------------------------------------ handlers

    def _key(self) -> TokenKey:
        if self.token_key is None:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "agent has not registered with the RM yet")
        return self.token_key

    def _grant(self, token: pb.ContainerToken, purpose: int = pb.TOKEN_CONTAINER,
               container_id: str | None = None) -> pb.ContainerTokenPayload:
        """The payload of a valid token for this node and purpose (and container, when named)."""
        try:
            grant = verify_container(token, self._key(), node_id=self.node_id, now_ms=self._clock_ms(),
                                     purpose=purpose)
        except TokenError as exc:
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED, f"container token rejected: {exc}") from exc
        if container_id is not None and grant.container_id != container_id:
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED,
                             f"the token is for container {grant.container_id}, not {container_id[:128]}")
        return grant

    async def _start(self, request: pb.StartContainerRequest) -> pb.StartContainerResponse:
        if self.closing:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, f"the agent on {self.node_id} is shutting down")
        if self.fence is not None and not self.fence.holds():
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE,
                             f"the agent on {self.node_id} has had no answer from the RM for its lease "
                             f"({self.fence.lease.lease_s:g}s): it starts nothing until the RM answers again")
        grant = self._grant(request.token)
        cid = grant.container_id
        if not cid:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "the token names no container")
        if grant.kind not in (pb.CONTAINER_AM, pb.CONTAINER_LEARNER):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"container {cid}: the token names no kind")
        indices = list(grant.gpu_indices)
        missing = sorted({g for g in indices if g not in self.gpus})
        if missing:
            have = f"0-{len(self.gpus) - 1}" if self.gpus else "none"
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"container {cid}: GPU indices {missing} do not exist on node {self.node_id} "
                             f"(it has {have})")
        if len(set(indices)) != len(indices):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"container {cid}: GPU indices repeat: {indices}")
        if grant.kind == pb.CONTAINER_LEARNER and not request.launch.argv:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"container {cid}: launch.argv is empty")
        known = self.supervisor.record(cid)
        if known is None:
            for g in indices:
                gpu = self.gpus[g]
                if not gpu.healthy:
                    raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"GPU {g} is unhealthy: {gpu.health_reason or 'unknown reason'}")
        try:
            image = _image_of(request.launch, grant.kind)
            rec = await self.supervisor.start(
                cid, grant.job_id, grant.kind, list(request.launch.argv),
                {**request.launch.env, **(self.am_env if grant.kind == pb.CONTAINER_AM else {})},
                request.launch.workdir, indices, grant.attempt, grant.user,
                cpus=grant.cpus, memory_mib=grant.memory_mib, rightsize=grant.rightsize,
                share_milli=grant.gpu_share_milli if len(indices) == 1 else 0,
                gpu_memory_mib=self.gpus[indices[0]].memory_mib if indices else 0, image=image)
        except GpuBusyError as exc:
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        except ContainerExistsError as exc:
            raise RpcFailure(grpc.StatusCode.ALREADY_EXISTS, str(exc)) from exc
        except UnknownContainerError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return pb.StartContainerResponse(status=rec.to_proto())

    async def _stop(self, request: pb.StopContainerRequest) -> pb.StopContainerResponse:
        cid = request.container_id
        if not cid:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "container_id is empty")
        # Tokens expire in minutes; the RM renews a live container's token through its AM's allocate calls.
        self._grant(request.token, container_id=cid)
        if self.supervisor.record(cid) is None:
            ended = self.supervisor.status(cid)
            if ended is None:
                raise RpcFailure(grpc.StatusCode.NOT_FOUND, f"unknown container {cid} on node {self.node_id}")
            return pb.StopContainerResponse(status=ended)
        grace = request.grace_ms / 1000 if request.grace_ms > 0 else self.stop_grace_s
        rec = await self.supervisor.stop(cid, grace, request.reason or "stop requested by the AM")
        return pb.StopContainerResponse(status=rec.to_proto())

    async def _status(self, request: pb.ContainerStatusRequest) -> pb.ContainerStatusResponse:
        """Statuses of the containers whose tokens came with the request (and only those)."""
        if len(request.tokens) > MAX_STATUS_TOKENS:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"tokens: at most {MAX_STATUS_TOKENS}")
        allowed = [self._grant(t).container_id for t in request.tokens]
        if not allowed:
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED,
                             "tokens: send a container token for each container asked about")
        out = []
        for cid in allowed:
            status = self.supervisor.status(cid)
            if status is None:
                # Every id asked about gets an answer: one this agent never ran (or lost) is LOST.
                status = pb.ContainerStatus(container_id=cid, state=pb.CONTAINER_LOST, node_id=self.node_id,
                                            diagnostics=f"unknown to the agent on {self.node_id}")
            out.append(status)
        return pb.ContainerStatusResponse(statuses=out)

    async def _read_log(self, request: pb.ReadLogRequest) -> pb.ReadLogResponse:
        self._grant(request.token, pb.TOKEN_READ_LOG, request.container_id)
        max_bytes = request.max_bytes if request.max_bytes > 0 else DEFAULT_LOG_BYTES
        try:
            chunk = self.supervisor.read_log(request.container_id, request.offset,
                                             min(max_bytes, MAX_LOG_BYTES))
        except UnknownContainerError as exc:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, str(exc)) from exc
        return pb.ReadLogResponse(data=chunk.data, next_offset=chunk.next_offset, size=chunk.size,
                                  container_done=chunk.done)

    async def _reserve_port(self, request: pb.ReservePortRequest) -> pb.ReservePortResponse:
        grant = self._grant(request.token)
        if request.job_id and grant.job_id != request.job_id:
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED,
                             f"the token is for job {grant.job_id}, not {request.job_id[:128]}")
        try:
            port = self.ports.reserve()
        except OSError as exc:
            raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        log.debug("reserved port %d for job %s", port, request.job_id)
        return pb.ReservePortResponse(port=port)


async def _guard(context: Ctx, name: str, handler: Callable[[], Awaitable[T]]) -> T:
    try:
        return await handler()
    except RpcFailure as exc:
        await context.abort(exc.code, exc.message)
    except Exception as exc:
        log.exception("%s failed", name)
        await context.abort(grpc.StatusCode.INTERNAL, f"{name} failed: {type(exc).__name__}: {exc}")


def _image_of(launch: pb.LaunchContext, kind: pb.ContainerKind) -> ImageSpec | None:
    """A learner's image, mounts and /dev/shm (None: a host process; an AM is always one), checked as a job
    spec's are: INVALID_ARGUMENT naming the field."""
    if kind != pb.CONTAINER_LEARNER or not launch.image:
        return None
    spec = ImageSpec(launch.image, mounts_from_proto(launch.mounts), launch.shm_size_mib)
    problems = container_problems(JobSpec(gpus=1, command=["-"], image=spec.image, mounts=list(spec.mounts),
                                          shm_size_mib=spec.shm_size_mib))
    if problems:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems)[:1000])
    return spec
