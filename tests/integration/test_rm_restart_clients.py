"""Clients that ride out an RM restart, and accounting that survives one. Real RM (SQLite state dir, the session's
broker, which outlives the RM), a real agent with fake GPUs, real AMs and learners, and the real CLI.

- `gpurm wait JOB` and `gpurm logs -f JOB` run while the RM is SIGKILLed and started again on the same port and
  state dir: both say the RM is unreachable, keep retrying, and finish normally once the job ends.
- `gpurm acct` shows finished jobs (counts, outcomes, GPU-hours) from the store after a restart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT, processes_with_env
from tests.integration.rmproc import AgentProcess, RMProcess, poll


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[tuple[RMProcess, AgentProcess]]:
    work = tmp_path_factory.mktemp("rm-restart-clients")
    rm = RMProcess(work / "rm", broker, heartbeat="1s")
    # mqtt.advertise: this node's own address of the broker (here the same one), handed to the AMs it starts.
    agent = AgentProcess(work / "agent", rm, "restart-node", gpus={"fake": 2}, mqtt={"advertise": broker.url})
    try:
        agent.start()
        yield rm, agent
    finally:
        agent.close()
        assert rm.close() == 0, rm.log_text()


def cli(rm: RMProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPURM_RM": rm.address}
    return subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def background(rm: RMProcess, out: Path, *args: str) -> tuple[subprocess.Popen[bytes], IO[Any], IO[Any]]:
    stdout, stderr = open(out.with_suffix(".out"), "wb"), open(out.with_suffix(".err"), "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "gpurm.cli.main", *args], cwd=ROOT, stdout=stdout, stderr=stderr,
                            env={**os.environ, "GPURM_RM": rm.address})
    return proc, stdout, stderr


def test_wait_and_logs_follow_ride_out_an_rm_restart(cluster: tuple[RMProcess, AgentProcess], tmp_path: Path) -> None:
    rm, _agent = cluster
    gate = tmp_path / "go"
    job_id = rm.submit(f"echo before; while [ ! -e {gate} ]; do sleep 0.05; done; echo after", gpus=1)
    rm.wait_job(job_id, states=[pb.JOB_RUNNING])
    waiter, *wait_files = background(rm, tmp_path / "wait", "wait", job_id)
    follower, *follow_files = background(rm, tmp_path / "follow", "logs", job_id, "-f")
    try:
        poll(lambda: b"before" in (tmp_path / "follow.out").read_bytes(), 30, lambda: "logs -f printed nothing")
        rm.kill()                    # SIGKILL: the clients' next calls find nobody on the port
        time.sleep(1.5)
        assert waiter.poll() is None and follower.poll() is None
        gate.touch()                 # the learner ends while the RM is down: the agent tells the new RM
        rm.start()                   # same port, same state dir
        assert waiter.wait(60) == 0, (tmp_path / "wait.err").read_text()
        assert follower.wait(60) == 0, (tmp_path / "follow.err").read_text()
    finally:
        for p in (waiter, follower):
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in (*wait_files, *follow_files):
            f.close()
    assert (tmp_path / "wait.out").read_text().strip() == f"{job_id} SUCCEEDED"
    assert (tmp_path / "follow.out").read_bytes() == b"before\nafter\n"      # nothing lost, nothing twice
    for name in ("wait", "follow"):
        err = (tmp_path / f"{name}.err").read_text()
        assert f"RM at {rm.address} unreachable" in err and "retrying for 60s" in err, err
        assert f"RM at {rm.address} answers again after" in err, err


def test_an_unreachable_rm_ends_the_command_with_exit_3_after_the_window(tmp_path: Path) -> None:
    from tests.conftest import free_port

    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "jobs", "--rm", address, "--retry-for", "2s"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - t0
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3, done.stderr
    assert lines[0].startswith(f"RM at {address} unreachable") and "retrying for 2s" in lines[0]
    assert lines[-1].startswith(f"gpurm jobs: error: cannot reach the RM at {address} after retrying for 2s")
    assert len(lines) == 2 and 2 <= took < 20


def test_the_am_gets_its_nodes_broker_address(cluster: tuple[RMProcess, AgentProcess], broker: TestBroker) -> None:
    rm, _agent = cluster
    job_id = rm.submit("sleep 30", gpus=1)
    try:
        rm.wait_job(job_id, states=[pb.JOB_RUNNING])
        am_pids = [p for p in processes_with_env("GPURM_JOB_ID", job_id)
                   if f"GPURM_MQTT_URL={broker.url}".encode() in Path(f"/proc/{p}/environ").read_bytes()]
        assert am_pids, "the AM's environment lacks the agent's mqtt.advertise"
    finally:
        rm.kill_job(job_id)
        rm.wait_job(job_id)


def acct(rm: RMProcess, *args: str) -> dict[str, Any]:
    import json

    done = cli(rm, "acct", "--since", "1h", "-o", "json", *args)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_acct_counts_finished_jobs_from_the_store_after_a_restart(cluster: tuple[RMProcess, AgentProcess]) -> None:
    rm, _agent = cluster
    before = acct(rm)["total"]
    ok = rm.submit("sleep 1; exit 0", gpus=1)
    bad = rm.submit("exit 3", gpus=1)
    killed = rm.submit("sleep 60", gpus=1)
    rm.wait_job(killed, states=[pb.JOB_RUNNING])
    rm.kill_job(killed)
    states = {j: rm.wait_job(j).state for j in (ok, bad, killed)}
    assert states == {ok: pb.JOB_SUCCEEDED, bad: pb.JOB_FAILED, killed: pb.JOB_KILLED}
    rm.stop()
    rm.start()                                          # what acct shows now comes from the store
    after = acct(rm)
    total = after["total"]
    assert total["jobs"] - before["jobs"] == 3
    for outcome in ("succeeded", "failed", "killed"):
        assert total[outcome] - before[outcome] == 1, (outcome, before, total)
    assert total["gpu_hours"] - before["gpu_hours"] >= 1.0 / 3600          # at least the one-second learner
    assert [r["user"] for r in acct(rm, "--by", "user")["rows"]] == [rm.metadata[0][1]]
    (row,) = acct(rm, "--by", "queue,day")["rows"]
    assert row["queue"] == "default" and row["day"] == time.strftime("%Y-%m-%d", time.gmtime())
    assert acct(rm, "--user", "somebody-else")["rows"] == []
    done = cli(rm, "acct", "--since", "1h", "--by", "user", "-o", "csv")
    assert done.returncode == 0 and done.stdout.splitlines()[0].startswith("user,jobs,succeeded,failed,killed")
    done = cli(rm, "acct", "--since", "1h", "--by", "user")
    assert done.returncode == 0 and "GPU-HOURS" in done.stdout.splitlines()[1], done.stdout
    done = cli(rm, "acct", "--by", "month")
    assert done.returncode == 2 and "--by: unknown grouping 'month'" in done.stderr


def test_the_rm_marks_its_own_refusals(cluster: tuple[RMProcess, AgentProcess]) -> None:
    # So that a client never takes a refusal the RM made (even an UNAVAILABLE one) for the RM being away.
    import grpc

    from gpurm.common.retry import ANSWERED_KEY, answered

    rm, _agent = cluster
    with pytest.raises(grpc.RpcError) as err:
        rm.client.GetJob(pb.GetJobRequest(job_id="job-999999"), timeout=10)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert answered(err.value.trailing_metadata()), err.value.trailing_metadata()
    assert ANSWERED_KEY == "x-gpurm-answered"
