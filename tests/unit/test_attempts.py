"""Attempt records (rm/state/attempts.py) on their own: an AM's reports folded into the job, learners following their
containers."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import (
    Attempt,
    Container,
    ContainerKind,
    ContainerPhase,
    ExitKind,
    ExitStatus,
    FailureKind,
    Job,
    JobState,
    Learner,
)
from gpurm.rm.state.attempts import apply_report, follow_container
from gpurm.rm.state.cluster import Node
from gpurm.rm.state.messages import AttemptUpdate


def job() -> Job:
    return Job("job-1", JobSpec(gpus=2, command=["x"]), "u", "root.default", 0.0, seq=1, am_attempt=1,
               state=JobState.ALLOCATING)


def test_a_running_report_runs_the_job_and_fills_learners_from_the_records() -> None:
    j = job()
    c = Container("c1", "job-1", ContainerKind.LEARNER, "n1", [0, 1], 1, 0.0, pid=42)
    nodes = {"n1": Node("n1", "host-1", 1, "r1", "r1", {0: GpuRecord(0)})}
    applied, moved = apply_report(j, AttemptUpdate(1, JobState.RUNNING, [Learner(0, "n1", [0, 1], "c1")],
                                                    level="node"), {"c1": c}, nodes, 10.0)
    assert (applied, moved) == (True, True)
    assert (j.state, j.start_time, j.waiting_reason) == (JobState.RUNNING, 10.0, "")
    (learner,) = j.attempts[0].learners
    assert (learner.pid, learner.host) == (42, "host-1")
    assert apply_report(j, AttemptUpdate(1, JobState.RUNNING, level="node"), {}, nodes, 11.0) == (True, False)
    assert apply_report(j, AttemptUpdate(3, JobState.RUNNING), {}, nodes, 12.0) == (False, False)   # no attempt 2


def test_failures_and_preemptions_are_counted_over_attempts() -> None:
    j = job()
    apply_report(j, AttemptUpdate(1, JobState.FAILED, failure=FailureKind.USER, counts_as_failure=True), {}, {}, 1.0)
    apply_report(j, AttemptUpdate(2, JobState.FAILED, failure=FailureKind.PREEMPTED), {}, {}, 2.0)
    apply_report(j, AttemptUpdate(3, JobState.ALLOCATING, waiting_reason="planning"), {}, {}, 3.0)
    assert (j.failures, j.preemptions, j.state, j.waiting_reason) == (1, 1, JobState.ALLOCATING, "planning")


def test_a_learner_follows_its_container_to_its_end() -> None:
    j = job()
    j.attempts.append(Attempt(number=1, learners=[Learner(0, "n1", [0], "c1")]))
    c = Container("c1", "job-1", ContainerKind.LEARNER, "n1", [0], 1, 0.0, pid=7, phase=ContainerPhase.RUNNING)
    assert follow_container(j, c)
    assert (j.attempts[0].learners[0].state, j.attempts[0].learners[0].pid) == ("RUNNING", 7)
    c.phase, c.exit = ContainerPhase.COMPLETED, ExitStatus(ExitKind.LOST)
    follow_container(j, c)
    assert j.attempts[0].learners[0].state == "LOST"
    assert not follow_container(j, Container("c9", "job-1", ContainerKind.LEARNER, "n1", [1], 1, 0.0))
