"""The REST API's OpenAPI document is valid OpenAPI 3 and lists exactly the routes api.py registers; the JSON
shape (jsonview.py) is the documented one."""

from __future__ import annotations

import re

from aiohttp import web
from openapi_spec_validator import validate

from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.http import api, pages
from gpurm.rm.http.jsonview import to_json
from gpurm.rm.http.openapi import document


def served_routes() -> set[tuple[str, str]]:
    app = web.Application()
    api.register(app)
    pages.register(app)
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter") or ""
        if path.startswith(api.PREFIX) and route.method != "HEAD":
            out.add((route.method.lower(), path.removeprefix(api.PREFIX)))
    return out


def test_the_document_is_valid_openapi_3() -> None:
    validate(document())


def test_the_document_lists_exactly_the_served_routes() -> None:
    doc = document()
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == served_routes()
    for path, ops in doc["paths"].items():
        names = set(re.findall(r"{(\w+)}", path))
        for op in ops.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == names, (path, declared)


def test_json_shape_enums_numbers_and_presence() -> None:
    job = to_json(pb.Job(job_id="job-1", state=pb.JOB_SUCCEEDED, submit_ms=2**40, attempts=[
        pb.Attempt(attempt=1, failure=pb.FAILURE_PREEMPTED, learners=[pb.Learner(state=pb.CONTAINER_RUNNING)])]))
    assert job["state"] == "SUCCEEDED" and job["submit_ms"] == 2**40
    assert job["attempts"][0]["failure"] == "PREEMPTED" and job["attempts"][0]["learners"][0]["state"] == "RUNNING"
    assert job["exit_code"] == 0 and job["diagnostics"] == ""          # defaults are present
    assert job["spec"]["max_retries"] is None                         # an unset optional is null
    node = to_json(pb.NodeInfo(state=pb.NODE_DRAINING, gpus=[pb.GpuInfo(links=[pb.GpuLink(level=pb.LINK_NVLINK)])]))
    assert node["state"] == "DRAINING" and node["gpus"][0]["links"][0]["level"] == "NVLINK"
    assert to_json(pb.Job())["state"] == "UNSPECIFIED"
    assert to_json(pb.GetLogsResponse(data=b"ok \xff"))["data"] == "ok \ufffd"


async def test_extra_routes_mount_behind_the_same_middleware() -> None:
    """An extension route: a hook given the app and the shell; its answers get the same headers and errors."""
    from aiohttp.test_utils import TestClient, TestServer

    from gpurm.rm.config import HTTPConfig
    from gpurm.rm.http.server import build_app

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="gpurm_up 1\n")

    def hook(app: web.Application, shell: object) -> None:
        app.router.add_get("/healthz", healthz)

    app = build_app(object(), HTTPConfig(), mtls=False, extra=[hook])  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:
        got = await client.get("/healthz")
        assert got.status == 200 and await got.text() == "gpurm_up 1\n"
        assert "script-src 'self'" in got.headers["Content-Security-Policy"]
        missing = await client.get("/api/v1/nope")
        assert missing.status == 404 and (await missing.json())["error"]["code"] == "NOT_FOUND"
        form = await client.post("/api/v1/jobs", data="gpus=1")
        assert form.status == 415
