"""Finding 6: on a full disk a submit was acknowledged, then lost after a restart. Now a write that does not reach
the disk fails the request (UNAVAILABLE, with the reason), leaves no trace, and the RM takes writes again once
there is space. A real RM whose state dir is a small tmpfs, filled up."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import grpc
import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.rmproc import AgentProcess, RMProcess, poll
from tests.security.rmstate import fill, known_node, tmpfs


def submit(rm: RMProcess, name: str) -> pb.SubmitJobResponse:
    spec = pb.JobSpec(name=name, gpus=1, command=["/bin/true"])
    reply: pb.SubmitJobResponse = rm.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                                      metadata=rm.metadata, timeout=10)
    return reply


def names(rm: RMProcess) -> list[str]:
    return sorted(j.spec.name for j in rm.client.ListJobs(pb.ListJobsRequest(), timeout=10).jobs)


def test_a_submit_on_a_full_disk_fails_and_leaves_no_trace(tmp_path: Path, broker: TestBroker) -> None:
    with tmpfs(tmp_path / "rm-state", "4m") as state:
        rm = RMProcess(tmp_path, broker)
        try:
            known_node(tmp_path, rm)
            submit(rm, "before")
            filler = fill(state)

            with pytest.raises(grpc.RpcError) as refused:
                submit(rm, "on-a-full-disk")
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            details = refused.value.details()
            assert "store cannot be written" in details and f"free space in {state}" in details, details
            info = rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10)
            assert "store cannot be written" in info.store_error
            assert names(rm) == ["before"], "the refused submit must not show in memory either"

            with pytest.raises(grpc.RpcError) as again:   # refused up front while the store is broken
                submit(rm, "still-full")
            assert again.value.code() is grpc.StatusCode.UNAVAILABLE
            assert names(rm) == ["before"]
            assert "refusing writes" in rm.log_text()

            filler.unlink()
            poll(lambda: not rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10).store_error, 15,
                 "the RM to take writes again after space was freed")
            submit(rm, "after")
            assert names(rm) == ["after", "before"]

            rm.stop()
            rm.start()
            assert names(rm) == ["after", "before"], "the refused submits are not in the store"
        finally:
            rm.close()


def test_a_refused_submit_launches_nothing_and_a_live_agent_carries_on(tmp_path: Path, broker: TestBroker) -> None:
    """The core's effects wait for the write: a refused submit never reaches an agent. After the store works
    again the agent is taken back (re-registered, as after an RM restart) and jobs run."""
    with tmpfs(tmp_path / "rm-state", "4m") as state:
        rm = RMProcess(tmp_path, broker, heartbeat="500ms", missed_beats=20)
        agent = AgentProcess(tmp_path / "node-1", rm, "node-1")
        try:
            agent.start()
            filler = fill(state)
            with pytest.raises(grpc.RpcError) as refused:
                submit(rm, "refused")
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            time.sleep(3)    # what a launch would take: the agent must not start an AM meanwhile
            assert agent.processes(GPURM_RM=rm.address) == [], "the refused job's AM reached the agent"
            assert names(rm) == []

            filler.unlink()
            poll(lambda: not rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10).store_error, 15,
                 "the RM to take writes again after space was freed")
            rm.wait_node("node-1")
            job_id = submit(rm, "after").job_id
            assert rm.wait_job(job_id, timeout=60).state == pb.JOB_SUCCEEDED
            assert names(rm) == ["after"]
        finally:
            agent.close()
            rm.close()
