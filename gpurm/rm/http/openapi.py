"""The OpenAPI 3.1 document of the REST API, served at /api/v1/openapi.json. Written by hand, and true: what it
states is what the server enforces, no more and no less (a suite test runs schemathesis `--checks all` against a
dev cluster). A test checks that it is a valid OpenAPI document and that its paths and methods are exactly the routes
api.py registers.

The request schemas here are the server's own checks: request bodies are validated against them (validate.py)
before the job-spec rules run, and the query parameters' patterns and bounds are the ones api.py parses by. What
JSON Schema cannot state (rules between fields, such as gpus.max >= gpus.min) is said in the descriptions. Two
facts come from the running cluster: the leaf queues a job may name and the most GPUs a job may ask for (the
cluster's size): `Facts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpurm.common.jobspec import MAX_COMMAND_ARGS, MAX_ENV_VARS, MAX_GPUS_PER_JOB, MAX_WORKDIR
from gpurm.rm.config import MAX_HTTP_BODY
from gpurm.rm.server import paging

VERSION = "1"
DOC_PATH = "/api/v1/openapi.json"
END = r"(?![\s\S])"           # the end of the text (`$` also matches before a final newline)
NO_NUL = r"^[^\x00]*" + END
NOT_BLANK = r"^[^\x00]*[^\x00\s][^\x00]*" + END
# A job's name: printable text (Python's str.isprintable, which the job-spec rules apply, holds for every one of
# these characters): ASCII, Latin, Greek, Cyrillic, CJK ideographs.
NAME = (r"^[\x20-\x7e\u00a1-\u00ac\u00ae-\u024f\u0391-\u03a1\u03a3-\u03c9\u0400-\u045f"
        r"\u4e00-\u9fff]*" + END)
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*" + END
SHARE = r"^0\.[0-9]{0,2}[1-9]" + END     # gpus: "0.5", a fraction of one shared GPU, at most three decimals
SEVEN_DAYS = 7 * 86400
JOB_STATES = ["QUEUED", "ALLOCATING", "RUNNING", "SUCCEEDED", "FAILED", "KILLED"]
_ONE_STATE = "(?:" + "|".join(JOB_STATES) + ")"
STATE_FILTER = f"^(?:{_ONE_STATE}(?:,{_ONE_STATE})*)?" + END      # `RUNNING,QUEUED`; empty: any
OBJECT = {"type": "object", "additionalProperties": True}


@dataclass(frozen=True)
class Facts:
    """What the running cluster decides about a submission: the names a job's `queue` may take (each leaf's path,
    with and without `root.`; "" when a `default` leaf exists) and the GPUs the cluster has (0: none registered)."""

    queues: tuple[str, ...] = ("", "default", "root.default")
    cluster_gpus: int = 0
    max_body: int = MAX_HTTP_BODY

    @property
    def max_gpus(self) -> int:
        return min(MAX_GPUS_PER_JOB, self.cluster_gpus) if self.cluster_gpus else MAX_GPUS_PER_JOB


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(schema: str, description: str = "OK", status: str = "200") -> dict[str, Any]:
    return {status: {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}}


ERROR_TEXT = {400: "bad input; the message names the field", 403: "the caller may not do this",
              404: "no such job, node or rack",
              409: "not in a state that allows it (a page token's queue left the tree)",
              413: "request body too large", 415: "not JSON (requests that change things must send JSON)",
              503: "the RM's store refuses writes"}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": ERROR_TEXT[s], "content": {"application/json": {"schema": _ref("Error")}}}
            for s in statuses}


def _query(name: str, description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema, **extra}


def _int(lo: int, hi: int, default: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "minimum": lo, "maximum": hi}
    if default is not None:
        out["default"] = default
    return out


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def _token(kind: str, what: str) -> dict[str, Any]:
    return _query("page_token", f"the next_page_token of the page before, unchanged: it names the last {what} of that "
                  "page, and any text of this form is a position in the list (other text is refused)",
                  {"type": "string", "pattern": paging.TOKEN_PATTERNS[kind]})


def _nullable(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"anyOf": [schema, {"type": "null"}]}
    if description:
        out["description"] = description
    return out


def seconds() -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "maximum": SEVEN_DAYS, "description": "seconds"}


def job_spec_input(facts: Facts) -> dict[str, Any]:
    """A job spec as the REST API takes it: the job file's fields (docs/jobs.md) in their JSON forms. Two shapes:
    whole GPUs (packed or spread), or a fraction of one shared GPU (packed: one container on one server)."""
    gpus_note = (f"at most {facts.max_gpus}, the cluster's GPUs now" if facts.cluster_gpus else
                 "no node has registered yet: any size is refused until one does")
    common: dict[str, Any] = {
        "name": {"type": "string", "maxLength": 128, "pattern": NAME},
        "queue": {"type": "string", "enum": list(facts.queues),
                  "description": "a leaf queue (with or without root.); empty or left out: default"},
        "command": {"description": "a shell command (run with /bin/sh -c) or a list of arguments (run as is), "
                                   "none of them blank",
                    "anyOf": [
                        {"type": "string", "pattern": NOT_BLANK},
                        {"type": "array", "minItems": 1, "maxItems": MAX_COMMAND_ARGS,
                         "items": {"type": "string", "pattern": NOT_BLANK}}]},
        "workdir": {"type": "string", "maxLength": MAX_WORKDIR, "pattern": r"^/[^\x00]*" + END},
        "env": {"type": "object", "maxProperties": MAX_ENV_VARS,
                "propertyNames": {"pattern": ENV_NAME, "not": {"anyOf": [
                    {"const": "CUDA_VISIBLE_DEVICES"}, {"pattern": "^GPURM_"}]}},
                "additionalProperties": {"type": "string", "pattern": NO_NUL},
                "description": "names gpurm sets (CUDA_VISIBLE_DEVICES, GPURM_*) are refused"},
        "max_retries": _int(0, 100),
        "locality": {"anyOf": [
            {"type": "string", "enum": ["strict", "prefer", "any"]},
            {"type": "object", "additionalProperties": False, "properties": {
                "timeout": seconds(), "backoff_base": seconds(), "backoff_max": seconds(),
                "start_level": {"type": "string", "enum": ["node", "packed", "rack", "any"]},
                "mode": {"type": "string", "enum": ["strict", "prefer", "any"]}}}]},
    }
    whole = {"type": "object", "additionalProperties": False, "required": ["gpus", "command"],
             "title": "whole GPUs", "properties": {
                 **common,
                 "gpus": {"description": f"a whole number of GPUs ({gpus_note}), or {{min, max}} for an elastic job",
                          "anyOf": [
                              _int(1, facts.max_gpus),
                              {"type": "object", "additionalProperties": False, "required": ["min", "max"],
                               "properties": {"min": _int(1, facts.max_gpus), "max": _int(1, MAX_GPUS_PER_JOB)}}]},
                 "placement": {"type": "string", "enum": ["pack", "spread"]}}}
    shared = {"type": "object", "additionalProperties": False, "required": ["gpus", "command"],
              "title": "a share of one GPU", "properties": {
                  **common,
                  "gpus": {"type": "string", "pattern": SHARE,
                           "description": "a fraction of one shared GPU, at most three decimals: '0.5'"},
                  "placement": {"type": "string", "enum": ["pack"]}}}
    return {
        "oneOf": [whole, shared],
        "description": f"as a job file (docs/jobs.md), in JSON; at most {facts.max_body} bytes "
                       "(http.max_body_bytes). Rules between fields that JSON Schema cannot state: gpus.max is at "
                       "least gpus.min; a command list ['/bin/sh', '-c'] needs the shell command after it; a "
                       "queue's max_gpus and max_gpus_per_user cap gpus there. The AM's back-off between tries is "
                       "min(locality.backoff_base x 2^n, locality.backoff_max)."}


KILL_INPUT = {"type": "object", "additionalProperties": False,
              "properties": {"reason": {"type": "string", "maxLength": 500}}}


def document(facts: Facts | None = None) -> dict[str, Any]:
    facts = facts or Facts()
    job_id = _path("job_id")
    json_only = ("The body must be JSON (Content-Type: application/json), even when empty: a web page of another "
                 "site cannot send that without asking first (cross-site request forgery)")
    kill_post = {"tags": ["jobs"], "parameters": [job_id], "description": json_only,
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("KillInput")}}},
                 "responses": {**_ok("KillResult"), **_errors(400, 403, 404, 415, 503)}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpurm RM REST API", "version": VERSION,
                 "description": "The RM's REST API (docs/http.md). Identity is the client certificate with mTLS; "
                                "in insecure mode the X-Gpurm-User header (a claim). JSON shape: proto field "
                                "names, every field present, enum values without their type's prefix "
                                "(SUCCEEDED), 64-bit integers as numbers, times in Unix milliseconds. A method "
                                "a path does not serve is answered 405 with an Allow header."},
        "servers": [{"url": "/api/v1"}],
        "paths": {
            "/cluster": {"get": {
                "tags": ["cluster"], "summary": "the cluster at a glance",
                "description": "Every server of a cluster of up to 64 is detailed; on a bigger one each rack is "
                               "in sum (detailed false, nodes empty) but the one `rack` names.",
                "parameters": [_query("rack", "detail this rack's servers (empty: none); 404 when it has none",
                                      {"type": "string"})],
                "responses": {**_ok("ClusterSummary"), **_errors(404)}}},
            "/jobs": {
                "get": {"tags": ["jobs"], "summary": "jobs, newest first, a page at a time", "parameters": [
                    _query("user", "only this user's jobs (its first 64 characters)", {"type": "string"}),
                    _query("queue", "only this queue's (with or without root.; its first 256 characters)",
                           {"type": "string"}),
                    _query("state", "only these states (repeat it, or comma-separated; empty: any)",
                           {"type": "array", "items": {"type": "string", "pattern": STATE_FILTER}},
                           style="form", explode=True),
                    _query("limit", "jobs per page", _int(1, 1000, 100)),
                    _token(paging.JOBS_DOWN, "job"),
                    _query("offset", "matching jobs to skip, scanning them: from the newest, or after page_token's "
                                     "position when both are given", _int(0, 100_000, 0))],
                    "responses": {**_ok("JobList"), **_errors(400)}},
                "post": {"tags": ["jobs"], "summary": "submit a job (the job file's fields, docs/jobs.md)",
                         "description": json_only,
                         "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                         "description": "a retried submit with the same key returns the same job",
                                         "schema": {"type": "string", "maxLength": 128}}],
                         "requestBody": {"required": True,
                                         "content": {"application/json": {"schema": _ref("JobSpecInput")}}},
                         "responses": {**_ok("Submitted", "submitted", "201"),
                                       **_errors(400, 403, 413, 415, 503)}}},
            "/jobs/{job_id}": {
                "get": {"tags": ["jobs"], "parameters": [job_id],
                        "responses": {**_ok("Job"), **_errors(404)}}},
            "/jobs/{job_id}/kill": {"post": {**kill_post, "summary": "kill the job (its record stays: a kill "
                                                                "is not a DELETE)"}},
            "/jobs/{job_id}/logs": {"get": {
                "tags": ["jobs"], "summary": "a range of a learner's or the AM's log", "parameters": [
                    job_id,
                    _query("rank", "the learner's rank", _int(0, 1 << 20, 0)),
                    _query("attempt", "job attempt (0 = the latest)", _int(0, 1 << 20, 0)),
                    _query("am", "the AM's log instead", {"type": "boolean", "default": False}),
                    _query("offset", "from this byte", _int(0, 1 << 62, 0)),
                    _query("max_bytes", "at most this many bytes", _int(1, 1 << 20, 65536)),
                    _query("tail", "the last N bytes instead of from offset (0: from offset)", _int(0, 1 << 20, 0))],
                "responses": {**_ok("Log"), **_errors(400, 403, 404, 409, 503)}}},
            "/jobs/{job_id}/utilisation": {"get": {
                "tags": ["jobs"], "summary": "GPU utilisation over time of the latest attempt's GPUs",
                "parameters": [job_id], "responses": {**_ok("Utilisation"), **_errors(404)}}},
            "/nodes": {"get": {"tags": ["nodes"], "summary": "nodes by node id, a page at a time", "parameters": [
                _query("limit", "nodes per page", _int(1, paging.MAX_PAGE, paging.DEFAULT_NODES)),
                _token(paging.NODES, "node")],
                "responses": {**_ok("NodeList"), **_errors(400)}}},
            "/nodes/{node_id}": {"get": {"tags": ["nodes"], "parameters": [_path("node_id")],
                                         "responses": {**_ok("NodeDetail"), **_errors(404)}}},
            "/queues": {"get": {"tags": ["queues"], "summary": "the queue tree, parents first, a page at a time",
                                "parameters": [
                _query("limit", "queues per page", _int(1, paging.MAX_PAGE, paging.DEFAULT_QUEUES)),
                _token(paging.QUEUES, "queue")],
                "responses": {**_ok("QueueList"), **_errors(400, 409)}}},
            "/openapi.json": {"get": {"tags": ["meta"], "summary": "this document", "responses": _ok("Object")}},
        },
        "components": {"schemas": {
            "Object": OBJECT,
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string", "example": "INVALID_ARGUMENT"},
                               "message": {"type": "string", "example": "gpus: must be at least 1, got 0"}}}}},
            "JobSpecInput": job_spec_input(facts),
            "KillInput": KILL_INPUT,
            "Submitted": {"type": "object", "required": ["job_id", "queue"],
                          "properties": {"job_id": {"type": "string"}, "queue": {"type": "string"}}},
            "Job": {"type": "object", "additionalProperties": True,
                    "description": "gpurm.Job (proto/gpurm.proto) in the API's JSON shape; also may_see_private "
                                   "and may_kill on GET /jobs/{job_id}",
                    "properties": {"job_id": {"type": "string"}, "state": {"type": "string", "enum": JOB_STATES},
                                   "user": {"type": "string"}, "queue": {"type": "string"},
                                   "submit_ms": {"type": "integer"}, "waiting_reason": {"type": "string"},
                                   "attempts": {"type": "array", "items": OBJECT}, "spec": OBJECT,
                                   "forecast": _ref("StartForecast")}},
            "StartForecast": {
                "type": "object", "additionalProperties": False,
                "required": ["made_ms", "earliest_ms", "likely_ms", "latest_ms", "horizon_ms"],
                "description": "a waiting job's forecast start (docs/cli.md, \"Start-time forecasts\"), Unix ms: "
                               "made_ms when the replayed state was taken (0: no forecast); a 0 time: not within "
                               "made_ms + horizon_ms",
                "properties": {k: {"type": "integer", "minimum": 0}
                               for k in ("made_ms", "earliest_ms", "likely_ms", "latest_ms", "horizon_ms")}},
            "JobList": {"type": "object", "required": ["jobs", "total", "limit", "offset", "next_page_token"],
                        "properties": {
                "jobs": {"type": "array", "items": _ref("Job")},
                "total": _nullable({"type": "integer"}, "jobs matching user and queue; null when a state filter "
                                                        "(or both user and queue) would need a walk of every job"),
                "limit": {"type": "integer"}, "offset": {"type": "integer"},
                "next_page_token": _nullable({"type": "string"}, "pass as page_token for the next page; null on the "
                                                                 "last page (a filtered page may be short, even "
                                                                 "empty, before the last)")}},
            "KillResult": {"type": "object", "properties": {"job": _ref("Job")}},
            "Log": {"type": "object", "properties": {
                "data": {"type": "string"}, "next_offset": {"type": "integer"}, "size": {"type": "integer"},
                "container_id": {"type": "string"}, "node_id": {"type": "string"},
                "container_done": {"type": "boolean"}}},
            "Utilisation": {"type": "object", "properties": {"series": OBJECT, "note": {"type": "string"}}},
            "Node": {"type": "object", "additionalProperties": True,
                     "description": "gpurm.NodeInfo in the API's JSON shape",
                     "properties": {"node_id": {"type": "string"}, "rack": {"type": "string"},
                                    "state": {"type": "string"}, "gpus_total": {"type": "integer"},
                                    "gpus_free": {"type": "integer"}}},
            "NodeList": {"type": "object", "properties": {
                "nodes": {"type": "array", "items": _ref("Node")}, "total": {"type": "integer"},
                "limit": {"type": "integer"}, "next_page_token": _nullable({"type": "string"})}},
            "NodeDetail": {"allOf": [_ref("Node"), {"type": "object", "properties": {
                "telemetry": OBJECT, "utilisation": {"type": "array", "items": OBJECT}}}]},
            "QueueList": {"type": "object", "properties": {
                "capacity": {"type": "integer"}, "queues": {"type": "array", "items": OBJECT},
                "total": {"type": "integer"}, "next_page_token": _nullable({"type": "string"}),
                "borrowing": {"type": "string", "enum": ["fair", "las", "gittins", "srtf"],
                              "description": "how GPUs beyond a queue's steady share are ordered (queues.yaml)"},
                "borrowing_preemptions": {"type": "integer"}}},
            "ClusterSummary": {"type": "object", "properties": {
                "rm": OBJECT, "gpus": OBJECT, "nodes": OBJECT, "jobs": OBJECT,
                "racks": {"type": "array", "items": _ref("RackSummary")}, "time_ms": {"type": "integer"}}},
            "RackSummary": {"type": "object", "required": ["rack", "detailed", "servers", "gpus", "nodes"],
                            "properties": {
                "rack": {"type": "string"}, "detailed": {"type": "boolean"}, "servers": {"type": "integer"},
                "gpus": {"type": "object", "additionalProperties": {"type": "integer"},
                         "description": "total, free, used, shared, unhealthy, offline"},
                "nodes": {"type": "array", "items": OBJECT,
                          "description": "each server with every GPU's state (when detailed)"}}},
        }},
    }
