"""The container index (rm/state/containers.py) on its own: every index follows a container from grant to end."""

from __future__ import annotations

from gpurm.common.model import Container, ContainerKind, ContainerPhase
from gpurm.rm.state.containers import ContainerIndex


def learner(cid: str, job: str = "job-1", gpus: int = 2, created: float = 0.0) -> Container:
    return Container(cid, job, ContainerKind.LEARNER, "n1", list(range(gpus)), 1, created)


def test_a_learner_is_indexed_from_grant_to_end() -> None:
    changed: list[str] = []
    index = ContainerIndex(changed.append)
    c = learner("c1")
    index.add(c)
    assert index.unstarted == {"c1": None} and index.learners_live == {"job-1": 1}
    assert index.of_job("job-1") == [c] and index.live_count("job-1") == 1
    assert index.holding() == {"job-1": [c]}
    c.phase = ContainerPhase.COMPLETED
    index.unindex_live(c)
    assert (index.live, index.live_by_job, index.unstarted, index.learners_live) == ({}, {}, {}, {})
    assert index.of_job("job-1") == [] and index.of_job("job-1", live_only=False) == [c]
    assert changed == ["job-1", "job-1"]


def test_ams_are_counted_per_node_and_hold_no_gpus() -> None:
    index = ContainerIndex(lambda job_id: None)
    am = Container("job-1-am1", "job-1", ContainerKind.AM, "n2", [], 1, 0.0)
    index.add(am)
    assert index.live_ams == {"n2": {"job-1-am1": None}}
    assert index.holding() == {} and index.learners_live == {}
    index.unindex_live(am)
    assert index.live_ams == {"n2": {}}


def test_a_deadline_is_indexed_and_reindexing_counts_a_learner_once() -> None:
    index = ContainerIndex(lambda job_id: None)
    c = learner("c1")
    c.preempt_deadline = 50.0
    index.add(c)
    index.index_live(c)
    assert index.preempting == {"c1": None} and index.learners_live == {"job-1": 1}


def test_loaded_records_are_ordered_by_creation_per_job() -> None:
    index = ContainerIndex(lambda job_id: None)
    done = learner("c2", created=1.0)
    done.phase = ContainerPhase.COMPLETED
    index.load([learner("c3", created=5.0), done, learner("c1", created=1.0)])
    assert index.by_job["job-1"] == ["c1", "c2", "c3"]
    assert set(index.live) == {"c1", "c3"}
