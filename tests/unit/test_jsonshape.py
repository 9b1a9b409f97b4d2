"""gpurm's one JSON shape (gpurm/jsonshape.py): enums spelled as the CLI's tables spell them, numbers as numbers,
every field present."""

from __future__ import annotations

import json

from gpurm.jsonshape import enum_name, to_plain
from gpurm.proto import gpurm_pb2 as pb


def test_states_lose_their_prefix_and_big_numbers_stay_numbers() -> None:
    job = pb.Job(job_id="job-7", state=pb.JOB_SUCCEEDED, submit_ms=1_790_000_000_123,
                 spec=pb.JobSpec(gpus=2, command=["x"], env={"B": "2", "A": "1"}),
                 attempts=[pb.Attempt(attempt=1, state=pb.JOB_FAILED, failure=pb.FAILURE_USER,
                                            learners=[pb.Learner(rank=0, gpu_indices=[0, 1])])])
    plain = to_plain(job)
    assert plain["state"] == "SUCCEEDED" and plain["submit_ms"] == 1_790_000_000_123
    assert plain["attempts"][0]["state"] == "FAILED" and plain["attempts"][0]["failure"] == "USER"
    assert plain["attempts"][0]["learners"][0]["gpu_indices"] == [0, 1]
    assert plain["spec"]["env"] == {"A": "1", "B": "2"} and plain["spec"]["gpus"] == 2
    assert plain["exit_code"] == 0 and plain["diagnostics"] == ""          # defaults are present
    json.dumps(plain)                                                          # JSON-ready as it is


def test_every_enum_of_the_protocol_reads_like_the_tables() -> None:
    assert to_plain(pb.NodeInfo(state=pb.NODE_LOST))["state"] == "LOST"
    assert enum_name(pb.ContainerStatus.DESCRIPTOR.fields_by_name["state"].enum_type, pb.CONTAINER_FAILED_TO_START) \
        == "FAILED_TO_START"
    assert enum_name(pb.ContainerStatus.DESCRIPTOR.fields_by_name["kind"].enum_type, pb.CONTAINER_LEARNER) \
        == "LEARNER"
    assert to_plain(pb.Job())["state"] == "UNSPECIFIED"
    assert enum_name(pb.Job.DESCRIPTOR.fields_by_name["state"].enum_type, 99) == "99"   # from a newer RM


def test_an_unset_optional_is_null_an_unset_message_is_its_defaults_and_bytes_are_text() -> None:
    plain = to_plain(pb.GetLogsResponse(data=b"loss 0.3\n\xff"))
    assert plain["data"] == "loss 0.3\n\ufffd"
    spec = to_plain(pb.Job())["spec"]
    assert spec["max_retries"] is None and spec["gpus"] == 0
    assert to_plain(pb.JobSpec(max_retries=0))["max_retries"] == 0
