"""The RM's REST API (docs/http.md) on a real dev cluster: status codes, filters, pagination, the JSON shape,
authorisation as over gRPC (insecure mode: the claimed X-Gpurm-User), bad input naming the field, and an RM that
keeps serving after garbage. One cluster for the module."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker, free_port
from tests.integration.harness import ROOT, DevCluster

OWNER = "alice"
OTHER = "mallory"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("http"), nodes=2, gpus_per_node=4, racks=2, broker=broker)
    yield c
    assert c.stop() == 0


def call(c: DevCluster, method: str, path: str, body: Any = None, user: str = OWNER,
         headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"X-Gpurm-User": user, **({"Content-Type": "application/json"} if method == "POST" else {}),
            **(headers or {})}
    req = urllib.request.Request(c.http_url + path, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            status, got, text = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        status, got, text = exc.code, dict(exc.headers), exc.read()
    ctype = got.get("Content-Type", "")
    return status, got, json.loads(text) if "json" in ctype else text.decode()


def submit(c: DevCluster, spec: dict[str, Any], user: str = OWNER) -> str:
    status, _, body = call(c, "POST", "/api/v1/jobs", spec, user=user)
    assert status == 201, body
    return str(body["job_id"])


SLEEPER = {"gpus": 1, "command": "sleep 60", "name": "sleeper"}


def test_the_url_is_announced_and_the_cluster_summary_counts_gpus(cluster: DevCluster) -> None:
    assert cluster.http_url.startswith("http://127.0.0.1:")
    info = cluster.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10)
    assert info.http_url == cluster.http_url
    status, headers, body = call(cluster, "GET", "/api/v1/cluster")
    assert status == 200
    assert body["gpus"]["total"] == 8 and body["rm"]["insecure"] is True
    assert body["rm"]["caller"].startswith(f"user {OWNER} (claimed")
    assert "mqtt_password" not in body["rm"]
    assert sorted(r["rack"] for r in body["racks"]) == ["rack-1", "rack-2"]
    assert all(len(n["gpus"]) == 4 for r in body["racks"] for n in r["nodes"])
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    admin_info = cluster.gpurm("admin", "info")
    assert admin_info.code == 0 and cluster.http_url in admin_info.out


def test_each_rack_in_sum_and_a_small_cluster_in_detail(cluster: DevCluster) -> None:
    _, _, body = call(cluster, "GET", "/api/v1/cluster")
    assert [(r["rack"], r["servers"], r["gpus"]["total"], r["detailed"]) for r in body["racks"]] == \
        [("rack-1", 1, 4, True), ("rack-2", 1, 4, True)]
    assert sum(r["gpus"]["free"] + r["gpus"]["used"] for r in body["racks"]) == body["gpus"]["total"] == 8
    status, _, one = call(cluster, "GET", "/api/v1/cluster?rack=rack-2")
    assert status == 200 and [r["rack"] for r in one["racks"] if r["nodes"]] == ["rack-1", "rack-2"]
    status, _, missing = call(cluster, "GET", "/api/v1/cluster?rack=rack-9")
    assert status == 404 and "rack 'rack-9' has no servers" in missing["error"]["message"]


def test_a_foreign_host_name_is_refused_on_loopback(cluster: DevCluster) -> None:
    status, _, body = call(cluster, "GET", "/api/v1/cluster", headers={"Host": "evil.example:80"})
    assert status == 403 and "not this server's" in body["error"]["message"]
    port = urlsplit(cluster.http_url).port
    assert call(cluster, "GET", "/api/v1/cluster", headers={"Host": f"localhost:{port}"})[0] == 200


def test_a_retried_submit_with_the_same_key_is_one_job(cluster: DevCluster) -> None:
    key = {"Idempotency-Key": "retry-me-1"}
    first = call(cluster, "POST", "/api/v1/jobs", {**SLEEPER, "command": "true"}, headers=key)
    again = call(cluster, "POST", "/api/v1/jobs", {**SLEEPER, "command": "true"}, headers=key)
    assert first[0] == again[0] == 201 and first[2]["job_id"] == again[2]["job_id"]


def test_submit_get_and_the_json_shape(cluster: DevCluster) -> None:
    job_id = submit(cluster, {**SLEEPER, "env": {"SECRET": "s3cret"}})
    status, _, job = call(cluster, "GET", f"/api/v1/jobs/{job_id}")
    assert status == 200
    assert job["job_id"] == job_id and job["user"] == OWNER and job["queue"] == "root.default"
    assert job["state"] in ("QUEUED", "ALLOCATING", "RUNNING")      # the CLI's names, not JOB_QUEUED
    assert isinstance(job["submit_ms"], int)                          # 64-bit numbers stay numbers
    assert job["spec"]["env"] == {"SECRET": "s3cret"} and job["may_see_private"] is True
    # The same record over gRPC.
    assert cluster.job(job_id).user == OWNER
    # Someone else sees it, but not its env values (as gRPC GetJob).
    status, _, seen = call(cluster, "GET", f"/api/v1/jobs/{job_id}", user=OTHER)
    assert status == 200 and seen["spec"]["env"] == {"SECRET": "(hidden)"} and seen["may_kill"] is False
    running = cluster.wait_job(job_id, [pb.JOB_RUNNING], timeout=60)
    _, _, job = call(cluster, "GET", f"/api/v1/jobs/{job_id}")
    assert job["state"] == "RUNNING" and job["attempts"][-1]["learners"][0]["node_id"] == \
        running.attempts[-1].learners[0].node_id
    assert job["attempts"][-1]["learners"][0]["state"] == "RUNNING"


def test_list_filters_and_pagination(cluster: DevCluster) -> None:
    mine = [submit(cluster, {**SLEEPER, "command": "true", "name": f"p{i}"}, user="pager") for i in range(5)]
    status, _, page = call(cluster, "GET", "/api/v1/jobs?user=pager&limit=2")
    assert status == 200 and page["total"] == 5
    assert [j["job_id"] for j in page["jobs"]] == mine[::-1][:2]          # newest first
    seen = [j["job_id"] for j in page["jobs"]]
    while page["next_page_token"]:
        _, _, page = call(cluster, "GET", f"/api/v1/jobs?user=pager&limit=2&page_token={page['next_page_token']}")
        seen += [j["job_id"] for j in page["jobs"]]
    assert seen == mine[::-1]
    _, _, by_offset = call(cluster, "GET", "/api/v1/jobs?user=pager&limit=2&offset=4")
    assert [j["job_id"] for j in by_offset["jobs"]] == [mine[0]] and by_offset["next_page_token"] is None
    _, _, first = call(cluster, "GET", "/api/v1/jobs?user=pager&limit=1")       # a token and an offset: skip
    _, _, skipped = call(cluster, "GET", f"/api/v1/jobs?user=pager&limit=1&offset=2&page_token="  # after it
                                         f"{first['next_page_token']}")
    assert [j["job_id"] for j in skipped["jobs"]] == [mine[1]]
    for job_id in mine:
        cluster.wait_job(job_id, timeout=60)
    _, _, done = call(cluster, "GET", "/api/v1/jobs?user=pager&state=SUCCEEDED,FAILED")
    assert {j["job_id"] for j in done["jobs"]} == set(mine) and all(j["state"] == "SUCCEEDED" for j in done["jobs"])
    _, _, none = call(cluster, "GET", "/api/v1/jobs?user=pager&state=RUNNING&queue=default")
    assert none["jobs"] == [] and none["total"] is None      # by state: not counted (that would walk every job)
    _, _, other_queue = call(cluster, "GET", "/api/v1/jobs?queue=nope")
    assert other_queue["total"] == 0


@pytest.mark.parametrize(("path", "field"), [
    ("/api/v1/jobs?limit=0", "limit: must be an integer from 1 to 1000, got 0"),
    ("/api/v1/jobs?limit=x", "limit:"),
    ("/api/v1/jobs?state=DONE", "state: must be job states in capitals"),
    ("/api/v1/jobs?state=running", "state: must be job states in capitals"),
    ("/api/v1/jobs?limit=+5", "limit: must be an integer"),
    ("/api/v1/jobs?page_token=abc", "page_token: not a page token"),
    ("/api/v1/jobs?page_token=", "page_token: is empty"),
    ("/api/v1/jobs/job-1/logs?am=1", "am: must be true or false"),
    ("/api/v1/jobs/job-1/logs?rank=-1", "rank:"),
])
def test_bad_queries_say_which_field(cluster: DevCluster, path: str, field: str) -> None:
    status, _, body = call(cluster, "GET", path)
    assert status == 400, body
    assert body["error"]["code"] == "INVALID_ARGUMENT" and field in body["error"]["message"]


@pytest.mark.parametrize(("spec", "message"), [
    ({"gpus": 0, "command": "x"}, "gpus: must be a whole number of GPUs (at most 8, the cluster's GPUs now)"),
    ({"gpus": 1}, "command: is required"),
    ({"command": "x"}, "gpus: is required"),
    ({"gpus": 1, "command": ""}, "command: must be a shell command"),
    ({"gpus": 1, "command": "x", "colour": "red"}, "body: unknown field 'colour'"),
    ({"gpus": 1, "command": "x", "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "'CUDA_VISIBLE_DEVICES' is not an allowed"),
    ({"gpus": 99, "command": "x"}, "got '99'"),   # more GPUs than the cluster has: the document says its size
    ({"gpus": "0.5", "command": "x", "placement": "spread"}, "placement:"),
    ({"gpus": {"min": 4, "max": 2}, "command": "x"}, "gpus.max: must be between gpus.min (4)"),   # between fields
    (["not", "an", "object"], "body: must be a JSON object"),
])
def test_bad_specs_are_refused_naming_the_field(cluster: DevCluster, spec: Any, message: str) -> None:
    status, _, body = call(cluster, "POST", "/api/v1/jobs", spec)
    assert status == 400, body
    assert message in body["error"]["message"]


def test_the_same_message_as_the_cli(cluster: DevCluster) -> None:
    """A rule between fields is the job-spec rules' own, and says what the CLI says."""
    cli = cluster.gpurm("submit", "--gpus", "4:2", "--", "true")
    assert cli.code != 0
    _, _, body = call(cluster, "POST", "/api/v1/jobs", {"gpus": {"min": 4, "max": 2}, "command": "true"})
    assert body["error"]["message"].removeprefix("spec: ") in cli.err


def test_kill_needs_the_owner_and_works_both_ways(cluster: DevCluster) -> None:
    first, second = submit(cluster, SLEEPER), submit(cluster, SLEEPER)
    status, _, body = call(cluster, "POST", f"/api/v1/jobs/{first}/kill", {}, user=OTHER)
    assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED"
    assert f"{OTHER} may not kill {first}" in body["error"]["message"]
    status, _, body = call(cluster, "DELETE", f"/api/v1/jobs/{first}")      # a kill is not a DELETE
    assert status == 405 and body["error"]["code"] == "METHOD_NOT_ALLOWED" and _allow(cluster, first) == "GET"
    status, _, body = call(cluster, "POST", f"/api/v1/jobs/{first}/kill", {"reason": "done with it"})
    assert status == 200 and body["job"]["state"] == "KILLED"
    status, _, body = call(cluster, "POST", f"/api/v1/jobs/{second}/kill")
    assert status == 200 and body["job"]["state"] == "KILLED"
    assert cluster.job(second).state == pb.JOB_KILLED
    status, _, body = call(cluster, "POST", "/api/v1/jobs/job-999999/kill")
    assert status == 404 and body["error"]["code"] == "NOT_FOUND"


def test_logs_follow_the_grpc_rules(cluster: DevCluster) -> None:
    job_id = submit(cluster, {"gpus": 1, "command": "echo hello from rank $NODE_RANK; sleep 30", "name": "talker"})
    cluster.wait_job(job_id, [pb.JOB_RUNNING], timeout=60)
    status, _, body = call(cluster, "GET", f"/api/v1/jobs/{job_id}/logs", user=OTHER)
    assert status == 403 and f"{OTHER} may not read the logs of {job_id}" in body["error"]["message"]
    text = ""
    for _ in range(50):
        status, _, body = call(cluster, "GET", f"/api/v1/jobs/{job_id}/logs?tail=100")
        assert status == 200, body
        text = body["data"]
        if "hello" in text:
            break
        time.sleep(0.1)
    assert "hello from rank 0" in text and isinstance(body["size"], int)
    call(cluster, "POST", f"/api/v1/jobs/{job_id}/kill", {})


def _allow(cluster: DevCluster, job_id: str) -> str:
    _, headers, _ = call(cluster, "PUT", f"/api/v1/jobs/{job_id}")
    return headers.get("Allow", "")


def test_nodes_queues_and_missing_things(cluster: DevCluster) -> None:
    status, _, body = call(cluster, "GET", "/api/v1/nodes")
    assert status == 200 and [n["node_id"] for n in body["nodes"]] == ["node-1", "node-2"]
    assert body["nodes"][0]["state"] == "RUNNING" and body["nodes"][0]["gpus_total"] == 4
    status, _, node = call(cluster, "GET", "/api/v1/nodes/node-1")
    assert status == 200 and node["rack"] == "rack-1" and "telemetry" in node
    status, _, body = call(cluster, "GET", "/api/v1/nodes/node-9")
    assert status == 404 and "node-9" in body["error"]["message"]
    status, _, body = call(cluster, "GET", "/api/v1/queues")
    assert status == 200 and body["capacity"] == 8
    assert [q["path"] for q in body["queues"]][:2] == ["root", "root.default"]
    status, _, body = call(cluster, "GET", "/api/v1/jobs/job-999999")
    assert status == 404 and body["error"]["code"] == "NOT_FOUND"
    status, _, body = call(cluster, "GET", "/api/v1/no-such-thing")
    assert status == 404 and "openapi.json" in body["error"]["message"]
    status, _, body = call(cluster, "PUT", "/api/v1/jobs", {}, headers={"Content-Type": "application/json"})
    assert status == 405 and "error" in body


def test_the_openapi_document_lists_what_is_served(cluster: DevCluster) -> None:
    status, _, doc = call(cluster, "GET", "/api/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    for path, ops in doc["paths"].items():
        if "{" in path:
            continue
        for method in ops:
            if method == "get":
                assert call(cluster, "GET", "/api/v1" + path)[0] == 200, path


def test_forged_and_oversized_requests_are_refused(cluster: DevCluster) -> None:
    # A form another site could post: not JSON.
    status, _, body = call(cluster, "POST", "/api/v1/jobs", raw=b"gpus=1&command=x",
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415 and "application/json" in body["error"]["message"]
    status, _, body = call(cluster, "POST", "/api/v1/jobs", SLEEPER, headers={"Origin": "http://evil.example"})
    assert status == 403 and "Origin" in body["error"]["message"]
    status, _, body = call(cluster, "POST", "/api/v1/jobs", raw=b"{" + b" " * (2 << 20) + b"}")
    assert status == 413 and body["error"]["code"] == "PAYLOAD_TOO_LARGE"
    status, _, body = call(cluster, "POST", "/api/v1/jobs", raw=b"{not json")
    assert status == 400 and body["error"]["message"].startswith("body: not valid JSON")


def test_the_rm_keeps_serving_after_garbage(cluster: DevCluster) -> None:
    where = urlsplit(cluster.http_url)
    garbage = [b"\x00\xff" * 500 + b"\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
               b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: 10\r\n\r\n{\"gp", b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
               b"GET /jobs/%ff%fe HTTP/1.1\r\nHost: x\r\n\r\n"]
    for blob in garbage:
        with socket.create_connection((where.hostname, where.port), timeout=5) as s:
            s.sendall(blob)
            s.shutdown(socket.SHUT_WR)
            try:
                s.recv(4096)
            except OSError:
                pass
    for path in ("/api/v1/jobs/%00", "/api/v1/jobs?limit=99999999999999999999", "/jobs/%3Cscript%3E",
                 "/api/v1/nodes/" + "x" * 5000):
        assert call(cluster, "GET", path)[0] in (400, 404)
    assert call(cluster, "GET", "/api/v1/cluster")[0] == 200
    assert cluster.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10).nodes == 2
    assert "Traceback" not in (cluster.state_dir / "rm" / "rm.log").read_text()      # no log flood either


def rm_config(cluster: DevCluster, tmp_path: Path, http: dict[str, object]) -> Path:
    """The cluster RM's config for a second RM: its own port and state dir, the given `http:` section."""
    cfg = yaml.safe_load((cluster.state_dir / "rm" / "rm.yaml").read_text())
    cfg.update(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path / "rm2"), http=http)
    path = tmp_path / "rm2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_taken_http_port_stops_the_rm_naming_the_setting(cluster: DevCluster, tmp_path: Path) -> None:
    taken = urlsplit(cluster.http_url).port
    config = rm_config(cluster, tmp_path, {"listen": f"127.0.0.1:{taken}"})
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "rm", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{taken} (http.listen)" in done.stderr


def test_http_can_be_turned_off(cluster: DevCluster, tmp_path: Path) -> None:
    config = rm_config(cluster, tmp_path, {"enabled": False})
    with (tmp_path / "rm2.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gpurm.cli.main", "rm", "--config", str(config)], cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        pidfile = tmp_path / "rm2" / "rm.json"
        deadline = time.monotonic() + 30
        while not pidfile.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(pidfile.read_text())["http_url"] == ""
        assert "http.enabled is false" in (tmp_path / "rm2.log").read_text()
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
