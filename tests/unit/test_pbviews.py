"""rm/server/pbviews.py: what the RM answers with, built from a real core's records."""

from __future__ import annotations

from gpurm.common.jobspec import JobSpec
from gpurm.rm.server import pbviews
from tests.unit.test_rm_core import cluster


def test_a_job_view_hides_env_values_from_those_who_may_not_see_them() -> None:
    core = cluster(2)
    job_id = core.submit(JobSpec(gpus=2, command=["train"], env={"TOKEN": "s3cret"}), "alice", 1.0).job_id
    job = core.jobs[job_id]
    mine = pbviews.job(core, job, {}, private=True)
    theirs = pbviews.job(core, job, {}, private=False)
    assert mine.spec.env["TOKEN"] == "s3cret"
    assert theirs.spec.env["TOKEN"] == pbviews.HIDDEN and "s3cret" not in str(theirs)
    assert mine.job_id == job_id and mine.waiting_reason == core.why_waiting(job)


def test_the_cluster_view_and_the_queue_table_follow_the_core() -> None:
    core = cluster(3, gpus=4)
    view = pbviews.cluster_view(core, epoch=7, now=12.5)
    assert (view.epoch, view.time_ms, view.version) == (7, 12_500, core.cluster.version)
    assert [n.node_id for n in view.nodes] == sorted(core.cluster.nodes)
    table = pbviews.queues(core)
    assert table.capacity == 12
    root = next(q for q in table.queues if q.path == "root")
    assert root.used_gpus == 0 and not root.leaf
