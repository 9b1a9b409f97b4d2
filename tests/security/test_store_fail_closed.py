"""Finding 6: on a full disk a submit was acknowledged, then lost after a restart. Now a write that does not reach
the disk fails the request (UNAVAILABLE, with the reason), leaves no trace, and the RM takes writes again once
there is space. A real RM whose state dir is a small tmpfs, filled up."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.integration.rmproc import RMProcess, poll
from tests.security.rmstate import fill, known_node, tmpfs


def submit(rm: RMProcess, name: str) -> pb.SubmitJobResponse:
    spec = pb.JobSpec(name=name, gpus=1, command=["/bin/true"])
    reply: pb.SubmitJobResponse = rm.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                                      metadata=rm.metadata, timeout=10)
    return reply


def names(rm: RMProcess) -> list[str]:
    return sorted(j.spec.name for j in rm.client.ListJobs(pb.ListJobsRequest(), timeout=10).jobs)


def test_a_submit_on_a_full_disk_fails_and_leaves_no_trace(tmp_path: Path, mqtt_url: str) -> None:
    with tmpfs(tmp_path / "rm-state", "4m") as state:
        rm = RMProcess(tmp_path, mqtt_url)
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
