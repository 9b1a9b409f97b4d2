"""Accounting (rm/accounting.py) on records alone: usage per job, grouping, windows, filters, time parsing."""

from __future__ import annotations

import calendar
import time

import pytest

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Attempt, Container, ContainerKind, ContainerPhase, FailureKind, Job, JobState, Learner
from gpurm.rm.accounting import Query, aggregate, by_fields, day_of, job_usage, parse_when, total, usages

DAY1 = float(calendar.timegm(time.strptime("2026-11-02", "%Y-%m-%d")))
DAY2 = DAY1 + 86400
H = 3600.0


def job(n: int, user: str, queue: str, state: JobState, submit: float, start: float, finish: float,
        gpus: int = 1, share_milli: int = 0, preemptions: int = 0) -> Job:
    spec = JobSpec(gpus=gpus, command=["x"], gpu_share_milli=share_milli)
    return Job(f"job-{n}", spec, user, f"root.{queue}", submit, seq=n, state=state, start_time=start,
               finish_time=finish, preemptions=preemptions)


def learner(job_id: str, cid: str, gpus: int, started: float, finished: float, share_milli: int = 0,
            attempt: int = 1) -> Container:
    return Container(cid, job_id, ContainerKind.LEARNER, "n1", list(range(gpus)), attempt, created=started,
                     phase=ContainerPhase.COMPLETED, started=started, finished=finished, share_milli=share_milli)


def test_gpu_seconds_sum_each_learner_over_attempts_and_skip_ams_and_unstarted_grants() -> None:
    j = job(1, "alice", "research.nlp", JobState.SUCCEEDED, submit=DAY1, start=DAY1 + 60, finish=DAY1 + 3 * H,
            gpus=8, preemptions=1)
    cs = [learner("job-1", "c1", 4, DAY1 + 60, DAY1 + H),                 # attempt 1, preempted after ~1 h
          learner("job-1", "c2", 4, DAY1 + 60, DAY1 + H),
          learner("job-1", "c3", 8, DAY1 + H + 60, DAY1 + 3 * H, attempt=2),
          learner("job-1", "c4", 8, 0.0, 0.0, attempt=2),                  # granted, released before it ran
          Container("am1", "job-1", ContainerKind.AM, "n1", [], 1, created=DAY1, started=DAY1, finished=DAY1 + 3 * H),
          learner("job-2", "other", 8, DAY1, DAY1 + H)]                    # another job's
    u = job_usage(j, cs)
    assert u.gpu_s == pytest.approx(8 * (H - 60) + 8 * (2 * H - 60))
    assert u.wait_s == 60 and u.queue == "research.nlp" and u.state == "SUCCEEDED" and u.preemptions == 1


def test_a_shared_gpu_job_counts_by_its_fraction() -> None:
    j = job(1, "bob", "default", JobState.SUCCEEDED, DAY1, DAY1, DAY1 + 2 * H, gpus=1, share_milli=250)
    u = job_usage(j, [learner("job-1", "c1", 1, DAY1, DAY1 + 2 * H, share_milli=250)])
    assert u.gpu_s == pytest.approx(0.25 * 2 * H)


def test_without_container_records_the_attempts_are_used() -> None:
    j = job(1, "bob", "default", JobState.FAILED, DAY1, DAY1 + 10, DAY1 + H, gpus=2)
    j.attempts = [Attempt(1, JobState.FAILED, DAY1 + 10, DAY1 + 610, [Learner(0, "n1", [0, 1])], FailureKind.USER),
                  Attempt(2, JobState.FAILED, DAY1 + 1000, 0.0, [Learner(0, "n1", [0, 1])])]   # ended with the job
    u = job_usage(j)
    assert u.gpu_s == pytest.approx(2 * 600 + 2 * (H - 1000)) and u.wait_s == 10 and u.attempts == 2
    shared = job(2, "bob", "default", JobState.SUCCEEDED, DAY1, DAY1, DAY1 + 100, gpus=1, share_milli=500)
    shared.attempts = [Attempt(1, JobState.SUCCEEDED, DAY1, DAY1 + 100, [Learner(0, "n1", [0])])]
    assert job_usage(shared).gpu_s == pytest.approx(50)


def test_a_job_that_never_ran_has_no_wait_and_no_usage() -> None:
    u = job_usage(job(1, "bob", "default", JobState.KILLED, DAY1, 0.0, DAY1 + 300))
    assert u.gpu_s == 0 and u.wait_s is None


def sample() -> tuple[list[Job], list[Container]]:
    jobs = [job(1, "alice", "research.nlp", JobState.SUCCEEDED, DAY1, DAY1 + 100, DAY1 + H, gpus=2),
            job(2, "alice", "research.cv", JobState.FAILED, DAY1, DAY1 + 300, DAY1 + 2 * H, gpus=1, preemptions=2),
            job(3, "bob", "research.nlp", JobState.KILLED, DAY1, 0.0, DAY1 + 50),
            job(4, "bob", "prod", JobState.SUCCEEDED, DAY2, DAY2 + 20, DAY2 + H, gpus=4),
            job(5, "carol", "prod", JobState.RUNNING, DAY2, DAY2, 0.0, gpus=8)]          # unfinished: not counted
    cs = [learner("job-1", "a", 2, DAY1 + 100, DAY1 + H), learner("job-2", "b", 1, DAY1 + 300, DAY1 + 2 * H),
          learner("job-4", "d", 4, DAY2 + 20, DAY2 + H), learner("job-5", "e", 8, DAY2, 0.0)]
    return jobs, cs


def test_grouping_by_user_and_day_with_totals() -> None:
    records = usages(*sample())
    assert [u.job_id for u in records] == ["job-1", "job-2", "job-3", "job-4"]
    rows = aggregate(records, Query(by=("user", "day")))
    assert [(r.key["user"], r.key["day"], r.jobs) for r in rows] == [
        ("alice", "2026-11-02", 2), ("bob", "2026-11-02", 1), ("bob", "2026-11-03", 1)]
    alice = rows[0]
    assert (alice.succeeded, alice.failed, alice.killed, alice.preempted, alice.preemptions) == (1, 1, 0, 1, 2)
    assert alice.gpu_hours == pytest.approx((2 * (H - 100) + (2 * H - 300)) / H)
    assert alice.wait_mean_s == 200 and alice.wait_max_s == 300
    assert rows[1].waited == 0 and rows[1].killed == 1 and rows[1].wait_mean_s == 0
    t = total(rows)
    assert (t.jobs, t.succeeded, t.failed, t.killed) == (4, 2, 1, 1) and t.wait_max_s == 300
    assert t.gpu_s == pytest.approx(sum(r.gpu_s for r in rows))
    assert rows[0].as_dict()["user"] == "alice" and rows[0].as_dict()["jobs"] == 2


def test_no_grouping_is_one_total_row_even_when_empty() -> None:
    records = usages(*sample())
    (row,) = aggregate(records, Query())
    assert row.jobs == 4 and row.key == {}
    (empty,) = aggregate(records, Query(users=frozenset({"nobody"})))
    assert empty.jobs == 0


def test_window_and_filters() -> None:
    records = usages(*sample())
    rows = aggregate(records, Query(by=("queue",), since=DAY2))
    assert [(r.key["queue"], r.jobs) for r in rows] == [("prod", 1)]
    rows = aggregate(records, Query(by=("queue",), until=DAY1 + H))        # until is exclusive
    assert [(r.key["queue"], r.jobs) for r in rows] == [("research.nlp", 1)]
    rows = aggregate(records, Query(by=("queue",), queues=frozenset({"research"})))   # a parent takes its leaves
    assert [r.key["queue"] for r in rows] == ["research.cv", "research.nlp"]
    rows = aggregate(records, Query(by=("user",), users=frozenset({"bob"}), queues=frozenset({"prod"})))
    assert [(r.key["user"], r.jobs) for r in rows] == [("bob", 1)]
    assert not aggregate(records, Query(by=("queue",), queues=frozenset({"research.n"})))   # not a prefix match


def test_query_problems() -> None:
    assert Query(by=("user", "month")).problems() == ["--by: unknown grouping 'month'; choose from user, queue, day"]
    assert Query(by=("user", "user")).problems() == ["--by: a grouping is named twice: user,user"]
    assert Query(since=10, until=5).problems() == ["--until: must be after --since"]


def test_parse_when() -> None:
    now = DAY2 + 5 * H
    assert parse_when("7d", now) == now - 7 * 86400
    assert parse_when("12h", now) == now - 12 * H
    assert parse_when("now", now) == now
    assert parse_when("2026-11-02", now) == DAY1
    assert parse_when("2026-11-02T08:30", now) == DAY1 + 8.5 * H
    with pytest.raises(ValueError, match="like 7d"):
        parse_when("last week", now)
    assert day_of(DAY1 + 86399) == "2026-11-02" and by_fields(" user, ,day") == ("user", "day")
