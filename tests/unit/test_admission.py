"""Admission (rm/state/admission.py) on its own: the leaf a job goes to, who may submit and kill, sizes that could
run."""

from __future__ import annotations

import pytest

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Job
from gpurm.queues.config import parse_queues
from gpurm.rm.state.admission import admit, may_kill, resolve_queue
from gpurm.rm.state.messages import ErrorCode, RequestError

TREE = parse_queues("""
queues:
  default: {}
  research:
    max_gpus: 16
    queues:
      vision: {max_gpus_per_user: 4, acl: {submit: [alice], admin: [bob]}}
      nlp: {}
""")


def spec(gpus: int, queue: str = "") -> JobSpec:
    return JobSpec(gpus=gpus, command=["x"], queue=queue)


def refusal(code: ErrorCode, *args: object) -> str:
    with pytest.raises(RequestError) as e:
        admit(TREE, *args)  # type: ignore[arg-type]
    assert e.value.code is code
    return e.value.message


def test_jobs_go_to_a_leaf() -> None:
    assert resolve_queue(TREE, "") == "root.default"
    assert resolve_queue(TREE, "research.nlp") == "root.research.nlp"
    assert "parent queue" in refusal(ErrorCode.INVALID_ARGUMENT, spec(1, "research"), "alice", (), 64)
    assert "no queue 'x'" in refusal(ErrorCode.INVALID_ARGUMENT, spec(1, "x"), "alice", (), 64)


def test_the_submit_acl_and_the_sizes_are_checked() -> None:
    assert admit(TREE, spec(4, "research.vision"), "alice", (), 64) == "root.research.vision"
    assert "may not submit" in refusal(ErrorCode.PERMISSION_DENIED, spec(1, "research.vision"), "carol", (), 64)
    assert admit(TREE, spec(1, "research.vision"), "carol", (), 64, check_acl=False) == "root.research.vision"
    assert "max_gpus_per_user (4)" in refusal(ErrorCode.INVALID_ARGUMENT, spec(5, "research.vision"), "alice", (), 64)
    assert "max_gpus (16)" in refusal(ErrorCode.INVALID_ARGUMENT, spec(17, "research.nlp"), "alice", (), 64)
    assert "whole cluster has 8" in refusal(ErrorCode.INVALID_ARGUMENT, spec(9), "alice", (), 8)
    assert "no node has registered" in refusal(ErrorCode.INVALID_ARGUMENT, spec(1), "alice", (), 0)


def test_owner_queue_admins_and_rm_admins_may_kill() -> None:
    job = Job("job-1", spec(1, "research.vision"), "alice", "root.research.vision", 0.0)
    assert may_kill(TREE, job, "alice") and may_kill(TREE, job, "bob") and may_kill(TREE, job, "eve", rm_admin=True)
    assert not may_kill(TREE, job, "eve")
