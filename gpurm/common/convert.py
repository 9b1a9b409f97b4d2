"""Records <-> protobuf messages that more than the RM converts: job and failure states, a learner, times in ms
(the AM reports its attempts in them; the RM's own conversions are gpurm/rm/server/convert.py)."""

from __future__ import annotations

from gpurm.common.model import FailureKind, JobState, Learner
from gpurm.proto import gpurm_pb2 as pb


def ms(seconds: float) -> int:
    return round(seconds * 1000) if seconds else 0


JOB_STATE_TO_PB = {
    JobState.QUEUED: pb.JOB_QUEUED, JobState.ALLOCATING: pb.JOB_ALLOCATING, JobState.RUNNING: pb.JOB_RUNNING,
    JobState.SUCCEEDED: pb.JOB_SUCCEEDED, JobState.FAILED: pb.JOB_FAILED, JobState.KILLED: pb.JOB_KILLED,
}
JOB_STATE_FROM_PB = {v: k for k, v in JOB_STATE_TO_PB.items()}

FAILURE_TO_PB = {
    FailureKind.NONE: pb.FAILURE_NONE, FailureKind.USER: pb.FAILURE_USER, FailureKind.INFRA: pb.FAILURE_INFRA,
    FailureKind.PREEMPTED: pb.FAILURE_PREEMPTED, FailureKind.KILLED: pb.FAILURE_KILLED,
    FailureKind.AM: pb.FAILURE_AM,
}
FAILURE_FROM_PB = {v: k for k, v in FAILURE_TO_PB.items()}
FAILURE_FROM_PB[pb.FAILURE_KIND_UNSPECIFIED] = FailureKind.NONE

CONTAINER_STATE_NAMES = {
    pb.CONTAINER_STARTING: "STARTING", pb.CONTAINER_RUNNING: "RUNNING", pb.CONTAINER_EXITED: "EXITED",
    pb.CONTAINER_FAILED_TO_START: "FAILED_TO_START", pb.CONTAINER_LOST: "LOST",
    pb.CONTAINER_STATE_UNSPECIFIED: "STARTING",
}
CONTAINER_STATE_VALUES = {v: k for k, v in CONTAINER_STATE_NAMES.items() if k != pb.CONTAINER_STATE_UNSPECIFIED}


def learner_to_pb(learner: Learner) -> pb.Learner:
    return pb.Learner(rank=learner.rank, node_id=learner.node_id, host=learner.host,
                      gpu_indices=learner.gpu_indices, container_id=learner.container_id,
                      state=CONTAINER_STATE_VALUES.get(learner.state, pb.CONTAINER_STARTING),
                      exit_code=learner.exit_code, signal=learner.signal, pid=learner.pid,
                      preemptible=learner.preemptible, usage=learner.usage)


def learner_from_pb(msg: pb.Learner) -> Learner:
    return Learner(rank=msg.rank, node_id=msg.node_id, gpu_indices=list(msg.gpu_indices),
                   container_id=msg.container_id, host=msg.host,
                   state=CONTAINER_STATE_NAMES.get(msg.state, "STARTING"), exit_code=msg.exit_code,
                   signal=msg.signal, pid=msg.pid, preemptible=msg.preemptible, usage=msg.usage)
