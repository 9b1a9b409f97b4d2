"""The RM's gRPC services: translate messages to core calls and back. Every handler runs the core call, has the
shell persist what changed, then answers; a bad request gets an error naming the field and changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.queues.fields import ConfigError
from gpurm.rm import convert
from gpurm.rm.core import ErrorCode, HeartbeatAction, RequestError
from gpurm.rm.jobspec import spec_from_proto
from gpurm.rm.tokens import check_am_token

if TYPE_CHECKING:
    from gpurm.rm.daemon import RMShell

log = logging.getLogger(__name__)

USER_KEY = "x-gpurm-user"
AM_TOKEN_KEY = "x-gpurm-am-token"
MAX_LIST = 10000

_CODES = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}

R = TypeVar("R")
Ctx = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Any, Ctx], Awaitable[R]]


def rpc(fn: Handler[R]) -> Handler[R]:
    """Map refusals to gRPC status codes; an unexpected error is logged and answered, never fatal."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Ctx) -> R:
        try:
            return await fn(self, request, context)
        except RequestError as exc:
            await context.abort(_CODES[exc.code], exc.message)
        except ConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(exc.problems))
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in the RM ({type(exc).__name__}: "
                                                          f"{exc}); see the RM log")
        raise AssertionError("unreachable")

    return wrapper


def caller(context: Ctx) -> str:
    """The OS user the CLI runs as (or, with mTLS, the certificate's name: see the shell)."""
    for key, value in context.invocation_metadata() or ():
        if key == USER_KEY and isinstance(value, str) and value:
            return value[:64]
    return "unknown"


def _metadata(context: Ctx, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key and isinstance(v, str):
            return v
    return ""


def _now() -> float:
    return time.time()


class ClientService(pbg.ClientServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    @rpc
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Ctx
                        ) -> pb.SubmitJobResponse:
        spec = spec_from_proto(request.spec)
        user = caller(context)
        with self.shell.mutation():
            job = self.shell.core.submit(spec, user, _now(), request.submit_id[:128], self.shell.groups_of(user))
        log.info("job %s submitted by %s to %s: %d GPUs", job.job_id, job.user, job.queue, spec.gpus)
        return pb.SubmitJobResponse(job_id=job.job_id, queue=job.queue)

    @rpc
    async def GetJob(self, request: pb.GetJobRequest, context: Ctx) -> pb.Job:
        return self.shell.job_pb(self.shell.core.get_job(request.job_id))

    @rpc
    async def ListJobs(self, request: pb.ListJobsRequest, context: Ctx) -> pb.ListJobsResponse:
        states = [convert.JOB_STATE_FROM_PB[s] for s in request.states if s in convert.JOB_STATE_FROM_PB]
        limit = min(request.limit, MAX_LIST) if request.limit > 0 else MAX_LIST
        jobs = self.shell.core.list_jobs(states, request.queue, request.user, limit)
        flagged = self.shell.core.preemptible_jobs()
        return pb.ListJobsResponse(jobs=[self.shell.job_pb(j, full=False, preemptible_jobs=flagged) for j in jobs])

    @rpc
    async def KillJob(self, request: pb.KillJobRequest, context: Ctx) -> pb.KillJobResponse:
        user = caller(context)
        with self.shell.mutation():
            job = self.shell.core.kill(request.job_id, user, request.reason[:500], _now(), self.shell.groups_of(user),
                                       rm_admin=user in self.shell.config.admins)
        log.info("job %s killed by %s", job.job_id, user)
        return pb.KillJobResponse(job=self.shell.job_pb(job))

    @rpc
    async def GetLogs(self, request: pb.GetLogsRequest, context: Ctx) -> pb.GetLogsResponse:
        return await self.shell.read_logs(request)

    @rpc
    async def ListNodes(self, request: pb.ListNodesRequest, context: Ctx
                        ) -> pb.ListNodesResponse:
        nodes = sorted(self.shell.core.cluster.nodes.values(), key=lambda n: n.node_id)
        return pb.ListNodesResponse(nodes=[convert.node_to_pb(n) for n in nodes])

    @rpc
    async def ListQueues(self, request: pb.ListQueuesRequest, context: Ctx
                         ) -> pb.ListQueuesResponse:
        return self.shell.queues_pb()

    @rpc
    async def GetClusterInfo(self, request: pb.ClusterInfoRequest, context: Ctx
                             ) -> pb.ClusterInfo:
        return self.shell.cluster_info()

    @rpc
    async def GetClusterView(self, request: pb.GetClusterViewRequest, context: Ctx
                             ) -> pb.ClusterView:
        return self.shell.view_pb()


class AdminService(pbg.AdminServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    def _require_admin(self, context: Ctx, what: str) -> str:
        user = caller(context)
        if user not in self.shell.config.admins:
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"{what} is for RM admins ({', '.join(self.shell.config.admins)}); "
                               f"{user} is not one (admins: in rm.yaml)")
        return user

    @rpc
    async def RefreshQueues(self, request: pb.RefreshQueuesRequest, context: Ctx
                            ) -> pb.RefreshQueuesResponse:
        self._require_admin(context, "refresh-queues")
        return self.shell.refresh_queues(request.yaml)

    @rpc
    async def DrainNode(self, request: pb.DrainNodeRequest, context: Ctx
                        ) -> pb.DrainNodeResponse:
        user = self._require_admin(context, "drain")
        with self.shell.mutation():
            node = self.shell.core.drain(request.node_id, request.undrain, _now())
        log.info("node %s %s by %s", node.node_id, "undrained" if request.undrain else "drained", user)
        return pb.DrainNodeResponse(node=convert.node_to_pb(node))


class AMService(pbg.ApplicationMasterServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    def _authenticate(self, context: Ctx, job_id: str, am_attempt: int) -> None:
        if not check_am_token(self.shell.key, job_id, am_attempt, _metadata(context, AM_TOKEN_KEY)):
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"not the AM of {job_id} attempt {am_attempt}: missing or wrong AM token")

    @rpc
    async def RegisterApplicationMaster(self, request: pb.RegisterAMRequest, context: Ctx
                                        ) -> pb.RegisterAMResponse:
        self._authenticate(context, request.job_id, request.am_attempt)
        with self.shell.mutation():
            job, held = self.shell.core.register_am(request.job_id, request.am_attempt, _now())
        log.info("AM %d of %s registered from %s", request.am_attempt, job.job_id, request.host)
        return pb.RegisterAMResponse(
            job=self.shell.job_pb(job), held=[self.shell.grant_pb(c.container_id) for c in held if c.phase.live],
            held_status=[convert.container_status_to_pb(c) for c in held], mqtt_url=self.shell.mqtt_url,
            allocate_interval_ms=round(self.shell.core.settings.allocate_interval_s * 1000),
            view=self.shell.view_pb())

    @rpc
    async def Allocate(self, request: pb.AllocateRequest, context: Ctx
                       ) -> pb.AllocateResponse:
        self._authenticate(context, request.job_id, request.am_attempt)
        for ask in request.asks:
            if ask.gpus < 1 or ask.count < 0 or ask.count > 4096:
                raise RequestError(ErrorCode.INVALID_ARGUMENT,
                                   f"asks: gpus must be >= 1 and count 0..4096, got gpus={ask.gpus} "
                                   f"count={ask.count}")
        with self.shell.mutation():
            result = self.shell.core.allocate(
                request.job_id, request.am_attempt, request.response_id,
                [convert.ask_from_pb(a) for a in request.asks], list(request.releases),
                [convert.attempt_update_from_pb(a) for a in request.attempts], _now(),
                schedule=self.shell.schedule_soon())
        resp = pb.AllocateResponse(
            response_id=result.response_id, grants=[self.shell.grant_pb(g.container_id) for g in result.grants],
            completed=[convert.container_status_to_pb(c) for c in result.completed],
            kill_requested=result.kill_requested, cluster_gpus=self.shell.core.cluster.total_gpus)
        if result.preempt_ids:
            resp.preemption.CopyFrom(pb.PreemptionNotice(container_ids=result.preempt_ids,
                                                         deadline_ms=convert.ms(result.preempt_deadline),
                                                         reason=result.preempt_reason))
        return resp

    @rpc
    async def FinishApplicationMaster(self, request: pb.FinishAMRequest, context: Ctx
                                      ) -> pb.FinishAMResponse:
        self._authenticate(context, request.job_id, request.am_attempt)
        final = convert.JOB_STATE_FROM_PB.get(request.final_state)
        if final is None:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "final_state: unknown job state")
        with self.shell.mutation():
            job = self.shell.core.finish_am(request.job_id, request.am_attempt, final,
                                            request.diagnostics[:4000], request.exit_code,
                                            [convert.attempt_update_from_pb(a) for a in request.attempts], _now())
        log.info("job %s finished: %s %s", job.job_id, job.state.name, job.diagnostics)
        return pb.FinishAMResponse(accepted=True)


class TrackerService(pbg.ResourceTrackerServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    @rpc
    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Ctx
                           ) -> pb.RegisterNodeResponse:
        if not request.node_id or len(request.node_id) > 128:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "node_id: required, at most 128 characters")
        if not 0 < request.agent_port < 65536:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"agent_port: {request.agent_port} is not a port")
        indices = [g.index for g in request.gpus]
        if len(set(indices)) != len(indices) or any(i < 0 for i in indices) or len(indices) > 1024:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "gpus: indices must be distinct and non-negative")
        session = self.shell.new_session()
        with self.shell.mutation():
            stops = self.shell.core.register_node(convert.registration_from_pb(request), session, _now())
        return pb.RegisterNodeResponse(
            session=session, heartbeat_interval_ms=round(self.shell.core.settings.heartbeat_interval_s * 1000),
            token_key=self.shell.key.secret, token_key_id=self.shell.key.key_id, mqtt_url=self.shell.mqtt_url,
            stop_containers=[s.container_id for s in stops])

    async def Heartbeat(self, request_iterator: AsyncIterator[pb.NodeHeartbeat],
                        context: Ctx) -> AsyncIterator[pb.HeartbeatResponse]:
        out: asyncio.Queue[pb.HeartbeatResponse | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read_beats(request_iterator, out))
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read_beats(self, beats: AsyncIterator[pb.NodeHeartbeat],
                          out: asyncio.Queue[pb.HeartbeatResponse | None]) -> None:
        node_id = ""
        try:
            async for beat in beats:
                node_id = beat.node_id
                try:
                    with self.shell.mutation():
                        action = self.shell.core.node_heartbeat(
                            beat.node_id, beat.session, [convert.report_from_pb(c) for c in beat.containers],
                            _now(), beat.healthy, beat.health_report[:2000],
                            [(g.index, g.healthy, g.health_reason[:500]) for g in beat.gpu_health])
                        self.shell.record_usage(beat)
                except Exception:
                    log.exception("heartbeat from %s failed", node_id)
                    continue
                if action is HeartbeatAction.REREGISTER:
                    out.put_nowait(pb.HeartbeatResponse(ack_seq=beat.seq, action=pb.HEARTBEAT_REREGISTER))
                    break
                self.shell.streams[node_id] = out
                orders = self.shell.core.take_stops(node_id, _now())
                out.put_nowait(pb.HeartbeatResponse(
                    ack_seq=beat.seq, action=pb.HEARTBEAT_OK,
                    stop=[pb.StopOrder(container_id=o.container_id, grace_ms=round(o.grace_s * 1000),
                                       reason=o.reason) for o in orders]))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            if node_id and self.shell.streams.get(node_id) is out:
                del self.shell.streams[node_id]
            out.put_nowait(None)
