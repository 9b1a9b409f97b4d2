"""List pages end to end (rm/server/paging.py): a real RM with more nodes and jobs than one page, listed through gRPC
(ListNodes, ListJobs, ListQueues), the CLI (`gpurm nodes`, `gpurm jobs`, table and JSON) and the REST API.

The nodes are registered over the tracker RPC and never beat: they stay RUNNING long enough for the test (the
heartbeat allows 5 minutes), and the jobs wait for AMs that never start, which is all a listing needs.
"""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gpurm.cli.output import JsonArray
from gpurm.common.callers import USER_KEY
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.server import paging
from tests.conftest import TestBroker
from tests.integration.rmproc import RMProcess

NODES = 510          # more than one default page (500)
JOBS = 23


def _registration(node_id: str) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=node_id, host="127.0.0.1", agent_port=1, rack=f"rack-{int(node_id[-3:]) % 7}", ib_domain="ib-1",
        gpus=[pb.GpuInfo(index=0, uuid=f"GPU-{node_id}", model="fake", memory_mib=16000, healthy=True)],
        cpus=8, memory_mib=64000, agent_version="test", agent_instance=uuid.uuid4().hex, healthy=True)


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    proc = RMProcess(tmp_path_factory.mktemp("paging-rm"), broker)
    try:
        tracker = pbg.ResourceTrackerStub(proc.channel)
        for i in reversed(range(NODES)):            # registered out of order: pages come by id all the same
            assert tracker.RegisterNode(proc.prove(_registration(f"pg-{i:04d}")), timeout=10).session
        for i in range(JOBS):
            user = "bob" if i % 3 == 0 else "carol"
            spec = pb.JobSpec(name=f"p{i}", gpus=1, command=["/bin/true"])
            proc.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                  metadata=((USER_KEY, user),), timeout=10)
        yield proc
    finally:
        code = proc.close()
        assert code == 0, f"the RM exited with {code}:\n{proc.log_text()}"


def node_ids() -> list[str]:
    return [f"pg-{i:04d}" for i in range(NODES)]


def gpurm(rm: RMProcess, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args, "--rm", rm.address],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def rest(rm: RMProcess, path: str) -> tuple[int, Any]:
    status, text = get(rm, path)
    return status, json.loads(text)


def get(rm: RMProcess, path: str) -> tuple[int, str]:
    base = rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10).http_url
    req = urllib.request.Request(base + path, headers={"X-Gpurm-User": "bob"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# ---------------------------------------------------------------- gRPC


def test_list_nodes_without_a_page_size_gets_a_bounded_first_page(rm: RMProcess) -> None:
    reply = rm.client.ListNodes(pb.ListNodesRequest(), timeout=30)
    assert len(reply.nodes) == paging.DEFAULT_NODES and reply.total == NODES and reply.next_page_token
    assert [n.node_id for n in reply.nodes] == node_ids()[:paging.DEFAULT_NODES]
    rest_ = rm.client.ListNodes(pb.ListNodesRequest(page_token=reply.next_page_token), timeout=30)
    assert [n.node_id for n in rest_.nodes] == node_ids()[paging.DEFAULT_NODES:] and not rest_.next_page_token


def test_node_pages_of_any_size_list_every_node_once(rm: RMProcess) -> None:
    for size in (1, 97, 510, 5000):
        pages = 0
        request = pb.ListNodesRequest(page_size=size)
        seen: list[str] = []
        while True:
            reply = rm.client.ListNodes(request, timeout=30)
            assert len(reply.nodes) <= size
            seen += [n.node_id for n in reply.nodes]
            pages += 1
            if not reply.next_page_token or (size == 1 and pages == 40):
                break
            request.page_token = reply.next_page_token
        if size == 1:
            assert seen == node_ids()[:40]
        else:
            assert seen == node_ids() and pages == -(-NODES // size)


def test_job_pages_list_every_job_once_oldest_first_and_filter(rm: RMProcess) -> None:
    everything = paging.fetch_all(lambda r: rm.client.ListJobs(r, timeout=10), pb.ListJobsRequest(page_size=4),
                                  "jobs")
    names = [j.spec.name for j in everything]
    assert names == [f"p{i}" for i in range(JOBS)]
    bobs = paging.fetch_all(lambda r: rm.client.ListJobs(r, timeout=10), pb.ListJobsRequest(page_size=2, user="bob"),
                            "jobs")
    assert [j.spec.name for j in bobs] == [f"p{i}" for i in range(0, JOBS, 3)]
    newest = rm.client.ListJobs(pb.ListJobsRequest(limit=5), timeout=10)
    assert [j.spec.name for j in newest.jobs] == names[-5:] and not newest.next_page_token and newest.total == JOBS
    assert rm.client.ListJobs(pb.ListJobsRequest(user="bob", page_size=1), timeout=10).total == len(bobs)
    assert rm.client.ListJobs(pb.ListJobsRequest(states=[pb.JOB_QUEUED], page_size=1), timeout=10).total == -1
    first = rm.client.ListJobs(pb.ListJobsRequest(limit=5, page_size=2), timeout=10)
    second = rm.client.ListJobs(pb.ListJobsRequest(limit=5, page_size=2, page_token=first.next_page_token), timeout=10)
    assert [j.spec.name for j in [*first.jobs, *second.jobs]] == names[-5:-1]


@pytest.mark.parametrize("method", ["ListNodes", "ListJobs", "ListQueues"])
def test_a_malformed_page_token_is_refused_naming_the_field(rm: RMProcess, method: str) -> None:
    request = getattr(pb, f"{method}Request")(page_token="bogus!")
    with pytest.raises(grpc.RpcError) as e:
        getattr(rm.client, method)(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in (e.value.details() or "")
    foreign = paging.encode_token(paging.NODES, "pg-0001") if method != "ListNodes" else \
        paging.encode_token(paging.JOBS_UP, 3)
    with pytest.raises(grpc.RpcError) as e:
        getattr(rm.client, method)(getattr(pb, f"{method}Request")(page_token=foreign), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_queues_come_whole_or_in_pages(rm: RMProcess) -> None:
    whole = rm.client.ListQueues(pb.ListQueuesRequest(), timeout=10)
    assert whole.total == len(whole.queues) and not whole.next_page_token
    paged = paging.fetch_all(lambda r: rm.client.ListQueues(r, timeout=10), pb.ListQueuesRequest(page_size=1),
                             "queues")
    assert [q.path for q in paged] == [q.path for q in whole.queues]


# ---------------------------------------------------------------- the CLI


def test_gpurm_nodes_prints_every_page_as_one_aligned_table(rm: RMProcess) -> None:
    out = gpurm(rm, "nodes", "--page-size", "100").splitlines()
    rows = [ln for ln in out if ln.startswith("pg-")]
    assert [r.split()[0] for r in rows] == node_ids()
    headers = [ln for ln in out if ln.startswith("NODE")]
    assert len(headers) == 1                                  # same widths on every page: one header
    col = headers[0].index("RACK")
    assert all(r[col - 2:col] == "  " and r[col] != " " for r in rows)
    assert out[-1] == f"{NODES} nodes, {NODES} of {NODES} GPUs free"
    limited = gpurm(rm, "nodes", "--limit", "7", "--page-size", "3").splitlines()
    assert [ln.split()[0] for ln in limited if ln.startswith("pg-")] == node_ids()[:7]
    assert limited[-1].startswith(f"7 nodes (the first 7 of {NODES}: --limit)")


def test_gpurm_nodes_json_is_one_document_across_pages(rm: RMProcess) -> None:
    listed = json.loads(gpurm(rm, "nodes", "-o", "json", "--page-size", "128"))
    assert [n["node_id"] for n in listed] == node_ids()


def test_gpurm_jobs_pages_through_limit_and_json(rm: RMProcess) -> None:
    everything = gpurm(rm, "jobs", "--limit", "0", "--page-size", "5").splitlines()
    assert [ln.split()[1] for ln in everything if ln.startswith("job-")] == [f"p{i}" for i in range(JOBS)]
    newest = gpurm(rm, "jobs", "--limit", "4", "--page-size", "3").splitlines()
    assert [ln.split()[1] for ln in newest if ln.startswith("job-")] == [f"p{i}" for i in range(JOBS - 4, JOBS)]
    assert gpurm(rm, "jobs", "--user", "nobody") == "no jobs match\n"
    assert json.loads(gpurm(rm, "jobs", "--user", "nobody", "-o", "json")) == []
    listed = json.loads(gpurm(rm, "jobs", "-o", "json", "--limit", "0", "--page-size", "2", "--user", "carol"))
    assert [j["spec"]["name"] for j in listed] == [f"p{i}" for i in range(JOBS) if i % 3]


def test_jobs_json_the_rm_writes_is_what_the_command_writes_from_the_messages(rm: RMProcess) -> None:
    """`gpurm jobs -o json` asks the RM for its pages as JSON text (ListJobsRequest.json): the document is the one
    the command writes itself from the Job messages (an RM before that field), byte for byte, across pages, and with
    a limit that cuts a page."""
    def from_messages(limit: int) -> str:
        out = io.StringIO()
        request = pb.ListJobsRequest(limit=limit, page_size=4)
        with JsonArray(out) as array:
            while True:
                reply = rm.client.ListJobs(request, metadata=rm.metadata, timeout=10)
                assert not reply.json_items and not reply.json_count
                array.extend(reply.jobs)
                if not reply.next_page_token:
                    break
                request = pb.ListJobsRequest(page_token=reply.next_page_token, page_size=4)
        return out.getvalue()

    reply = rm.client.ListJobs(pb.ListJobsRequest(page_size=4, json=True), metadata=rm.metadata, timeout=10)
    assert not reply.jobs and reply.json_count == 4 and reply.json_items.count(b"\n") == 3
    expected = from_messages(0)
    assert gpurm(rm, "jobs", "--all", "-o", "json", "--page-size", "4") == expected
    assert len(json.loads(expected)) == JOBS
    assert gpurm(rm, "jobs", "--limit", "6", "-o", "json", "--page-size", "4") == from_messages(6)
    out = io.StringIO()
    with JsonArray(out) as array:
        array.extend_text(reply.json_items, reply.json_count, most=3)     # a page cut short by --limit
    assert [j["job_id"] for j in json.loads(out.getvalue())] == [j["job_id"] for j in json.loads(expected)[:3]]


# ---------------------------------------------------------------- REST


def test_rest_lists_page_with_next_page_token(rm: RMProcess) -> None:
    status, body = rest(rm, "/api/v1/nodes")
    assert status == 200 and len(body["nodes"]) == paging.DEFAULT_NODES and body["total"] == NODES
    seen = [n["node_id"] for n in body["nodes"]]
    status, body = rest(rm, f"/api/v1/nodes?limit=200&page_token={body['next_page_token']}")
    assert status == 200 and body["next_page_token"] is None
    assert seen + [n["node_id"] for n in body["nodes"]] == node_ids()
    names: list[str] = []
    token = ""
    while True:
        status, body = rest(rm, "/api/v1/jobs?limit=6" + (f"&page_token={token}" if token else ""))
        assert status == 200 and body["total"] == JOBS
        names += [j["spec"]["name"] for j in body["jobs"]]
        token = body["next_page_token"]
        if token is None:
            break
    assert names == [f"p{i}" for i in reversed(range(JOBS))]        # newest first
    status, body = rest(rm, "/api/v1/queues?limit=1")
    assert status == 200 and len(body["queues"]) == 1
    status, body = rest(rm, "/api/v1/nodes?page_token=nope")
    assert status == 400 and "page_token" in json.dumps(body)


def test_the_web_ui_jobs_page_links_to_the_next_page(rm: RMProcess) -> None:
    path = "/jobs?limit=10"
    shown: list[str] = []
    for _ in range(5):
        status, text = get(rm, path)
        assert status == 200
        shown += re.findall(r'<a href="/jobs/job-\d+">(job-\d+)</a>', text)
        older = re.search(r'id="older" href="([^"]+)"', text)
        if older is None:
            break
        path = html.unescape(older.group(1))
        assert "page_token=" in path
    assert shown == [f"job-{i}" for i in range(JOBS, 0, -1)]


# ---------------------------------------------------------------- filters on the RM


def test_node_filters_run_on_the_rm(rm: RMProcess) -> None:
    """Rack, name pattern, GPU model, free GPUs and state: the RM answers only matching nodes, page after page."""
    in_rack = [n for n in node_ids() if int(n[-3:]) % 7 == 3]
    got = paging.fetch_all(lambda r: rm.client.ListNodes(r, timeout=30),
                           pb.ListNodesRequest(rack="rack-3", page_size=20), "nodes")
    assert [n.node_id for n in got] == in_rack
    got = paging.fetch_all(lambda r: rm.client.ListNodes(r, timeout=30),
                           pb.ListNodesRequest(name="pg-00[0-1]?", gpu_model="fak*", min_free_gpus=1,
                                               states=[pb.NODE_RUNNING]), "nodes")
    assert [n.node_id for n in got] == node_ids()[:20]
    assert rm.client.ListNodes(pb.ListNodesRequest(min_free_gpus=2), timeout=30).nodes == []
    assert rm.client.ListNodes(pb.ListNodesRequest(states=[pb.NODE_LOST]), timeout=30).nodes == []
    with pytest.raises(grpc.RpcError) as bad:
        rm.client.ListNodes(pb.ListNodesRequest(min_free_gpus=-1), timeout=30)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "min_free_gpus" in (bad.value.details() or "")
    # The CLI: the flags become the request; table and JSON list the same nodes.
    listed = json.loads(gpurm(rm, "nodes", "--rack", "rack-3", "--page-size", "7", "-o", "json"))
    assert [n["node_id"] for n in listed] == in_rack
    table = gpurm(rm, "nodes", "--rack", "rack-3", "--name", "pg-000*")
    assert [ln.split()[0] for ln in table.splitlines()[1:-1]] == [n for n in in_rack if n.startswith("pg-000")]
    assert table.splitlines()[-1].startswith(f"{len([n for n in in_rack if n.startswith('pg-000')])} nodes (of 510")
    assert gpurm(rm, "nodes", "--model", "A100*") == "no nodes match (of 510 the RM knows)\n"


def test_job_name_pattern_and_all_run_on_the_rm(rm: RMProcess) -> None:
    listed = json.loads(gpurm(rm, "jobs", "--all", "--name", "p1?", "-o", "json", "--page-size", "3"))
    assert [j["spec"]["name"] for j in listed] == [f"p{i}" for i in range(10, 20)]
    reply = rm.client.ListJobs(pb.ListJobsRequest(name="p2*"), timeout=30)
    assert [j.spec.name for j in reply.jobs] == ["p2", "p20", "p21", "p22"] and reply.total == -1
    table = gpurm(rm, "jobs", "--all", "--name", "p[3-4]", "--user", "carol")
    assert [ln.split()[1] for ln in table.splitlines() if ln.startswith("job-")] == ["p4"]


def test_a_listing_is_one_json_item_a_line(rm: RMProcess) -> None:
    """`-o json` of a list: one valid array, one item a line (what jq and line tools both read)."""
    text = gpurm(rm, "nodes", "--limit", "3", "-o", "json")
    lines = text.splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == 5
    assert [json.loads(ln.rstrip(","))["node_id"] for ln in lines[1:-1]] == node_ids()[:3]
