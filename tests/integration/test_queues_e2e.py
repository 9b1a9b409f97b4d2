"""Hierarchical queues on a real dev cluster: oversubscription, preemption, ACLs, live config."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

TIMEOUT_S, GRACE_S = 4, 2
QUEUES = f"""
defaults:
  fair_share_preemption_timeout: {TIMEOUT_S}s
  min_share_preemption_timeout: off
  preemption_grace: {GRACE_S}s
queues:
  team-a: {{}}
  team-b: {{}}
  prod: {{preemptible: false}}
  private: {{acl: {{submit: [alice-only]}}}}
"""
SLEEP = ["--", "sh", "-c", "sleep 600"]


def queues_cluster(workdir: Path, broker: TestBroker) -> Iterator[DevCluster]:
    qfile = workdir / "queues.yaml"
    qfile.write_text(QUEUES)
    c = DevCluster(workdir / "c", nodes=2, racks=1, broker=broker, extra=["--queues", str(qfile)])
    c.queues_file = qfile  # type: ignore[attr-defined]
    yield c
    c.stop()


@pytest.fixture
def cluster(tmp_path: Path, broker: TestBroker) -> Iterator[DevCluster]:
    """A fresh cluster: the preemption tests need it empty, and leave jobs behind."""
    yield from queues_cluster(tmp_path, broker)


@pytest.fixture(scope="module")
def config_cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    """One cluster for the tests of the queue config and ACLs: each leaves no job running, and each checks the
    tree it made itself (a refresh, a reread) or what every tree here has (the private queue's ACL)."""
    yield from queues_cluster(tmp_path_factory.mktemp("queues-config"), broker)


def running(c: DevCluster, job_ids: list[str], timeout: float = 30) -> None:
    for j in job_ids:
        c.wait_job(j, states=[pb.JOB_RUNNING], timeout=timeout)


def queue_row(c: DevCluster, path: str) -> dict[str, object]:
    rows = c.gpurm("queues", "-o", "json").json()["queues"]
    return next(r for r in rows if r["path"] == path)  # type: ignore[no-any-return]


def test_flood_then_the_other_queue_takes_its_share_back_by_preemption(cluster: DevCluster) -> None:
    c = cluster
    a_jobs = [c.submit("--gpus", "4", "--queue", "team-a", *SLEEP) for _ in range(4)]
    running(c, a_jobs)
    assert queue_row(c, "root.team-a")["used_gpus"] == 16            # the whole idle cluster: oversubscribed
    # Beyond its steady share (4 of 16 GPUs: four queues of weight 1): every job but the one granted first,
    # whichever that is (each AM asks when it is up, so grants need not follow the submit order).
    steady = int(queue_row(c, "root.team-a")["steady_share"])  # type: ignore[call-overload]
    marked = [j for j in a_jobs if "PREEMPTIBLE (runs beyond" in c.gpurm("status", j).out]
    assert steady == 4 and len(marked) == 3, (steady, marked)
    assert "*" in c.gpurm("jobs").out

    newest = sorted(a_jobs, key=lambda j: c.job(j).start_ms)[2:]
    # Preemption frees whole jobs wherever they run; `rack` lets b use GPUs on both servers.
    jb = c.submit("--gpus", "8", "--queue", "team-b", "--start-level", "rack", *SLEEP)
    c.wait_job(jb, states=[pb.JOB_RUNNING], timeout=TIMEOUT_S + GRACE_S + 20)
    assert queue_row(c, "root.team-b")["used_gpus"] == 8 and queue_row(c, "root.team-a")["used_gpus"] == 8
    preempted = [j for j in a_jobs if c.job(j).preemptions]
    assert sorted(preempted) == sorted(newest)                        # the two newest, and only them
    # team-b waited below its guarantee (min(demand, steady share)) until the preemption made room; team-a never.
    table = c.gpurm("queues", "-o", "json").json()
    rows = {r["path"]: r for r in table["queues"]}
    assert rows["root.team-b"].get("below_guarantee_s", 0) >= TIMEOUT_S
    assert rows["root.team-a"].get("below_guarantee_s", 0) == 0
    by_size = {s["size"]: s for s in table["by_size"]}
    assert by_size["2-4"]["started"] == 4 and by_size["5-8"]["started"] == 1
    assert by_size["5-8"]["mean_s"] >= TIMEOUT_S > by_size["2-4"]["mean_s"]
    text = c.gpurm("queues").out
    assert "BELOW GUARANTEE" in text and "P99 QUEUEING" in text
    for j in preempted:
        job = c.job(j)
        assert job.state in (pb.JOB_ALLOCATING, pb.JOB_QUEUED)        # requeued with the same id
        assert job.failures == 0                                      # preemption is not a failure
        assert job.attempts[0].failure == pb.FAILURE_PREEMPTED and not job.attempts[0].counts_as_failure
        assert "preempted" in c.gpurm("status", j).out
    for j in (*a_jobs, jb):
        c.gpurm("kill", j, "--no-wait")


def test_a_non_preemptible_queue_is_never_preempted(cluster: DevCluster) -> None:
    c = cluster
    p_jobs = [c.submit("--gpus", "8", "--queue", "prod", *SLEEP) for _ in range(2)]
    running(c, p_jobs)
    jb = c.submit("--gpus", "8", "--queue", "team-b", *SLEEP)
    time.sleep(TIMEOUT_S + GRACE_S + 4)
    assert [c.job(j).preemptions for j in p_jobs] == [0, 0]
    states = {j: (pb.JobState.Name(c.job(j).state), c.job(j).diagnostics) for j in (*p_jobs, jb)}
    assert all(states[j][0] == "JOB_RUNNING" for j in p_jobs), states
    assert states[jb][0] != "JOB_RUNNING", states
    for j in (*p_jobs, jb):
        c.gpurm("kill", j, "--no-wait")


def test_refresh_with_a_bad_file_keeps_the_old_tree(config_cluster: DevCluster, tmp_path: Path) -> None:
    c = config_cluster
    before = c.gpurm("queues", "-o", "json").json()
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues:\n  team-a: {weight: -2, colour: blue}\n")
    r = c.gpurm("admin", "refresh-queues", str(bad))
    assert r.code == 2 and "root.team-a.weight" in r.err and "root.team-a.colour" in r.err
    assert c.gpurm("queues", "-o", "json").json() == before
    assert before["borrowing"] == "fair"
    bad.write_text("borrowing: lifo\n" + QUEUES)
    r = c.gpurm("admin", "refresh-queues", str(bad))
    assert r.code == 2 and "borrowing: must be one of fair, las, gittins" in r.err, r.err
    assert c.gpurm("queues", "-o", "json").json() == before
    # Removing a queue that still has a job is refused too.
    j = c.submit("--gpus", "1", "--queue", "team-b", *SLEEP)
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text("queues:\n  team-a: {}\n")
    r = c.gpurm("admin", "refresh-queues", str(smaller))
    assert r.code == 2 and "root.team-b" in r.err and j in r.err
    c.gpurm("kill", j)
    good = tmp_path / "good.yaml"
    good.write_text("borrowing: las\n" + QUEUES.replace("team-a: {}", "team-a: {weight: 3}"))
    r = c.gpurm("admin", "refresh-queues", str(good))
    assert r.code == 0, r.err
    assert queue_row(c, "root.team-a")["weight"] == 3
    assert c.gpurm("queues", "-o", "json").json()["borrowing"] == "las"
    assert "borrowed GPUs ordered by las across queues, 0 borrowers preempted" in c.gpurm("queues").out
    # Guarantees above the cluster's 16 GPUs: applied (capacity changes as servers come and go), with a warning
    # from the RM, which knows the capacity; check-queues says the same offline for the --capacity it is given.
    over = tmp_path / "over.yaml"
    over.write_text(QUEUES.replace("team-a: {}", "team-a: {min_gpus: 12}").replace("team-b: {}",
                                                                                   "team-b: {min_gpus: 10}"))
    r = c.gpurm("admin", "refresh-queues", str(over))
    assert r.code == 0 and "warning: the top-level queues guarantee 22 GPUs" in r.err and "has 16" in r.err, r.err
    assert queue_row(c, "root.team-a")["min_gpus"] == 12
    r = c.gpurm("admin", "check-queues", str(over), "--capacity", "16")
    assert r.code == 0 and "warning: the top-level queues guarantee 22 GPUs" in r.err and "is valid" in r.out
    assert "warning" not in c.gpurm("admin", "check-queues", str(over), "--capacity", "32").err


def test_sighup_rereads_the_configured_file(config_cluster: DevCluster) -> None:
    c = config_cluster
    c.queues_file.write_text(QUEUES + "  extra: {weight: 2}\n")  # type: ignore[attr-defined]
    os.kill(c.info["rm"]["pid"], signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        paths = [q["path"] for q in c.gpurm("queues", "-o", "json").json()["queues"]]
        if "root.extra" in paths:
            break
        time.sleep(0.2)
    assert "root.extra" in paths


def test_a_user_outside_the_submit_acl_is_refused(config_cluster: DevCluster) -> None:
    r = config_cluster.gpurm("submit", "--gpus", "1", "--queue", "private", "--", "true")
    assert r.code == 5 and "may not submit to private" in r.err and "alice-only" in r.err
    assert len(r.err.strip().splitlines()) == 1
    text = config_cluster.gpurm("queues").out
    assert text.splitlines()[0].split()[:5] == ["QUEUE", "WEIGHT", "MIN", "MAX", "STEADY"]
    assert "team-a" in text and "private" in text
