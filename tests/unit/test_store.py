"""The SQLite store: what is saved comes back after reopening the file, in WAL mode with full sync."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec, Locality, LocalityLevel, Placement
from gpurm.common.model import Attempt, Container, ContainerKind, ExitKind, ExitStatus, Job, JobState, Learner
from gpurm.rm.state.cluster import Node, NodeState
from gpurm.rm.storage.store import SqliteStore


def test_round_trip_through_a_reopened_file(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    spec = JobSpec(gpus=16, command=["python", "x"], env={"A": "1"},
                   locality=Locality(timeout_s=5, start_level=LocalityLevel.RACK))
    job = Job("job-1", spec, "alice", "root.default", 10.0, seq=1, state=JobState.RUNNING,
              attempts=[Attempt(1, JobState.RUNNING, learners=[Learner(0, "n1", [0, 1], "c1")])],
              am_registered=[1])
    c = Container("c1", "job-1", ContainerKind.LEARNER, "n1", [0, 1], 1, 11.0,
                  exit=ExitStatus(ExitKind.EXITED, 3, 0, "x"))
    node = Node("n1", "h", 1, "r1", "r1", {0: GpuRecord(0, links=[(1, 1, 18)]), 1: GpuRecord(1)},
                state=NodeState.DRAINING, allocated={0: "c1"})
    store.save([job], [c], [node], {"next_job_seq": "2"})
    store.close()
    again = SqliteStore(path)
    snap = again.load()
    assert snap.jobs == [job]
    assert snap.containers == [c]
    assert snap.nodes[0].gpus[0].links == [(1, 1, 18)] and snap.nodes[0].state is NodeState.DRAINING
    assert snap.meta["next_job_seq"] == "2"
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    again.close()


def test_a_failed_save_changes_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    job = Job("job-1", JobSpec(gpus=1, command=["x"]), "a", "root.default", 1.0, seq=1)
    store.save([job], [], [], {})

    class Boom(Container):
        @property
        def phase(self):  # type: ignore[override]
            raise RuntimeError("boom")

    bad = job.__class__("job-2", JobSpec(gpus=1, command=["x"]), "a", "root.default", 1.0, seq=2)
    try:
        store.save([bad], [Boom.__new__(Boom)], [], {})
    except Exception:
        pass
    assert [j.job_id for j in store.load().jobs] == ["job-1"]


def test_a_spread_job_stays_spread_and_an_old_record_without_the_field_is_a_pack_job(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    spread = Job("job-1", JobSpec(gpus=4, command=["serve"], placement=Placement.SPREAD), "alice", "root.default",
                 1.0, seq=1)
    store.save([spread], [], [], {})
    store.close()
    again = SqliteStore(path)
    (job,) = again.load().jobs
    assert job.spec.placement is Placement.SPREAD and job == spread
    # A record written before the field existed has no `placement` key: it loads as pack.
    again.close()
    db = sqlite3.connect(path)
    data = json.loads(db.execute("SELECT data FROM jobs").fetchone()[0])
    del data["spec"]["placement"]
    db.execute("UPDATE jobs SET data = ?", (json.dumps(data),))
    db.commit()
    db.close()
    (old,) = SqliteStore(path).load().jobs
    assert old.spec.placement is Placement.PACK


def test_a_record_dumps_as_the_generic_walk_does() -> None:
    """to_dict's generated per-class dumpers (rm/storage/records.py) give the generic walk's dict: enums by name,
    nested records, lists, dicts with their keys as text, sets sorted."""
    import dataclasses
    import enum

    from gpurm.common.jobspec import JobSpec
    from gpurm.common.model import Job, JobState
    from gpurm.rm.storage.records import _dump, to_dict

    def walk(value: object) -> object:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: walk(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, enum.Enum):
            return value.name
        return _dump(value)

    job = Job(job_id="job-7", spec=JobSpec(gpus=2, command=["a", "b"], env={"K": "v"}), user="u", queue="root.q",
              submit_time=1.5, seq=7, state=JobState.RUNNING, am_registered=[3, 1])
    assert to_dict(job) == walk(job)
    assert to_dict(job)["state"] == "RUNNING" and to_dict(job)["spec"]["env"] == {"K": "v"}
