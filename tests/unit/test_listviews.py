"""List pages' serialized pieces (rm/server/listviews.py) and the RM-side list filters (rm/server/listfilters.py):
a reply assembled from cached bytes is the message built afresh, a cached piece follows its record's changes,
and the filters match what they say. Pure: a core, no sockets."""

from __future__ import annotations

import pytest

from gpurm.common.jobspec import JobSpec
from gpurm.common.jsonshape import to_json_text
from gpurm.common.model import Job, JobState
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.server import convert, listfilters, paging, pbviews
from gpurm.rm.server.listviews import ListViews
from gpurm.rm.state.cluster import NodeState
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import RequestError
from tests.unit.test_rm_core import cluster, reg


def test_a_node_list_from_cached_bytes_is_the_fresh_one_and_follows_health() -> None:
    core = cluster(3)
    views = ListViews()
    nodes = [core.cluster.nodes[n] for n in ("n1", "n2", "n3")]
    nodes[1].gpus[3].links = [(2, pb.LINK_NVLINK, 18)]
    assert views.node_list(nodes) == pb.ListNodesResponse(nodes=[convert.node_to_pb(n) for n in nodes])
    node = nodes[1]
    gpu = node.gpus[3]
    gpu.healthy, gpu.health_reason = False, "XID 79"
    node.state = NodeState.UNHEALTHY
    again = views.node_list(nodes)
    assert again.nodes[1] == convert.node_to_pb(node) and not again.nodes[1].gpus[3].healthy
    assert again.nodes[1].gpus[3].health_reason == "XID 79" and again.nodes[1].state == pb.NODE_UNHEALTHY
    brief = views.node_list(nodes, brief=True)
    assert brief.nodes[1].gpus[3].health_reason == "XID 79" and not any(g.links for n in brief.nodes for g in n.gpus)
    assert again.nodes[1].gpus[3].links[0].nvlinks == 18
    assert brief.nodes[1].gpus[3].model == again.nodes[1].gpus[3].model
    core.register_node(reg("n2", gpus=4), "s9", now=1.0)           # registered again, with other GPUs
    fresh = core.cluster.nodes["n2"]
    assert views.node_list([fresh]).nodes[0] == convert.node_to_pb(fresh) and len(fresh.gpus) == 4


def finished(core: RMCore, seq: int, env: dict[str, str] | None = None) -> Job:
    """A job that ran and ended (its containers gone), as the store gives it back."""
    job = Job(job_id=f"job-{seq}", spec=JobSpec(gpus=1, command=["true"], env=env or {}), user="alice",
              queue="root.default", submit_time=1.0, seq=seq, state=JobState.SUCCEEDED, finish_time=2.0)
    core.jobs[job.job_id] = job
    return job


def test_a_finished_job_is_kept_and_a_live_one_is_built_each_time() -> None:
    core = cluster(1)
    done = finished(core, 100, {"K": "v"})
    live = core.submit(JobSpec(gpus=1, command=["true"]), "alice", now=2.0)
    killed = core.submit(JobSpec(gpus=1, command=["true"]), "alice", now=2.0)
    core.kill(killed.job_id, "alice", "", now=3.0)        # its AM's container has not ended yet: may change
    assert core.live_count(killed.job_id)
    views = ListViews()
    assert list(views.job_list(core, [killed], {}, lambda j: True).jobs) == \
        pbviews.job_list(core, [killed], {}, lambda j: True) and not views.jobs
    mine = views.job_list(core, [done, live], {}, lambda j: True)
    assert list(mine.jobs) == pbviews.job_list(core, [done, live], {}, lambda j: True)
    assert set(views.jobs) == {(done.job_id, True)}                 # the live one is not kept
    other = views.job_list(core, [done], {}, lambda j: False)        # env values hidden from others
    assert other.jobs[0].spec.env["K"] == pbviews.HIDDEN and mine.jobs[0].spec.env["K"] == "v"
    assert views.job_list(core, [done], {}, lambda j: True).jobs[0] == mine.jobs[0]


def test_the_kept_jobs_are_bounded() -> None:
    core = cluster(1)
    views = ListViews(max_jobs=2)
    jobs = [finished(core, i) for i in range(4)]
    views.job_list(core, jobs, {}, lambda j: True)
    assert [k[0] for k in views.jobs] == [jobs[2].job_id, jobs[3].job_id]


def test_node_filters_match_what_they_say() -> None:
    core = cluster(0)
    for i in range(6):
        core.register_node(reg(f"gpu-{i}", rack=f"r{i % 2}", gpus=8), f"s{i}", now=0.0)
    nodes = core.cluster.nodes
    nodes["gpu-4"].state = NodeState.LOST
    for g in nodes["gpu-4"].gpus.values():
        g.model = "A100"

    def ids(**kw: object) -> list[str]:
        match = listfilters.node_filter(pb.ListNodesRequest(**kw))   # type: ignore[arg-type]
        return [n for n, node in nodes.items() if match(node)]

    assert ids(rack="r1") == ["gpu-1", "gpu-3", "gpu-5"]
    assert ids(states=[pb.NODE_LOST]) == ["gpu-4"] and ids(gpu_model="A1*") == ["gpu-4"]
    assert ids(min_free_gpus=8) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-5"]     # a LOST node offers none
    assert ids(name="gpu-[0-2]", rack="r0") == ["gpu-0", "gpu-2"] and ids(name="gpu-1") == ["gpu-1"]
    assert not listfilters.node_filter(pb.ListNodesRequest()).any
    for bad in (pb.ListNodesRequest(min_free_gpus=-1), pb.ListNodesRequest(name="*" * 300)):
        with pytest.raises(RequestError):
            listfilters.node_filter(bad)


def test_a_filtered_node_page_looks_at_a_bounded_number_and_goes_on() -> None:
    core = cluster(0)
    for i in range(10):
        core.register_node(reg(f"n{i}", rack="far" if i == 9 else "near"), f"s{i}", now=0.0)
    index = paging.NodeIndex()

    def far(node: object) -> bool:
        return getattr(node, "rack", "") == "far"

    page, last = index.page(core.cluster.nodes, 5, None, far, scan=4)
    assert page == [] and last == "n3"                              # short, with a token to go on
    seen: list[str] = []
    while last is not None:
        page, last = index.page(core.cluster.nodes, 5, last, far, scan=4)
        seen += [n.node_id for n in page]
    assert seen == ["n9"]


def test_a_json_page_is_each_view_as_json_text_and_a_finished_job_s_text_is_kept() -> None:
    core = cluster(1)
    done = finished(core, 100, {"K": "v"})
    live = core.submit(JobSpec(gpus=1, command=["true"]), "alice", now=2.0)
    views = ListViews()
    for _ in range(2):                      # built, then the finished job's text from what was kept
        for private in (True, False):
            page = views.job_json(core, [done, live], {}, lambda j, p=private: p)
            expected = [to_json_text(m) for m in pbviews.job_list(core, [done, live], {}, lambda j, p=private: p)]
            assert page == ",\n  ".join(expected).encode()
            assert (b'"K": "v"' in page) is private
    assert set(views.jobs_json) == {(done.job_id, True), (done.job_id, False)}, "only the finished job is kept"
    assert views.job_json(core, [], {}, lambda j: True) == b""
