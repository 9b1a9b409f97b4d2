"""The REST API under /api/v1 (docs/http.md). Each route calls the same RM methods as the gRPC handler of the
same name (rm/server/service.py): the same core calls, the same authorisation (who may see env values and logs, who may
kill), the same protobuf views (rm/server/pbviews.py, rm/server/convert.py), turned into JSON by jsonview.py.

The functions that build an answer (`cluster_summary`, `job_page`, ...) are shared with the web UI (pages.py),
so a page never shows what the API would refuse its caller.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpurm.common.fields import ConfigError
from gpurm.common.jobspec import spec_from_mapping
from gpurm.common.model import JobState
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.config import MAX_HTTP_BODY
from gpurm.rm.http import openapi, validate
from gpurm.rm.http.jsonview import to_json
from gpurm.rm.security.identity import Caller
from gpurm.rm.server import convert, paging, pbviews
from gpurm.rm.server.service import check_may_read_logs, user_of
from gpurm.rm.state.cluster import SHARED, NodeState
from gpurm.rm.state.messages import ErrorCode, RequestError

if TYPE_CHECKING:
    from gpurm.rm.server.daemon import RMShell

PREFIX = "/api/v1"
SHELL: web.AppKey[RMShell] = web.AppKey("shell")
MTLS: web.AppKey[bool] = web.AppKey("mtls")
MAX_BODY: web.AppKey[int] = web.AppKey("max_body")     # http.max_body_bytes
CALLER: web.RequestKey[Caller] = web.RequestKey("caller", Caller)     # who asks, set by the server's middleware
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_OFFSET = 100_000        # `offset` scans the jobs it skips: `page_token` is the way to page far
TAIL_BYTES = 8192           # a log tail on the job page
MAX_LOG_BYTES = 1 << 20
STATES = {s.name: s for s in JobState}
_INTEGER = re.compile(r"-?[0-9]{1,19}")
_STATE_FILTER = re.compile(openapi.STATE_FILTER)
MAX_IDEMPOTENCY_KEY = 128


def shell_of(request: web.Request) -> RMShell:
    return request.app[SHELL]


def caller(request: web.Request) -> Caller:
    return request[CALLER]


def bad(field: str, message: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_ARGUMENT, f"{field}: {message}")


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        raise bad(name, f"must be an integer from {lo} to {hi}, got {raw[:40]!r}")
    value = int(raw)
    if not lo <= value <= hi:
        raise bad(name, f"must be an integer from {lo} to {hi}, got {value}")
    return value


def states_param(request: web.Request) -> list[JobState]:
    """`state=RUNNING&state=QUEUED` or `state=RUNNING,QUEUED` (the CLI's names, in capitals); an empty one: any
    state (the web UI's filter form sends that)."""
    out: list[JobState] = []
    for raw in request.query.getall("state", []):
        if not _STATE_FILTER.fullmatch(raw):
            raise bad("state", f"must be job states in capitals, comma-separated, from {', '.join(STATES)}; "
                               f"got {raw[:40]!r}")
        out.extend(STATES[name] for name in raw.split(",") if name)
    return out


def facts(request: web.Request) -> openapi.Facts:
    """What the running cluster decides about a submission (the document's Facts)."""
    shell = shell_of(request)
    tree = shell.core.queues.tree
    names: list[str] = [""] if (d := tree.find("default")) is not None and d.leaf else []
    for leaf in tree.leaves:
        names += [leaf.path, leaf.path.removeprefix("root.")]
    return openapi.Facts(queues=tuple(dict.fromkeys(names)), cluster_gpus=shell.core.cluster.total_gpus,
                         max_body=request.app.get(MAX_BODY, MAX_HTTP_BODY))


# ---------------------------------------------------------------- views shared with the web UI


DETAIL_NODES = 64     # up to this many servers, the cluster summary details every one; above, racks in sum
GPU_STATES = ("free", "used", "shared", "unhealthy", "offline")


def _gpu_cells(node: Any) -> list[dict[str, Any]]:
    cells = []
    for index, gpu in sorted(node.gpus.items()):
        holder = node.allocated.get(index)
        jobs: list[str] = []
        if not gpu.healthy:
            state = "unhealthy"
        elif holder == SHARED:
            state, jobs = "shared", sorted({c.rsplit("-c", 1)[0] for c in node.shared.get(index, {})})
        elif holder is not None:
            state, jobs = "used", [holder.rsplit("-c", 1)[0]]
        elif node.state is not NodeState.RUNNING:
            state = "offline"
        else:
            state = "free"
        cells.append({"index": index, "state": state, "jobs": jobs, "healthy": gpu.healthy,
                      "health_reason": gpu.health_reason})
    return cells


def cluster_summary(shell: RMShell, who: Caller, rack: str = "", nodes: frozenset[str] = frozenset()
                    ) -> dict[str, Any]:
    """The cluster at a glance: the RM, GPUs free / used / shared / unhealthy / offline, nodes and jobs by state,
    and each rack's servers and GPU counts (the web UI's overview). Every server with every GPU's state is
    detailed on a cluster of up to DETAIL_NODES servers; on a bigger one, only the servers of `rack` (the web UI's
    drill-down) and those named in `nodes` (a job's), each rack otherwise in sum (`detailed` false, `nodes`
    empty): a fleet's overview is a few hundred racks, not 80,000 GPUs. NOT_FOUND for an unknown `rack`."""
    info = to_json(shell.cluster_info(who))
    for secret in ("mqtt_username", "mqtt_password"):   # broker logins travel over gRPC only
        info.pop(secret, None)
    core = shell.core
    every = len(core.cluster.nodes) <= DETAIL_NODES
    racks: dict[str, dict[str, Any]] = {}
    gpus = {"total": 0, **dict.fromkeys(GPU_STATES, 0)}
    nodes_by_state: dict[str, int] = {}
    for node in sorted(core.cluster.nodes.values(), key=lambda n: n.node_id):
        detailed = every or node.rack == rack
        entry = racks.setdefault(node.rack, {"rack": node.rack, "detailed": detailed, "servers": 0,
                                             "gpus": {"total": 0, **dict.fromkeys(GPU_STATES, 0)}, "nodes": []})
        cells = _gpu_cells(node)
        entry["servers"] += 1
        for cell in cells:
            for tallies in (gpus, entry["gpus"]):
                tallies["total"] += 1
                tallies[cell["state"]] += 1
        nodes_by_state[node.state.name] = nodes_by_state.get(node.state.name, 0) + 1
        if detailed or node.node_id in nodes:
            entry["nodes"].append({"node_id": node.node_id, "state": node.state.name, "gpus": cells,
                                   "gpus_free": node.free, "health_report": node.health_report})
    if rack and rack not in racks:
        raise RequestError(ErrorCode.NOT_FOUND, f"rack {rack[:128]!r} has no servers in this cluster")
    jobs_by_state = dict.fromkeys(STATES, 0)
    for job in core.jobs.values():
        jobs_by_state[job.state.name] += 1
    return {"rm": info, "gpus": gpus, "nodes": nodes_by_state, "jobs": jobs_by_state,
            "racks": [r for _, r in sorted(racks.items())], "time_ms": convert.ms(time.time())}


def token_param(request: web.Request) -> str:
    """`page_token`: absent is the first page; an empty one is no token this API hands out."""
    token = request.query.get("page_token")
    if token == "":
        raise bad("page_token", "is empty: leave it out for the first page, or pass a reply's next_page_token")
    return token or ""


def job_list(shell: RMShell, who: Caller, states: list[JobState], queue: str, user: str, limit: int,
             offset: int = 0, page_token: str = "") -> dict[str, Any]:
    """Jobs newest first, filtered as gRPC ListJobs filters them, a page at a time: after `page_token` (the
    `next_page_token` of the page before), skipping `offset` matching jobs (scanning them). A page costs what it
    skips and returns (rm/server/paging.py), never a walk of every job."""
    core = shell.core
    before = paging.decode_seq(paging.JOBS_DOWN, page_token) if page_token else None
    index = shell.pages.jobs
    found, last = paging.job_page(index, core.jobs, states, queue, user, size=offset + limit, after=before,
                                  descending=True)
    page = found[offset:]
    total = index.count(queue, user)
    if states and total:
        total = None                      # counting by state would walk every job: not for a page
    token = paging.encode_token(paging.JOBS_DOWN, last) if last is not None else None
    return {"jobs": [to_json(j) for j in pbviews.job_list(core, page, shell.usage, lambda j: shell.may_see(who, j))],
            "total": total, "limit": limit, "offset": offset, "next_page_token": token}


def job_detail(shell: RMShell, who: Caller, job_id: str) -> dict[str, Any]:
    job = shell.find_job(job_id)   # a job that left memory: from the store
    out = to_json(shell.job_pb(job, private=shell.may_see(who, job)))
    out["may_see_private"] = shell.may_see(who, job)
    out["may_kill"] = who.kind.value == "user" and shell.core.may_kill(
        job, who.name, shell.groups_of(who.name), rm_admin=shell.is_admin(who))
    return out


def job_utilisation(shell: RMShell, job_id: str) -> dict[str, Any]:
    """GPU utilisation over time of the job's latest attempt, from its servers' telemetry (none: say so)."""
    job = shell.core.get_job(job_id)
    attempt = job.current_attempt
    series: dict[str, Any] = {}
    if attempt is not None:
        for learner in attempt.learners:
            if learner.node_id:
                points = shell.telemetry.series(learner.node_id, set(learner.gpu_indices))
                if points:
                    series[f"rank {learner.rank} ({learner.node_id})"] = points
    note = "" if series else ("no GPU telemetry for this job's GPUs in the RM yet (agents send it every "
                              "telemetry.interval; the RM keeps the last 15 minutes in memory)")
    return {"series": series, "note": note}


def node_detail(shell: RMShell, node_id: str) -> dict[str, Any]:
    node = shell.core.cluster.nodes.get(node_id)
    if node is None:
        raise RequestError(ErrorCode.NOT_FOUND, f"node {node_id[:128]} is unknown to this RM")
    out = to_json(convert.node_to_pb(node))
    out["telemetry"] = shell.telemetry.latest(node_id)
    out["utilisation"] = shell.telemetry.series(node_id)
    return out


def queue_list(shell: RMShell, limit: int = 0, page_token: str = "") -> dict[str, Any]:
    """The queue table in tree order, `limit` queues (0: all) after `page_token`."""
    after = paging.decode_token(paging.QUEUES, page_token) if page_token else None
    out = to_json(pbviews.queues(shell.core, limit, after, time.time()))
    out["next_page_token"] = out.get("next_page_token") or None
    return out


def node_list(shell: RMShell, limit: int, page_token: str = "") -> dict[str, Any]:
    """Nodes by node id, `limit` after `page_token` (key-set paging: O(page + log n))."""
    after = paging.decode_token(paging.NODES, page_token) if page_token else None
    nodes = shell.core.cluster.nodes
    page, last = shell.pages.nodes.page(nodes, limit, after)
    return {"nodes": [to_json(n) for n in shell.list_views.node_list(page).nodes], "total": len(nodes), "limit": limit,
            "next_page_token": paging.encode_token(paging.NODES, last) if last else None}


def _number(text: str) -> int | float:
    """A JSON number: `69.0` is the integer 69, as JSON Schema (the document) counts it."""
    value = float(text)
    return int(value) if value.is_integer() else value


async def read_json(request: web.Request, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object (size limited by the app's client_max_size)."""
    raw = await request.read()
    if not raw and not required:
        return {}
    try:
        data = json.loads(raw, parse_float=_number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad("body", f"not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise bad("body", f"must be a JSON object, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------- routes


async def get_cluster(request: web.Request) -> web.Response:
    return web.json_response(cluster_summary(shell_of(request), caller(request), request.query.get("rack", "")))


async def list_jobs(request: web.Request) -> web.Response:
    offset = int_param(request, "offset", 0, 0, MAX_OFFSET)
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    return web.json_response(job_list(shell_of(request), caller(request), states_param(request),
                                      request.query.get("queue", "")[:256], request.query.get("user", "")[:64],
                                      limit, offset, token_param(request)))


async def get_job(request: web.Request) -> web.Response:
    return web.json_response(job_detail(shell_of(request), caller(request), request.match_info["job_id"]))


async def submit_job(request: web.Request) -> web.Response:
    """The body is a job spec as in a job file (docs/jobs.md), in JSON; the `Idempotency-Key` header, when given,
    is the submit id (a retry returns the same job), as gRPC's submit_id."""
    shell = shell_of(request)
    user = user_of(caller(request))
    data = await read_json(request)
    validate.check_job_spec(data, facts(request))
    key = request.headers.get("Idempotency-Key", "")
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise bad("Idempotency-Key", f"at most {MAX_IDEMPOTENCY_KEY} characters, got {len(key)}")
    try:
        spec = spec_from_mapping(data, "spec")
    except ConfigError as exc:
        raise ConfigError([p.removeprefix("spec: ") for p in exc.problems]) from None
    async with shell.mutation():
        job = shell.core.submit(spec, user, time.time(), key, shell.groups_of(user))
    return web.json_response({"job_id": job.job_id, "queue": job.queue}, status=201)


async def kill_job(request: web.Request) -> web.Response:
    shell = shell_of(request)
    who = caller(request)
    user = user_of(who)
    data = await read_json(request, required=False)
    validate.check_kill(data)
    reason = str(data.get("reason", ""))
    async with shell.mutation():
        job = shell.core.kill(request.match_info["job_id"], user, reason, time.time(), shell.groups_of(user),
                              rm_admin=shell.is_admin(who))
    return web.json_response({"job": to_json(shell.job_pb(job))})


async def job_logs(request: web.Request) -> web.Response:
    """A range of one log: a learner's (`rank`, `attempt`; 0 = the latest) or the AM's (`am=true`), from
    `offset`, or its last `tail` bytes."""
    shell = shell_of(request)
    job = shell.find_job(request.match_info["job_id"])
    check_may_read_logs(shell, caller(request), job)
    am = request.query.get("am", "false")
    if am not in ("true", "false"):
        raise bad("am", f"must be true or false, got {am[:20]!r}")
    req = pb.GetLogsRequest(job_id=job.job_id, rank=int_param(request, "rank", 0, 0, 1 << 20),
                            attempt=int_param(request, "attempt", 0, 0, 1 << 20),
                            offset=int_param(request, "offset", 0, 0, 1 << 62),
                            max_bytes=int_param(request, "max_bytes", 65536, 1, MAX_LOG_BYTES),
                            am=am == "true")
    tail = int_param(request, "tail", 0, 0, MAX_LOG_BYTES)
    reply = await shell.read_logs(req, tail=tail)
    return web.json_response(to_json(reply))


async def job_utilisation_route(request: web.Request) -> web.Response:
    return web.json_response(job_utilisation(shell_of(request), request.match_info["job_id"]))


async def list_nodes(request: web.Request) -> web.Response:
    limit = int_param(request, "limit", paging.DEFAULT_NODES, 1, paging.MAX_PAGE)
    return web.json_response(node_list(shell_of(request), limit, token_param(request)))


async def get_node(request: web.Request) -> web.Response:
    return web.json_response(node_detail(shell_of(request), request.match_info["node_id"]))


async def list_queues(request: web.Request) -> web.Response:
    limit = int_param(request, "limit", paging.DEFAULT_QUEUES, 1, paging.MAX_PAGE)
    return web.json_response(queue_list(shell_of(request), limit, token_param(request)))


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi.document(facts(request)))


ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/cluster", get_cluster),
    ("GET", "/jobs", list_jobs),
    ("POST", "/jobs", submit_job),
    ("GET", "/jobs/{job_id}", get_job),
    ("POST", "/jobs/{job_id}/kill", kill_job),
    ("GET", "/jobs/{job_id}/logs", job_logs),
    ("GET", "/jobs/{job_id}/utilisation", job_utilisation_route),
    ("GET", "/nodes", list_nodes),
    ("GET", "/nodes/{node_id}", get_node),
    ("GET", "/queues", list_queues),
    ("GET", "/openapi.json", openapi_document),
]


def register(app: web.Application) -> None:
    for method, path, handler in ROUTES:
        app.router.add_route(method, PREFIX + path, handler)
