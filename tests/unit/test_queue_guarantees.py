"""What `gpurm queues` reports beside the shares: time below the guarantee (rm/state/queuebook.py) and queueing by
job size (rm/state/views.py). Pure: records and an injected clock."""

from __future__ import annotations

import pytest

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Job, JobState
from gpurm.queues.tree import QueueDef, QueueTree
from gpurm.rm.state.queuebook import QueueBook
from gpurm.rm.state.views import queueing_by_size


def tree() -> QueueTree:
    return QueueTree(QueueDef("root", "root", children=[QueueDef("a", "root.a"), QueueDef("b", "root.b")]))


def test_a_leaf_counts_the_time_it_used_less_than_min_demand_and_steady_share() -> None:
    book = QueueBook(tree())
    book.shares(16)                        # steady shares: 8 and 8
    book.want("root.a", 4)                 # a wants 4, has 0: below min(4, 8)
    book.shares(16)
    book.track_guarantees(100.0)
    book.charge("root.a", "u", 2)          # 2 of the 4
    book.track_guarantees(130.0)
    book.charge("root.a", "u", 2)          # all 4: the guarantee is met
    book.track_guarantees(150.0)
    book.track_guarantees(500.0)
    assert book.below_guarantee_s == {"root.a": pytest.approx(50.0)}
    assert "root.b" not in book.below_guarantee_s          # no demand: nothing owed


def job(job_id: str, gpus: int, submit: float, start: float, state: JobState = JobState.RUNNING) -> Job:
    j = Job(job_id, JobSpec(gpus=gpus, command=["true"]), "u", "root.a", submit, state=state)
    j.start_time = start
    return j


def test_queueing_by_size_over_started_and_waiting_jobs() -> None:
    jobs = [job(f"s{k}", 1, 0.0, float(k)) for k in range(1, 101)]          # delays 1..100 s
    jobs += [job("big", 8, 0.0, 0.0, JobState.ALLOCATING), job("big2", 8, 50.0, 0.0, JobState.QUEUED),
             job("gone", 8, 0.0, 0.0, JobState.KILLED)]
    out = {c.size: c for c in queueing_by_size(jobs, now=200.0)}
    assert set(out) == {"1", "5-8"}
    one = out["1"]
    assert (one.started, one.mean_s, one.p99_s, one.waiting) == (100, pytest.approx(50.5), 99.0, 0)
    big = out["5-8"]
    assert (big.started, big.waiting, big.longest_wait_s) == (0, 2, 200.0)
