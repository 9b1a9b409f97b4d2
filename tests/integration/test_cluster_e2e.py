"""End to end on a real dev cluster: RM, agents, AMs and learners as separate processes, real MQTT broker."""

from __future__ import annotations

import getpass
import json
import os
import signal
import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT, DevCluster, alive


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("e2e"), nodes=3, racks=2, broker=broker)
    yield c
    assert c.stop() == 0


def agent_records(state_dir: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) | {"node": p.parents[2].name}
            for p in state_dir.glob("agents/*/containers/*/record.json")]


def test_demo_jobs_get_distinct_gpus_and_the_right_environment(cluster: DevCluster) -> None:
    ids = [cluster.submit(str(ROOT / "configs" / "jobs" / f"{n}.yaml"))
           for n in ("hello-1gpu", "train-8gpu", "train-16gpu")]
    jobs = [cluster.wait_job(i, timeout=120) for i in ids]
    assert [pb.JobState.Name(j.state) for j in jobs] == ["JOB_SUCCEEDED"] * 3, [j.diagnostics for j in jobs]
    racks = {n.node_id: n.rack for n in cluster.nodes()}
    for job in jobs:
        learners = job.attempts[-1].learners
        assert sum(len(ln.gpu_indices) for ln in learners) == job.spec.gpus
        assert len({ln.node_id for ln in learners}) == len(learners)       # one learner per server
        for ln in learners:
            out = cluster.gpurm("logs", job.job_id, "--rank", str(ln.rank)).out
            gpus = ",".join(str(i) for i in ln.gpu_indices)
            assert f"node rank {ln.rank}/{len(learners)}" in out, out
            assert f"GPUs {gpus}," in out and f"world size {job.spec.gpus}" in out, out
    big = jobs[2]
    nodes = [ln.node_id for ln in big.attempts[-1].learners]
    assert len(nodes) == 2 and racks[nodes[0]] == racks[nodes[1]]       # packed: two servers, one rack
    assert big.attempts[-1].level == "packed"
    # No two learner containers that ran at the same time on a node shared a GPU (the agents' own records).
    learners = [r for r in agent_records(cluster.state_dir) if r["kind"] == "CONTAINER_LEARNER"]
    for a, b in combinations(learners, 2):
        overlap = a["node"] == b["node"] and a["start_ms"] < b["end_ms"] and b["start_ms"] < a["end_ms"]  # type: ignore[operator]
        if overlap:
            assert not set(a["gpu_indices"]) & set(b["gpu_indices"]), (a, b)  # type: ignore[call-overload]


def test_jobs_run_as_the_user_the_dev_cluster_names_never_root(cluster: DevCluster) -> None:
    expected = "nobody" if os.geteuid() == 0 else getpass.getuser()
    assert f"jobs run as: {expected}" in cluster.log_text()
    job_id = cluster.submit("--gpus", "1", "--", "sh", "-c", "id -un; id -u")
    job = cluster.wait_job(job_id, timeout=60)
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    name, uid = cluster.gpurm("logs", job_id).out.split()[:2]
    assert name == expected and uid != "0"
    # the AM and the learner alike, by the agents' own records
    assert {r["run_as"] for r in agent_records(cluster.state_dir) if str(r["job_id"]) == job_id} == {expected}


def test_a_command_that_exits_3_fails_with_code_3(cluster: DevCluster) -> None:
    job_id = cluster.submit("--gpus", "1", "--max-retries", "0", "--", "sh", "-c", "echo bye; exit 3")
    job = cluster.wait_job(job_id)
    assert job.state == pb.JOB_FAILED and job.exit_code == 3
    assert "exited with code 3" in job.diagnostics
    status = cluster.gpurm("status", job_id)
    assert "FAILED" in status.out and "exit code 3" in status.out
    assert cluster.gpurm("logs", job_id).out == "bye\n"


def test_kill_leaves_no_process_behind(cluster: DevCluster) -> None:
    job_id = cluster.submit("--gpus", "2", "--", "sh", "-c", "sleep 600 & sleep 600")
    cluster.wait_job(job_id, states=[pb.JOB_RUNNING])
    deadline = time.monotonic() + 10
    while len(cluster.job_pids(job_id)) < 4 and time.monotonic() < deadline:   # AM, sh, 2 sleeps
        time.sleep(0.1)
    pids = cluster.job_pids(job_id)
    learner_pid = cluster.job(job_id).attempts[-1].learners[0].pid
    assert learner_pid in pids and len(pids) >= 4
    r = cluster.gpurm("kill", job_id)
    assert r.code == 0 and "processes are gone" in r.out
    assert [p for p in pids if alive(p)] == []
    job = cluster.job(job_id)
    assert job.state == pb.JOB_KILLED and job.live_containers == 0


def test_logs_follow_streams_every_rank_until_the_end(cluster: DevCluster) -> None:
    job_id = cluster.submit(str(ROOT / "configs" / "jobs" / "train-16gpu.yaml"))
    r = cluster.gpurm("logs", job_id, "-f", timeout=120)
    assert r.code == 0, r.err
    assert "[rank 0] step 30/30" in r.out and "[rank 1] rank 1 done" in r.out
    assert r.out.count("[rank 0] step ") == 30                    # nothing lost, nothing twice
    assert "SUCCEEDED" in r.err


def test_json_output_serves_scripts(cluster: DevCluster) -> None:
    jobs = cluster.gpurm("jobs", "-o", "json").json()
    assert jobs and all("job_id" in j and "state" in j for j in jobs)
    nodes = cluster.gpurm("nodes", "-o", "json").json()
    assert sorted(n["node_id"] for n in nodes) == ["node-1", "node-2", "node-3"]
    table = cluster.gpurm("nodes").out.splitlines()
    assert table[0].split()[:3] == ["NODE", "RACK", "STATE"]
    assert len({line.index("RACK") if "RACK" in line else -1 for line in table[:1]}) == 1


BAD_FILES = {
    "yaml that does not parse": ("gpus: [1\ncommand: x\n", "not valid YAML"),
    "unknown key": ("gpus: 1\ncommand: x\ngpu_count: 2\n", "gpu_count: unknown field"),
    "missing command": ("gpus: 1\n", "command: is required"),
    "zero gpus": ("gpus: 0\ncommand: x\n", "gpus: must be at least 1"),
    "gpus not an integer": ("gpus: two\ncommand: x\n", "gpus: must be an integer"),
    "more gpus than the cluster": ("gpus: 1000\ncommand: x\n", "whole cluster has 24"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_job_files_are_refused_with_one_line_and_create_nothing(cluster: DevCluster, tmp_path: Path,
                                                                    case: str) -> None:
    text, expected = BAD_FILES[case]
    path = tmp_path / "job.yaml"
    path.write_text(text)
    before = len(cluster.gpurm("jobs", "-o", "json").json())
    r = cluster.gpurm("submit", str(path))
    assert r.code == 2
    assert expected in r.err and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    assert len(cluster.gpurm("jobs", "-o", "json").json()) == before


@pytest.mark.parametrize("command", ["status", "logs", "kill"])
def test_unknown_job_ids(cluster: DevCluster, command: str) -> None:
    r = cluster.gpurm(command, "job-999999")
    assert r.code == 4 and "job-999999" in r.err and len(r.err.strip().splitlines()) == 1


def test_flag_errors(cluster: DevCluster) -> None:
    r = cluster.gpurm("submit", "--gpus", "-1", "--", "true")
    assert r.code == 2 and "gpus" in r.err
    r = cluster.gpurm("submit", "--", "true")
    assert r.code == 2 and "--gpus" in r.err


def test_unreachable_rm_is_one_line(cluster: DevCluster) -> None:
    from tests.conftest import free_port

    r = cluster.gpurm("--help")
    assert r.code == 0 and "example" in r.out
    # --retry-for 0 (GPURM_RETRY_FOR=0): no riding out an outage; exit 3 says the RM could not be reached.
    r = cluster.gpurm("submit", "--gpus", "1", "--", "true",
                      env={"GPURM_RM": f"127.0.0.1:{free_port()}", "GPURM_RETRY_FOR": "0"})
    assert r.code == 3 and "cannot reach the RM" in r.err and len(r.err.strip().splitlines()) == 1


def test_sigkilled_agent_shows_lost_within_the_expiry(tmp_path: Path, broker: TestBroker) -> None:
    c = DevCluster(tmp_path / "c", nodes=2, racks=1, broker=broker,
                   extra=["--heartbeat", "500ms", "--missed-beats", "8"])
    try:
        os.kill(c.agent_pid("node-2"), signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            r = c.gpurm("nodes", "-o", "json")
            if {n["node_id"]: n["state"] for n in r.json()}["node-2"] == "LOST":
                break
            time.sleep(0.2)
        elapsed = time.monotonic() - t0
        assert elapsed <= 4.0 + 2.0, f"LOST only after {elapsed:.1f}s (expiry 4s)"
        line = next(x for x in c.gpurm("nodes").out.splitlines() if x.startswith("node-2"))
        assert "LOST" in line
    finally:
        c.stop()


def test_sigterm_to_the_dev_cluster_leaves_no_orphan(tmp_path: Path, broker: TestBroker) -> None:
    c = DevCluster(tmp_path / "c", nodes=2, racks=1, broker=broker)
    job_id = c.submit("--gpus", "4", "--", "sh", "-c", "sleep 600 & sleep 600")
    c.wait_job(job_id, states=[pb.JOB_RUNNING])
    daemons = [c.info["rm"]["pid"], *(a["pid"] for a in c.info["agents"])]
    time.sleep(0.5)
    job_pids = c.job_pids(job_id)
    assert len(job_pids) >= 4
    assert c.stop() == 0
    assert [p for p in [*daemons, *job_pids] if alive(p)] == []


def test_kill_takes_many_ids_or_selectors_and_asks_before_killing_what_selectors_pick(cluster: DevCluster) -> None:
    jobs = [cluster.submit("--gpus", "1", "--name", f"k{i}", "--queue", "default", "--", "sleep", "300")
            for i in range(3)]
    for j in jobs:
        cluster.wait_job(j, states=[pb.JOB_RUNNING], timeout=60)
    r = cluster.gpurm("kill", jobs[0], jobs[1], "-o", "json")
    assert r.code == 0, r.err
    assert [(x["job_id"], x["killed"], x["state"]) for x in r.json()] == [(jobs[0], True, "KILLED"),
                                                                          (jobs[1], True, "KILLED")]
    # Selectors without a terminal and without --yes kill nothing.
    r = cluster.gpurm("kill", "--user", getpass.getuser(), "--state", "RUNNING")
    assert r.code == 2 and "--yes" in r.err and cluster.job(jobs[2]).state == pb.JOB_RUNNING
    r = cluster.gpurm("kill", jobs[2], "--state", "RUNNING")
    assert r.code == 2 and "not both" in r.err
    r = cluster.gpurm("kill", "--state", "SUCCEEDED", "--yes")
    assert r.code == 2 and "invalid choice: 'SUCCEEDED'" in r.err        # only live jobs can be killed
    r = cluster.gpurm("kill", "--user", getpass.getuser(), "--state", "RUNNING", "--yes", "-o", "json")
    assert r.code == 0 and [x["job_id"] for x in r.json()] == [jobs[2]], r.out
    assert cluster.job(jobs[2]).state == pb.JOB_KILLED


def test_a_one_node_dev_cluster_runs_a_job(tmp_path: Path, broker: TestBroker) -> None:
    # `gpurm dev-cluster --nodes 1` was refused: its default --racks 2 is more racks than nodes.
    c = DevCluster(tmp_path / "one", nodes=1, gpus_per_node=2, racks=None, broker=broker)
    try:
        # The banner is printed just after the cluster says it is ready: give it a moment.
        deadline = time.monotonic() + 10
        while "dev cluster up" not in c.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "1 node x 2 GPUs (2) in 1 rack" in c.log_text()
        (node,) = c.nodes()
        assert node.rack == "rack-1"
        job = c.submit("--gpus", "2", "--", "true")
        assert c.wait_job(job).state == pb.JOB_SUCCEEDED
    finally:
        assert c.stop() == 0, c.log_text()
