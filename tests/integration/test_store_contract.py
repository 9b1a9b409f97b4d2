"""One contract, both stores: SQLite (a file) and PostgreSQL (a throwaway server, tests/pg.py) run the same
assertions through `open_store`: round trip, group commit order, all-or-nothing, retention rows, check, and the
refusal of a newer schema. PostgreSQL's own extras (its lock, pg_dump / pg_restore) follow."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec, Locality, LocalityLevel
from gpurm.common.model import Attempt, Container, ContainerKind, ExitKind, ExitStatus, Job, JobState, Learner
from gpurm.rm.state.cluster import Node, NodeState
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.retention import Retention, RetentionSettings
from gpurm.rm.storage.store import RMStore, Rows, StoreDamaged, StoreTooNew, StoreWriteError, rows
from gpurm.rm.storage.url import open_store
from tests.conftest import free_port
from tests.unit.test_retention import T0, finished_job, learner

H = 3600.0


class Opened:
    """A store under test: `open()` opens it (again), `sql()` runs raw SQL on it behind the store's back."""

    def __init__(self, kind: str, url: str, state_dir: Path) -> None:
        self.kind, self.url, self.state_dir = kind, url, state_dir
        self.opened: list[RMStore] = []

    def open(self) -> RMStore:
        store = open_store(self.url, self.state_dir)
        self.opened.append(store)
        return store

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        if self.kind == "sqlite":
            db = sqlite3.connect(self.url.removeprefix("sqlite://"))
            try:
                out = db.execute(statement).fetchall()
                db.commit()
                return out
            finally:
                db.close()
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as pg:
            cur = pg.execute(statement.encode())
            return cur.fetchall() if cur.description else []


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    if request.param == "sqlite":
        opened = Opened("sqlite", f"sqlite://{tmp_path / 'state.db'}", tmp_path)
        yield opened
    else:
        server = request.getfixturevalue("pg_server")
        url = server.create_database()
        opened = Opened("postgresql", url, tmp_path)
        yield opened
    for s in opened.opened:
        s.close()
    if request.param == "postgresql":
        server.drop_database(url)


def sample() -> tuple[Job, Container, Node]:
    spec = JobSpec(gpus=16, command=["python", "x"], env={"A": "1"},
                   locality=Locality(timeout_s=5, start_level=LocalityLevel.RACK))
    job = Job("job-1", spec, "alice", "root.default", 10.0, seq=1, state=JobState.RUNNING,
              attempts=[Attempt(1, JobState.RUNNING, learners=[Learner(0, "n1", [0, 1], "c1")])],
              am_registered=[1])
    c = Container("c1", "job-1", ContainerKind.LEARNER, "n1", [0, 1], 1, 11.0,
                  exit=ExitStatus(ExitKind.EXITED, 3, 0, "x"))
    node = Node("n1", "h", 1, "r1", "r1", {0: GpuRecord(0, links=[(1, 1, 18)]), 1: GpuRecord(1)},
                state=NodeState.DRAINING, allocated={0: "c1"})
    return job, c, node


def job(n: int, state: JobState = JobState.QUEUED) -> Job:
    return Job(f"job-{n}", JobSpec(gpus=1, command=["x"]), "alice", "root.default", 1.0, seq=n, state=state)


def test_what_is_saved_comes_back_after_reopening(store: Opened) -> None:
    s = store.open()
    j, c, node = sample()
    s.save([j], [c], [node], {"next_job_seq": "2", "queues_yaml": "queues: {}"})
    s.close()
    snap = store.open().load()
    assert snap.jobs == [j] and snap.containers == [c]
    assert snap.nodes[0].gpus[0].links == [(1, 1, 18)] and snap.nodes[0].state is NodeState.DRAINING
    assert snap.nodes[0].allocated == {0: "c1"}
    assert snap.meta["next_job_seq"] == "2" and snap.meta["queues_yaml"] == "queues: {}"
    assert store.open().load_meta()["next_job_seq"] == "2"
    assert store.open().counts() == (1, 1, 1)


def test_jobs_load_in_submit_order(store: Opened) -> None:
    s = store.open()
    s.save([job(3), job(1), job(2)], [], [], {})
    assert [j.job_id for j in store.open().load().jobs] == ["job-1", "job-2", "job-3"]


def test_a_group_commit_writes_every_batch_and_a_later_batch_wins(store: Opened) -> None:
    s = store.open()
    s.write([rows([job(1)], [], [], {"next_job_seq": "2"}),
             rows([job(2)], [], [], {"next_job_seq": "3"}),
             rows([job(1, JobState.RUNNING)], [], [], {"next_job_seq": "4"})])
    snap = store.open().load()
    assert [(j.job_id, j.state) for j in snap.jobs] == [("job-1", JobState.RUNNING), ("job-2", JobState.QUEUED)]
    assert snap.meta["next_job_seq"] == "4"
    s.write([])                                   # nothing to write: nothing happens
    assert len(store.open().load().jobs) == 2


def test_a_failed_group_commits_nothing_and_the_store_still_works(store: Opened) -> None:
    s = store.open()
    s.save([job(1)], [], [], {"next_job_seq": "2"})
    bad = Rows(jobs=[("job-9", None, "QUEUED", "{}")])     # seq NOT NULL: the database refuses the row
    with pytest.raises(StoreWriteError):
        s.write([rows([job(1, JobState.RUNNING), job(2)], [], [], {"next_job_seq": "3"}), bad])  # type: ignore[list-item]
    snap = store.open().load()
    assert [(j.job_id, j.state) for j in snap.jobs] == [("job-1", JobState.QUEUED)]
    assert snap.meta["next_job_seq"] == "2"
    s.write([rows([job(2)], [], [], {"next_job_seq": "3"})])
    assert [j.job_id for j in store.open().load().jobs] == ["job-1", "job-2"]


def retire_setup(s: RMStore, n: int = 6) -> tuple[RMCore, list[Job]]:
    jobs = [finished_job(k, T0 + k * 60, JobState.KILLED if k % 3 == 0 else JobState.SUCCEEDED,
                         user="alice" if k % 2 else "bob") for k in range(1, n + 1)]
    containers = [learner(j, 1) for j in jobs] + [learner(j, 2) for j in jobs[:2]]
    s.save(jobs, containers, [], {"next_job_seq": str(n + 1)})
    snap = s.load()
    core = RMCore()
    core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, T0, snap.learned)
    return core, jobs


def test_retired_jobs_leave_the_loaded_tables_keep_their_rows_and_detail_until_purged(store: Opened) -> None:
    s = store.open()
    core, jobs = retire_setup(s)
    ret = Retention(RetentionSettings(memory_s=H, store_s=2 * H))
    p = ret.plan(core, T0 + 4 * 60 + H)
    assert [r.job.job_id for r in p.retired] == ["job-1", "job-2", "job-3", "job-4"]
    assert s.retire(p.retired, p.purge_before, 100) == 0
    ret.apply(core, p)
    snap = store.open().load()
    assert [j.job_id for j in snap.jobs] == ["job-5", "job-6"]
    assert {c.job_id for c in snap.containers} == {"job-5", "job-6"}
    assert [(f.user, f.gpus, f.size_gpu_s) for f in snap.learned] == [
        ("alice", 2.0, 1000.0), ("bob", 2.0, 1000.0), ("bob", 2.0, 1000.0)]
    found = s.load_retired("job-1")
    assert found is not None and found[0] == jobs[0]
    assert sorted(c.container_id for c in found[1]) == ["job-1-c1", "job-1-c2"]
    assert s.load_retired("job-5") is None
    row = s.finished_row("job-1")
    assert row is not None and row.state == "SUCCEEDED" and row.gpu_s == pytest.approx(2 * 2 * 500)
    assert row.user == "alice" and row.queue == "default" and s.finished_row("job-5") is None
    assert [u.job_id for u in s.finished_usages()] and len(s.finished_usages()) == 4
    assert {u.job_id for u in s.finished_usages(T0 + 120, T0 + 240)} == {"job-2", "job-3"}
    assert s.retired_counts() == {"root.default": (0, 0)}
    # Past the store retention the detail goes; the accounting row stays.
    p = ret.plan(core, T0 + 3 * 60 + 2 * H)
    assert s.retire(p.retired, p.purge_before, 100) == 2           # jobs 1 and 2
    ret.apply(core, p)
    assert s.load_retired("job-1") is None and s.load_retired("job-3") is not None
    assert s.finished_row("job-1") is not None and len(s.finished_usages()) == 6
    assert store.open().load().jobs == []
    assert s.retire([], None, 100) == 0


def test_check_names_every_unreadable_record_and_load_names_the_first(store: Opened) -> None:
    s = store.open()
    s.save([job(1), job(2)], [], [], {"next_job_seq": "3"})
    assert s.check() == []
    store.sql("INSERT INTO jobs VALUES ('job-3', 3, 'QUEUED', 'not json')")
    store.sql("UPDATE jobs SET data = replace(data, '\"QUEUED\"', '\"HIBERNATING\"') WHERE job_id = 'job-2'")
    store.sql("UPDATE meta SET value = 'x' WHERE key = 'next_job_seq'")
    damage = [str(d) for d in store.open().check()]
    assert damage == ["jobs job-2: state: unknown JobState value 'HIBERNATING' (written by a newer gpurm?)",
                      "jobs job-3: not JSON (Expecting value: line 1 column 1 (char 0))",
                      "meta next_job_seq: not a number: 'x'"]
    with pytest.raises(StoreDamaged) as exc:
        store.open().load()
    assert "\n" not in str(exc.value) and "jobs job-2: state: unknown JobState value 'HIBERNATING'" in str(exc.value)
    assert "gpurm admin store check" in str(exc.value)


def test_a_store_of_a_newer_schema_is_refused_with_one_line(store: Opened) -> None:
    store.open().save([job(1)], [], [], {})
    if store.kind == "sqlite":
        store.sql("UPDATE meta SET value = '99' WHERE key = 'schema'")
    else:
        store.sql("INSERT INTO schema_version VALUES (99, 0)")
    with pytest.raises(StoreTooNew) as exc:
        store.open()
    line = str(exc.value)
    assert "\n" not in line and "has schema version 99, newer than the" in line and "this RM reads" in line
    assert "run that gpurm version (or newer)" in line


def test_reopening_keeps_the_schema_and_the_records(store: Opened) -> None:
    for _ in range(3):                       # migrations run at every open: applied once, idempotent after
        store.open().save([job(len(store.opened))], [], [], {})
    assert [j.job_id for j in store.open().load().jobs] == ["job-1", "job-2", "job-3"]


# ---------------------------------------------------------------- PostgreSQL only

def test_a_second_rm_on_the_same_database_is_refused(pg_url: str, tmp_path: Path) -> None:
    first = open_store(pg_url, tmp_path, exclusive=True)
    try:
        with pytest.raises(StoreWriteError, match="is in use by another RM"):
            open_store(pg_url, tmp_path, exclusive=True)
        open_store(pg_url, tmp_path).close()        # a reader (`gpurm admin store check`) is not an RM
    finally:
        first.close()
    open_store(pg_url, tmp_path, exclusive=True).close()    # the lock left with its session


def test_the_password_is_never_shown(pg_url: str, tmp_path: Path) -> None:
    url = pg_url.replace("gpurm_test@", "gpurm_test:s3cret@")        # trust auth: the server ignores it
    s = open_store(url, tmp_path)
    try:
        assert "s3cret" not in s.where and "s3cret" not in s.remedy and "127.0.0.1" in s.where
    finally:
        s.close()
    with pytest.raises(StoreWriteError) as exc:
        open_store(f"postgresql://gpurm_test:s3cret@127.0.0.1:{free_port()}/x", tmp_path)
    assert "s3cret" not in str(exc.value) and "cannot be opened" in str(exc.value)


def test_backup_and_restore_drill(pg_url: str, tmp_path: Path) -> None:
    from gpurm.rm.storage.admin import StoreAdminError, backup_url, check_url, restore_url

    s = open_store(pg_url, tmp_path)
    s.save([job(1), job(2)], [], [], {"next_job_seq": "3"})
    dump = backup_url(pg_url, tmp_path / "rm.pgdump")
    assert dump.stat().st_mode & 0o077 == 0
    with pytest.raises(StoreAdminError, match="exists"):
        backup_url(pg_url, dump)
    s.save([job(3)], [], [], {"next_job_seq": "4"})
    s.close()
    rm = open_store(pg_url, tmp_path, exclusive=True)         # a running RM holds the store: restore refuses
    with pytest.raises(StoreAdminError, match="stop the RM before restoring"):
        restore_url(pg_url, dump)
    rm.close()
    restore_url(pg_url, dump)
    again = open_store(pg_url, tmp_path)
    snap = again.load()
    again.close()
    assert [j.job_id for j in snap.jobs] == ["job-1", "job-2"] and snap.meta["next_job_seq"] == "3"
    assert check_url(pg_url).damage == [] and check_url(pg_url).jobs == 2
    (tmp_path / "junk").write_text("not a dump")
    with pytest.raises(StoreAdminError, match="pg_dump --format=custom file"):
        restore_url(pg_url, tmp_path / "junk")


def test_the_cli_checks_backs_up_and_restores_by_url(pg_url: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.integration.harness import ROOT

    def gpurm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpurm.cli.main", "admin", "store", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)

    s = open_store(pg_url, tmp_path)
    s.save([job(1)], [], [], {})
    s.close()
    done = gpurm("check", "--url", pg_url)
    assert done.returncode == 0 and "1 jobs, 0 containers, 0 nodes" in done.stdout
    assert "every record reads" in done.stdout
    assert gpurm("backup", "--url", pg_url).returncode == 2               # --to is required
    dump = tmp_path / "rm.pgdump"
    assert gpurm("backup", "--url", pg_url, "--to", str(dump)).returncode == 0 and dump.stat().st_size > 0
    done = gpurm("restore", "--url", pg_url, str(dump))
    assert done.returncode == 0, done.stderr
    done = gpurm("check", "--url", "mysql://x@y/z")
    assert done.returncode == 2 and "--url: scheme 'mysql'" in done.stderr
    assert gpurm("check", "--url", pg_url, "--state-dir", str(tmp_path)).returncode == 2     # one or the other


def test_a_dropped_connection_fails_one_write_then_the_store_reconnects(pg_url: str, tmp_path: Path) -> None:
    import psycopg

    s = open_store(pg_url, tmp_path, exclusive=True)
    try:
        s.save([job(1)], [], [], {})
        with psycopg.connect(pg_url, autocommit=True) as admin:     # the server drops the RM's sessions
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                          "'gpurm-rm' AND pid <> pg_backend_pid()")
        with pytest.raises(StoreWriteError):
            s.save([job(2)], [], [], {})
        s.save([job(3)], [], [], {})                                 # a new session, the RM's lock taken again
        assert [j.job_id for j in s.load().jobs] == ["job-1", "job-3"]
        with pytest.raises(StoreWriteError, match=r"is in use by another RM \(server pid \d+"):
            open_store(pg_url, tmp_path, exclusive=True)
    finally:
        s.close()


def test_a_server_without_synchronous_commit_still_gets_durable_commits(pg_url: str, tmp_path: Path) -> None:
    import psycopg

    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} SET synchronous_commit = off".encode())
    s = open_store(pg_url, tmp_path)
    try:
        row = s._db.execute("SHOW synchronous_commit").fetchone()   # type: ignore[attr-defined]
        assert row is not None and row[0] == "on"
    finally:
        s.close()
