"""The OpenAPI 3 document of the REST API, served at /api/v1/openapi.json. Written by hand; a test checks that it
is a valid OpenAPI 3.0 document and that its paths and methods are exactly the routes api.py registers."""

from __future__ import annotations

from typing import Any

from gpurm.rm.config import MAX_HTTP_BODY

VERSION = "1"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(schema: str, description: str = "OK", status: str = "200") -> dict[str, Any]:
    return {status: {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {400: "bad input; the message names the field", 403: "the caller may not do this",
            404: "no such job or node", 409: "not in a state that allows it",
            413: "request body too large", 415: "not JSON (requests that change things must send JSON)",
            503: "the RM's store refuses writes"}
    return {str(s): {"description": text[s], "content": {"application/json": {"schema": _ref("Error")}}}
            for s in statuses}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


JOB_STATES = ["QUEUED", "ALLOCATING", "RUNNING", "SUCCEEDED", "FAILED", "KILLED"]
OBJECT = {"type": "object", "additionalProperties": True}


def document() -> dict[str, Any]:
    job_id = _path("job_id")
    kill = {"tags": ["jobs"], "parameters": [job_id],
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"reason": {"type": "string", "maxLength": 500}}}}}},
            "responses": {**_ok("KillResult"), **_errors(400, 403, 404, 415, 503)}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "gpurm RM REST API", "version": VERSION,
                 "description": "The RM's REST API (docs/http.md). Identity is the client certificate with mTLS; "
                                "in insecure mode the X-Gpurm-User header (a claim). JSON shape: proto field "
                                "names, every field present, enum values without their type's prefix "
                                "(SUCCEEDED), 64-bit integers as numbers, times in Unix milliseconds."},
        "servers": [{"url": "/api/v1"}],
        "paths": {
            "/cluster": {"get": {"tags": ["cluster"], "summary": "the cluster at a glance",
                                 "responses": _ok("ClusterSummary")}},
            "/jobs": {
                "get": {"tags": ["jobs"], "summary": "jobs, newest first, a page at a time", "parameters": [
                    _query("user", "only this user's jobs", {"type": "string"}),
                    _query("queue", "only this queue's (with or without root.)", {"type": "string"}),
                    _query("state", "only these states (repeat it, or comma-separated)",
                           {"type": "string", "example": "RUNNING,QUEUED"}),
                    _query("limit", "jobs per page", {"type": "integer", "minimum": 1, "maximum": 1000,
                                                      "default": 100}),
                    _query("page_token", "the next_page_token of the page before (opaque)", {"type": "string"}),
                    _query("cursor", "the next_cursor of the page before (older form of page_token)",
                           {"type": "string"}),
                    _query("offset", "jobs to skip, scanning them (instead of page_token; at most 100,000)",
                           {"type": "integer", "minimum": 0, "maximum": 100_000})],
                    "responses": {**_ok("JobList"), **_errors(400)}},
                "post": {"tags": ["jobs"], "summary": "submit a job (the job file's fields, docs/jobs.md)",
                         "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                         "description": "a retried submit with the same key returns the same job",
                                         "schema": {"type": "string", "maxLength": 128}}],
                         "requestBody": {"required": True,
                                         "content": {"application/json": {"schema": _ref("JobSpecInput")}}},
                         "responses": {**_ok("Submitted", "submitted", "201"),
                                       **_errors(400, 403, 413, 415, 503)}}},
            "/jobs/{job_id}": {
                "get": {"tags": ["jobs"], "parameters": [job_id],
                        "responses": {**_ok("Job"), **_errors(404)}},
                "delete": {**kill, "summary": "kill the job"}},
            "/jobs/{job_id}/kill": {"post": {**kill, "summary": "kill the job (as DELETE)"}},
            "/jobs/{job_id}/logs": {"get": {
                "tags": ["jobs"], "summary": "a range of a learner's or the AM's log", "parameters": [
                    job_id,
                    _query("rank", "the learner's rank", {"type": "integer", "minimum": 0, "default": 0}),
                    _query("attempt", "job attempt (0 = the latest)", {"type": "integer", "minimum": 0}),
                    _query("am", "the AM's log instead", {"type": "boolean"}),
                    _query("offset", "from this byte", {"type": "integer", "minimum": 0}),
                    _query("max_bytes", "at most this many bytes", {"type": "integer", "minimum": 1}),
                    _query("tail", "the last N bytes instead of from offset", {"type": "integer", "minimum": 0})],
                "responses": {**_ok("Log"), **_errors(400, 403, 404, 409, 503)}}},
            "/jobs/{job_id}/utilisation": {"get": {
                "tags": ["jobs"], "summary": "GPU utilisation over time of the latest attempt's GPUs",
                "parameters": [job_id], "responses": {**_ok("Utilisation"), **_errors(404)}}},
            "/nodes": {"get": {"tags": ["nodes"], "summary": "nodes by node id, a page at a time", "parameters": [
                _query("limit", "nodes per page", {"type": "integer", "minimum": 1, "maximum": 5000, "default": 500}),
                _query("page_token", "the next_page_token of the page before (opaque)", {"type": "string"})],
                "responses": {**_ok("NodeList"), **_errors(400)}}},
            "/nodes/{node_id}": {"get": {"tags": ["nodes"], "parameters": [_path("node_id")],
                                         "responses": {**_ok("NodeDetail"), **_errors(404)}}},
            "/queues": {"get": {"tags": ["queues"], "summary": "the queue tree, parents first, a page at a time",
                                "parameters": [
                _query("limit", "queues per page", {"type": "integer", "minimum": 1, "maximum": 5000,
                                                    "default": 1000}),
                _query("page_token", "the next_page_token of the page before (opaque)", {"type": "string"})],
                "responses": {**_ok("QueueList"), **_errors(400)}}},
            "/openapi.json": {"get": {"tags": ["meta"], "summary": "this document", "responses": _ok("Object")}},
        },
        "components": {"schemas": {
            "Object": OBJECT,
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string", "example": "INVALID_ARGUMENT"},
                               "message": {"type": "string", "example": "gpus: must be at least 1, got 0"}}}}},
            "JobSpecInput": {"type": "object", "required": ["command"],
                             "description": f"as a job file (docs/jobs.md); at most {MAX_HTTP_BODY} bytes by "
                                            "default (http.max_body_bytes)",
                             "properties": {
                                 "name": {"type": "string"}, "queue": {"type": "string"},
                                 "gpus": {"oneOf": [{"type": "integer"}, {"type": "number"}, {"type": "string"},
                                                    {"type": "object"}]},
                                 "gpu_share": {"type": "integer"},
                                 "command": {"oneOf": [{"type": "string"},
                                                       {"type": "array", "items": {"type": "string"}}]},
                                 "workdir": {"type": "string"},
                                 "env": {"type": "object", "additionalProperties": {"type": "string"}},
                                 "max_retries": {"type": "integer"},
                                 "locality": {"oneOf": [{"type": "string"}, {"type": "object"}]},
                                 "placement": {"type": "string", "enum": ["pack", "spread"]}}},
            "Submitted": {"type": "object", "properties": {"job_id": {"type": "string"},
                                                           "queue": {"type": "string"}}},
            "Job": {"type": "object", "additionalProperties": True,
                    "description": "gpurm.Job (proto/gpurm.proto) in the API's JSON shape; also may_see_private "
                                   "and may_kill on GET /jobs/{job_id}",
                    "properties": {"job_id": {"type": "string"}, "state": {"type": "string", "enum": JOB_STATES},
                                   "user": {"type": "string"}, "queue": {"type": "string"},
                                   "submit_ms": {"type": "integer"}, "waiting_reason": {"type": "string"},
                                   "attempts": {"type": "array", "items": OBJECT}, "spec": OBJECT}},
            "JobList": {"type": "object", "properties": {
                "jobs": {"type": "array", "items": _ref("Job")},
                "total": {"type": "integer", "nullable": True,
                          "description": "jobs matching user and queue; null when a state filter (or both user "
                                         "and queue) would need a walk of every job to count"},
                "limit": {"type": "integer"}, "offset": {"type": "integer"},
                "next_page_token": {"type": "string", "nullable": True,
                                    "description": "pass as page_token for the next page; null on the last page "
                                                   "(a filtered page may be short, even empty, before the last)"},
                "next_cursor": {"type": "string", "nullable": True}}},
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
                "limit": {"type": "integer"}, "next_page_token": {"type": "string", "nullable": True}}},
            "NodeDetail": {"allOf": [_ref("Node"), {"type": "object", "properties": {
                "telemetry": OBJECT, "utilisation": {"type": "array", "items": OBJECT}}}]},
            "QueueList": {"type": "object", "properties": {
                "capacity": {"type": "integer"}, "queues": {"type": "array", "items": OBJECT},
                "total": {"type": "integer"}, "next_page_token": {"type": "string", "nullable": True}}},
            "ClusterSummary": {"type": "object", "properties": {
                "rm": OBJECT, "gpus": OBJECT, "nodes": OBJECT, "jobs": OBJECT,
                "racks": {"type": "array", "items": OBJECT}, "time_ms": {"type": "integer"}}},
        }},
    }
