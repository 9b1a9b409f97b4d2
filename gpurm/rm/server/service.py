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
from google.protobuf.message import DecodeError

from gpurm.common import tls
from gpurm.common.callers import AM_TOKEN_KEY
from gpurm.common.fields import ConfigError
from gpurm.common.jobspec import spec_from_proto
from gpurm.common.model import Job
from gpurm.common.retry import ANSWERED
from gpurm.common.tokens import check_am_token
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm import accounting
from gpurm.rm.security.identity import Caller, CallerKind, identify, metadata
from gpurm.rm.server import convert, listfilters, paging, pbviews
from gpurm.rm.server.viewcache import length_delimited
from gpurm.rm.state import resync
from gpurm.rm.state.messages import ErrorCode, HeartbeatAction, RequestError

if TYPE_CHECKING:
    from gpurm.rm.server.daemon import RMShell

log = logging.getLogger(__name__)

MAX_DETAILS = 2000   # bytes of a status message (percent-encoded, at most ~3x that on the wire)

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


def status_details(*problems: str, limit: int = MAX_DETAILS) -> str:
    """Problems joined for a gRPC status, each cut to a fair part of `limit` UTF-8 bytes: gRPC sends the message
    percent-encoded in a trailer of at most 8 KiB, and a longer one arrives as RESOURCE_EXHAUSTED without it."""
    each = max(limit // max(len(problems), 1), 120)
    parts = [_cut(p, each) for p in problems]
    return _cut("; ".join(parts), limit)


def _cut(text: str, limit: int) -> str:
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit - 3].decode(errors="ignore") + "..."


def rpc(fn: Handler[R]) -> Handler[R]:
    """Map refusals to gRPC status codes; an unexpected error is logged and answered, never fatal."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Ctx) -> R:
        began = time.perf_counter()
        code = "OK"
        try:
            return await fn(self, request, context)
        except RequestError as exc:
            code = _CODES[exc.code].name
            await context.abort(_CODES[exc.code], status_details(exc.message), trailing_metadata=ANSWERED)
        except ConfigError as exc:
            code = grpc.StatusCode.INVALID_ARGUMENT.name
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_details(*exc.problems),
                                trailing_metadata=ANSWERED)
        except grpc.aio.AbortError:
            status = context.code()             # the handler aborted with its own status
            code = status.name if isinstance(status, grpc.StatusCode) else "UNKNOWN"
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED.name
            raise
        except Exception as exc:
            code = grpc.StatusCode.INTERNAL.name
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, status_details(
                f"internal error in the RM ({type(exc).__name__}: {exc}); see the RM log"))
        finally:
            shell = getattr(self, "shell", None)
            if shell is not None and fn.__name__ != "Heartbeat":     # a stream lives as long as its node
                shell.metrics.observe_rpc(fn.__name__, code, time.perf_counter() - began)
        raise AssertionError("unreachable")

    return wrapper


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Parses requests itself, so bytes that are not a valid message get INVALID_ARGUMENT naming the method
    (gRPC alone answers UNKNOWN and logs a traceback per such request)."""

    def __init__(self) -> None:
        # method -> (gRPC's handler, the guarded one): made once per method, not per call
        self._guarded: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        known = self._guarded.get(details.method)
        if known is not None and known[0] is handler:
            return known[1]
        guarded = self._guard(handler, details.method)
        self._guarded[details.method] = (handler, guarded)
        return guarded

    @staticmethod
    def _guard(handler: Any, method: str) -> Any:
        parse = handler.request_deserializer

        async def refuse(context: Ctx, exc: Exception) -> None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                status_details(f"request: not a valid {method} request message ({exc})"))

        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def parsed_unary(raw: bytes, context: Ctx) -> Any:
                try:
                    request = parse(raw)
                except DecodeError as exc:
                    await refuse(context, exc)
                return await unary(request, context)

            return handler._replace(request_deserializer=None, unary_unary=parsed_unary,
                                    response_serializer=_pass_bytes(handler.response_serializer))
        if handler.stream_stream is not None:
            # The one stream (Heartbeat) reads raw messages itself (context.read) and parses them, refusing bad
            # bytes the same way: no wrapper generators between gRPC and the handler on the busiest path.
            return handler._replace(request_deserializer=None)
        return handler


def _pass_bytes(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A response serializer that sends a reply already encoded (bytes) as it is: the shared, once-encoded
    cluster view goes out without being parsed and encoded again per request (rm/server/viewcache.py)."""
    if serialize is None:
        return None
    encode = serialize

    def serialized(reply: Any) -> bytes:
        return reply if isinstance(reply, bytes) else encode(reply)

    return serialized


def caller(context: Ctx) -> str:
    """The user making this call (see rm/security/identity.py): a node's or an AM's certificate acts as no user."""
    return user_of(identify(context))


def user_of(who: Caller) -> str:
    """The user a caller acts as (gRPC and HTTP alike); RequestError for a node's or an AM's certificate."""
    if who.kind is not CallerKind.USER:
        raise RequestError(ErrorCode.PERMISSION_DENIED,
                           f"the certificate {who.name} is {'a node' if who.kind is CallerKind.NODE else 'an AM'}'s;"
                           " it cannot act as a user")
    return who.name


def _now() -> float:
    return time.time()


def check_may_read_logs(shell: RMShell, who: Caller, job: Job) -> None:
    """RequestError(PERMISSION_DENIED) unless `who` may read the job's logs (gRPC GetLogs and HTTP alike)."""
    if not shell.may_see(who, job):
        raise RequestError(ErrorCode.PERMISSION_DENIED,
                           f"{who.name} may not read the logs of {job.job_id}: only its owner ({job.user}), the "
                           f"admins of queue {job.queue.removeprefix('root.')} and RM admins may")


class ClientService(pbg.ClientServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    @rpc
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Ctx
                        ) -> pb.SubmitJobResponse:
        spec = spec_from_proto(request.spec)
        user = caller(context)
        async with self.shell.mutation():
            job = self.shell.core.submit(spec, user, _now(), request.submit_id[:128], self.shell.groups_of(user))
        log.info("job %s submitted by %s to %s: %d GPUs", job.job_id, job.user, job.queue, spec.gpus)
        return pb.SubmitJobResponse(job_id=job.job_id, queue=job.queue)

    @rpc
    async def GetJob(self, request: pb.GetJobRequest, context: Ctx) -> pb.Job:
        job = self.shell.find_job(request.job_id)
        return self.shell.job_pb(job, private=self.shell.may_see(identify(context), job))

    @rpc
    async def ListJobs(self, request: pb.ListJobsRequest, context: Ctx) -> pb.ListJobsResponse:
        states = [convert.JOB_STATE_FROM_PB[s] for s in request.states if s in convert.JOB_STATE_FROM_PB]
        after = paging.decode_seq(paging.JOBS_UP, request.page_token) if request.page_token else None
        newest = max(request.limit, 0)
        size = paging.page_size(request.page_size, min(newest, paging.MAX_PAGE) or paging.DEFAULT_JOBS)
        core = self.shell.core
        name = listfilters.glob("name", request.name)
        jobs, last = paging.job_page(self.shell.pages.jobs, core.jobs, states, request.queue, request.user,
                                     size=size, after=after, newest=newest, name=name)
        who = identify(context)
        total = None if name is not None else self.shell.pages.jobs.count(request.queue, request.user)
        views, forecasts = self.shell.list_views, self.shell.forecasts_view()
        if request.json:          # the page as `-o json` prints it: the client only writes it out
            reply = pb.ListJobsResponse(json_items=views.job_json(core, jobs, self.shell.usage,
                                                                   lambda j: self.shell.may_see(who, j), forecasts),
                                        json_count=len(jobs))
        else:
            reply = views.job_list(core, jobs, self.shell.usage, lambda j: self.shell.may_see(who, j), forecasts)
        reply.next_page_token = paging.encode_token(paging.JOBS_UP, last) if last is not None else ""
        reply.total = -1 if total is None or (states and total) else total
        return reply

    @rpc
    async def KillJob(self, request: pb.KillJobRequest, context: Ctx) -> pb.KillJobResponse:
        user = caller(context)
        async with self.shell.mutation():
            job = self.shell.core.kill(request.job_id, user, request.reason[:500], _now(), self.shell.groups_of(user),
                                       rm_admin=self.shell.is_admin(identify(context)))
        log.info("job %s killed by %s", job.job_id, user)
        return pb.KillJobResponse(job=self.shell.job_pb(job))

    @rpc
    async def ScaleJob(self, request: pb.ScaleJobRequest, context: Ctx) -> pb.ScaleJobResponse:
        user = caller(context)
        async with self.shell.mutation():
            job = self.shell.core.scale(request.job_id, request.gpus, user, _now(), self.shell.groups_of(user),
                                        rm_admin=self.shell.is_admin(identify(context)))
        log.info("job %s scaled to %d GPUs by %s", job.job_id, job.target_gpus, user)
        return pb.ScaleJobResponse(job=self.shell.job_pb(job))

    @rpc
    async def GetLogs(self, request: pb.GetLogsRequest, context: Ctx) -> pb.GetLogsResponse:
        check_may_read_logs(self.shell, identify(context), self.shell.find_job(request.job_id))
        return await self.shell.read_logs(request)

    @rpc
    async def ListNodes(self, request: pb.ListNodesRequest, context: Ctx
                        ) -> pb.ListNodesResponse:
        after = paging.decode_token(paging.NODES, request.page_token) if request.page_token else None
        size = paging.page_size(request.page_size, paging.DEFAULT_NODES)
        nodes = self.shell.core.cluster.nodes
        match = listfilters.node_filter(request)
        page, last = self.shell.pages.nodes.page(nodes, size, after, match if match.any else None)
        reply = self.shell.list_views.node_list(page, request.brief)
        reply.total = len(nodes)
        reply.next_page_token = paging.encode_token(paging.NODES, last) if last else ""
        return reply

    @rpc
    async def ListQueues(self, request: pb.ListQueuesRequest, context: Ctx
                         ) -> pb.ListQueuesResponse:
        after = paging.decode_token(paging.QUEUES, request.page_token) if request.page_token else None
        size = paging.page_size(request.page_size, paging.DEFAULT_QUEUES)
        return pbviews.queues(self.shell.core, size, after, _now())

    @rpc
    async def GetClusterInfo(self, request: pb.ClusterInfoRequest, context: Ctx
                             ) -> pb.ClusterInfo:
        return self.shell.cluster_info(identify(context))

    @rpc
    async def GetClusterView(self, request: pb.GetClusterViewRequest, context: Ctx
                             ) -> bytes:
        return self.shell.view_bytes()      # an encoded pb.ClusterView (DecodeGuard sends bytes as they are)

    @rpc
    async def GetAccounting(self, request: pb.AccountingRequest, context: Ctx
                            ) -> pb.AccountingResponse:
        # Who may see what: as ListJobs, every caller sees every job's user, queue, state and times; accounting
        # shows only sums of those (no spec, env or logs), so it asks for nothing more.
        identify(context)
        query = accounting.Query(
            by=tuple(request.by), since=request.since_ms / 1000 if request.since_ms else None,
            until=request.until_ms / 1000 if request.until_ms else None,
            users=frozenset(request.users), queues=frozenset(q.removeprefix("root.") for q in request.queues))
        problems = query.problems()
        if problems:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "; ".join(problems))
        core = self.shell.core
        # Jobs that left memory (rm/state/retention.py) count by their compact rows, read off the event loop.
        retired = await asyncio.to_thread(self.shell.store.finished_usages, query.since, query.until)
        rows = accounting.aggregate(accounting.with_retired(core.jobs, core.containers.values(), retired), query)
        if not query.by and not rows[0].jobs:
            rows = []
        return pb.AccountingResponse(rows=[_acct_row(r) for r in rows], total=_acct_row(accounting.total(rows)),
                                     since_ms=request.since_ms, until_ms=request.until_ms)


def _acct_row(r: accounting.Row) -> pb.AccountingRow:
    return pb.AccountingRow(key=r.key, jobs=r.jobs, succeeded=r.succeeded, failed=r.failed, killed=r.killed,
                            preempted=r.preempted, preemptions=r.preemptions, gpu_seconds=r.gpu_s, waited=r.waited,
                            wait_total_s=r.wait_total_s, wait_max_s=r.wait_max_s)


class AdminService(pbg.AdminServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    def _require_admin(self, context: Ctx, what: str) -> str:
        who = identify(context)
        if who.kind is CallerKind.USER and who.name in self.shell.config.admins and not self.shell.is_admin(who):
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"{what}: without mTLS admin requests are taken only from the RM's own host "
                               f"(loopback); run it there, or set up mTLS (docs/security.md)")
        if not self.shell.is_admin(who):
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"{what} is for RM admins ({', '.join(self.shell.config.admins)}); "
                               f"{who.name} is not one (admins: in rm.yaml)")
        return who.name

    @rpc
    async def RefreshQueues(self, request: pb.RefreshQueuesRequest, context: Ctx
                            ) -> pb.RefreshQueuesResponse:
        self._require_admin(context, "refresh-queues")
        return await self.shell.refresh_queues(request.yaml)

    @rpc
    async def DrainNode(self, request: pb.DrainNodeRequest, context: Ctx
                        ) -> pb.DrainNodeResponse:
        user = self._require_admin(context, "drain")
        async with self.shell.mutation():
            node = self.shell.core.drain(request.node_id, request.undrain, _now())
        log.info("node %s %s by %s", node.node_id, "undrained" if request.undrain else "drained", user)
        return pb.DrainNodeResponse(node=convert.node_to_pb(node))


class AMService(pbg.ApplicationMasterServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    def _authenticate(self, context: Ctx, job_id: str, am_attempt: int) -> str:
        """Check the AM token (and with mTLS an AM's certificate); returns the token presented."""
        who = identify(context)
        if who.verified and who.kind is not CallerKind.AM:
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"AMs present an AM certificate (CN am:<name>, agent.yaml am_tls), not {who.name}")
        presented = metadata(context, AM_TOKEN_KEY)
        why = check_am_token(self.shell.creds.keys.am_key, job_id, am_attempt, presented, convert.ms(_now()))
        if why:
            raise RequestError(ErrorCode.PERMISSION_DENIED,
                               f"not the AM of {job_id[:128]} attempt {am_attempt}: {why}")
        return presented

    @rpc
    async def RegisterApplicationMaster(self, request: pb.RegisterAMRequest, context: Ctx
                                        ) -> bytes:
        self._authenticate(context, request.job_id, request.am_attempt)
        async with self.shell.mutation():
            job, held = self.shell.core.register_am(request.job_id, request.am_attempt, _now())
        log.info("AM %d of %s registered from %s", request.am_attempt, job.job_id, request.host[:253])
        reply = pb.RegisterAMResponse(
            am_token=self.shell.fresh_am_token(job.job_id, request.am_attempt),
            job=self.shell.job_pb(job), held=[self.shell.grant_pb(c.container_id) for c in held if c.phase.live],
            held_status=[convert.container_status_to_pb(c) for c in held], mqtt_url=self.shell.mqtt_url,
            allocate_interval_ms=round(self.shell.core.settings.allocate_interval_s * 1000),
            mqtt_username=self.shell.broker_auth.reader.username,
            mqtt_password=self.shell.broker_auth.reader.password)
        # The view is the shared, once-encoded one, appended as field 6 (`view`) of the encoded reply.
        return reply.SerializeToString() + length_delimited(6, self.shell.view_bytes())

    @rpc
    async def Allocate(self, request: pb.AllocateRequest, context: Ctx
                       ) -> pb.AllocateResponse:
        presented = self._authenticate(context, request.job_id, request.am_attempt)
        problems = allocate_problems(request)
        if problems:
            raise ConfigError(problems)
        soon = self.shell.schedule_soon()
        async with self.shell.mutation():
            result = self.shell.core.allocate(
                request.job_id, request.am_attempt, request.response_id,
                [convert.ask_from_pb(a) for a in request.asks], list(request.releases),
                [convert.attempt_update_from_pb(a) for a in request.attempts], _now(), schedule=soon)
        if soon:
            self.shell.pass_written()
        elif not result.grants and self.shell.core.waits_for_pass(request.job_id) \
                and await self.shell.next_pass(2 * self.shell.config.scheduler_interval_s):
            # New asks, and the pass was deferred (passes are coalesced under load): answer with what the next
            # pass granted, once written, instead of leaving it for the AM's next poll.
            self.shell.core.late_grants(request.job_id, request.am_attempt, result.response_id)
        resp = pb.AllocateResponse(
            response_id=result.response_id, grants=[self.shell.grant_pb(g.container_id) for g in result.grants],
            completed=[convert.container_status_to_pb(c) for c in result.completed],
            kill_requested=result.kill_requested, cluster_gpus=self.shell.core.cluster.total_gpus,
            target_gpus=result.target_gpus, steady_interval_ms=self.shell.steady_interval_ms(),
            plan_now=result.plan_now, expected_run_ms=convert.ms(result.expected_run_s))
        resp.renewed.extend(self.shell.renew_grants(request.job_id, {g.container_id for g in result.grants}))
        renewed_token = self.shell.renew_am_token(request.job_id, request.am_attempt, presented)
        if renewed_token:
            resp.am_token = renewed_token
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
        async with self.shell.mutation():
            job = self.shell.core.finish_am(request.job_id, request.am_attempt, final,
                                            request.diagnostics[:4000], request.exit_code,
                                            [convert.attempt_update_from_pb(a) for a in request.attempts], _now())
        log.info("job %s finished: %s %s", job.job_id, job.state.name, job.diagnostics)
        return pb.FinishAMResponse(accepted=True)


MAX_ASKS = 4096
MAX_REPORTS = 16
MAX_LEARNERS = 4096


def allocate_problems(msg: pb.AllocateRequest) -> list[str]:
    """What is wrong with an AM's allocate call, each naming its field (lists are bounded: see docs/security.md)."""
    out = []
    if len(msg.asks) > MAX_ASKS:
        out.append(f"asks: at most {MAX_ASKS}, got {len(msg.asks)}")
    for ask in msg.asks[:MAX_ASKS]:
        if ask.gpus < 1 or ask.count < 0 or ask.count > MAX_ASKS:
            out.append(f"asks: gpus must be >= 1 and count 0..{MAX_ASKS}, got gpus={ask.gpus} count={ask.count}")
            break
    if len(msg.releases) > MAX_ASKS:
        out.append(f"releases: at most {MAX_ASKS}, got {len(msg.releases)}")
    if len(msg.attempts) > MAX_REPORTS:
        out.append(f"attempts: at most {MAX_REPORTS} reports per call, got {len(msg.attempts)}")
    if any(len(a.learners) > MAX_LEARNERS for a in msg.attempts):
        out.append(f"attempts.learners: at most {MAX_LEARNERS} per attempt")
    return out


MAX_NODE_GPUS = 1024
MAX_NAME = 253   # a host name (DNS allows no longer); racks, IB domains and versions too


def registration_problems(msg: pb.RegisterNodeRequest) -> list[str]:
    """What is wrong with an agent's registration, each naming its field; empty when the RM may take it."""
    out = []
    if not msg.node_id or len(msg.node_id) > 128:
        out.append("node_id: required, at most 128 characters")
    if not 0 < msg.agent_port < 65536:
        out.append(f"agent_port: {msg.agent_port} is not a port")
    for label in ("host", "rack", "ib_domain", "agent_version", "agent_instance"):
        if len(getattr(msg, label)) > MAX_NAME:
            out.append(f"{label}: at most {MAX_NAME} characters, got {len(getattr(msg, label))}")
    if msg.cpus < 0:
        out.append(f"cpus: must not be negative, got {msg.cpus}")
    if msg.memory_mib < 0:
        out.append(f"memory_mib: must not be negative, got {msg.memory_mib}")
    indices = [g.index for g in msg.gpus]
    if len(set(indices)) != len(indices) or any(i < 0 for i in indices) or len(indices) > MAX_NODE_GPUS:
        out.append(f"gpus: indices must be distinct and non-negative, at most {MAX_NODE_GPUS} GPUs")
    for g in msg.gpus[:MAX_NODE_GPUS]:
        if g.memory_mib < 0:
            out.append(f"gpus[{g.index}].memory_mib: must not be negative, got {g.memory_mib}")
        if max(len(g.uuid), len(g.model), len(g.pci_bus_id), len(g.cpu_affinity)) > MAX_NAME:
            out.append(f"gpus[{g.index}]: uuid, model, pci_bus_id and cpu_affinity are at most {MAX_NAME} "
                       "characters")
        if len(g.links) > MAX_NODE_GPUS:
            out.append(f"gpus[{g.index}].links: at most {MAX_NODE_GPUS}")
    return out


def _check_node_identity(who: Caller, node_id: str) -> None:
    """With mTLS only the node's own certificate (CN node:<node_id>) may register it."""
    if who.verified and (who.kind is not CallerKind.NODE or who.name != node_id):
        raise RequestError(ErrorCode.PERMISSION_DENIED,
                           f"node_id: a node registers with its own certificate (CN {tls.NODE_PREFIX}{node_id[:128]})"
                           f", not {who.name}")


class TrackerService(pbg.ResourceTrackerServicer):
    def __init__(self, shell: RMShell) -> None:
        self.shell = shell

    @rpc
    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Ctx
                           ) -> pb.RegisterNodeResponse:
        problems = registration_problems(request)
        if problems:
            raise ConfigError(problems)
        who = identify(context)
        _check_node_identity(who, request.node_id)
        if not who.verified:
            why = self.shell.check_join(request)
            if why:
                log.warning("registration as node %s refused: %s", request.node_id[:128], why)
                raise RequestError(ErrorCode.PERMISSION_DENIED, f"node {request.node_id[:128]}: {why}")
        session = self.shell.new_session()
        async with self.shell.mutation():
            stops = self.shell.core.register_node(convert.registration_from_pb(request), session, _now())
        terms = self.shell.core.beats.terms     # the interval in force for the fleet's size, and its lease
        reply = pb.RegisterNodeResponse(
            session=session, heartbeat_interval_ms=terms.interval_ms,
            mqtt_url=self.shell.mqtt_url, stop_containers=[s.container_id for s in stops], epoch=self.shell.epoch,
            resync_spread_ms=round(resync.spread_s(len(self.shell.core.cluster.nodes)) * 1000),
            lease_ms=terms.lease_ms, fence_grace_ms=terms.grace_ms,
            mqtt_username=self.shell.broker_auth.reader.username, mqtt_password=self.shell.broker_auth.reader.password)
        if who.verified:
            # Only over mTLS, to the node's own certificate: the key that signs this node's tokens. Without mTLS
            # the agent already holds it (its node secret), and nothing secret crosses the plaintext wire.
            key = self.shell.creds.node_key(request.node_id)
            reply.token_key, reply.token_key_id = key.secret, key.key_id
        return reply

    async def Heartbeat(self, request_iterator: AsyncIterator[bytes], context: Ctx) -> None:
        """One agent's heartbeat stream: each beat is answered (ack, stop orders) on it; stop orders decided
        elsewhere are pushed down it between beats (BeatStream). Reads raw messages (see DecodeGuard)."""
        name = tls.peer_name(context)
        cert_node = tls.node_of(name) if name else None
        stream = BeatStream(context, asyncio.current_task())
        node_id = ""
        try:
            while True:
                raw = await context.read()
                if raw is grpc.aio.EOF:
                    break
                try:
                    beat = pb.NodeHeartbeat.FromString(raw)
                except DecodeError as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_details(
                        f"request: not a valid /gpurm.ResourceTracker/Heartbeat request message ({exc})"))
                if self.shell.config.tls is not None and beat.node_id != cert_node:
                    log.warning("heartbeat stream for node %s refused: the client certificate is for %s",
                                beat.node_id[:128], f"node {cert_node}" if cert_node else "no node")
                    break
                node_id = beat.node_id
                reply = await self._beat(beat, stream)
                if reply is None:
                    continue
                await stream.send(reply)
                if reply.action == pb.HEARTBEAT_REREGISTER:
                    break
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass                       # the agent went, or the RM stops (BeatStream.close)
        finally:
            if node_id and self.shell.streams.get(node_id) is stream:
                del self.shell.streams[node_id]

    async def _beat(self, beat: pb.NodeHeartbeat, stream: BeatStream) -> pb.HeartbeatResponse | None:
        """Take one beat; the reply (None: not taken, the store refuses writes or it failed: no ack)."""
        shell = self.shell
        node_id = beat.node_id
        if beat.images_added or beat.images_removed:   # a hint kept in memory: taken even when the store refuses
            shell.core.nodes.images_changed(node_id, beat.session, convert.image_names(beat.images_added),
                                            convert.image_names(beat.images_removed), convert.MAX_NODE_IMAGES)
        try:
            shell.persist.check_writable()
            core = shell.core
            try:
                action = core.node_heartbeat(
                    node_id, beat.session, [convert.report_from_pb(c) for c in beat.containers], _now(),
                    beat.healthy, beat.health_report[:2000],
                    [(g.index, g.healthy, g.health_reason[:500]) for g in beat.gpu_health])
                if beat.usage:
                    shell.record_usage(beat)
            finally:
                await shell.flush()      # the beat's changes are written before it is acknowledged
        except RequestError as exc:   # the store refuses writes: this beat changes nothing
            log.debug("heartbeat from %s not taken: %s", node_id, exc.message)
            return None
        except Exception:
            log.exception("heartbeat from %s failed", node_id)
            return None
        if beat.telemetry and action is not HeartbeatAction.REREGISTER:
            refused = shell.publish_telemetry(node_id, beat.telemetry)
            if refused:
                log.warning("node %s: %s; not republished", node_id[:128], refused)
        if action is HeartbeatAction.REREGISTER:
            return pb.HeartbeatResponse(ack_seq=beat.seq, action=pb.HEARTBEAT_REREGISTER)
        shell.streams[node_id] = stream
        orders = shell.core.take_stops(node_id, _now()) if shell.core.stop_orders.pending else []
        terms = shell.core.beats.terms          # every reply names the terms in force: the agent follows them
        return pb.HeartbeatResponse(ack_seq=beat.seq, action=pb.HEARTBEAT_OK, stop=[
            pb.StopOrder(container_id=o.container_id, grace_ms=round(o.grace_s * 1000), reason=o.reason)
            for o in orders], heartbeat_interval_ms=terms.interval_ms, lease_ms=terms.lease_ms,
            fence_grace_ms=terms.grace_ms)


class BeatStream:
    """One agent's heartbeat stream, for writing: beat replies and pushed stop orders go out one at a time, in
    order."""

    def __init__(self, context: Ctx, handler: asyncio.Task[Any] | None = None) -> None:
        self.context = context
        self.handler = handler         # the task serving the stream (close() ends it)
        self._lock = asyncio.Lock()
        self._pushes: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        """End the stream now (the RM is stopping): the agent registers again with the next RM."""
        if self.handler is not None:
            self.handler.cancel()

    async def send(self, reply: pb.HeartbeatResponse) -> None:
        async with self._lock:
            await self.context.write(reply)

    def push(self, reply: pb.HeartbeatResponse) -> None:
        """Send between beats (stop orders decided elsewhere); on a broken stream it is dropped: the agent
        registers again, and the RM orders the stop again from its records."""
        task = asyncio.ensure_future(self._push(reply))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push(self, reply: pb.HeartbeatResponse) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, RuntimeError, asyncio.CancelledError):
            await self.send(reply)
