"""Retention of finished jobs (rm/state/retention.py, rm/storage/retired.py): the pure policy on an injected clock, the
store's
tables, accounting totals across retirement, the RM shell's pass and its on-demand reads, rm.yaml settings."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpurm.common.fields import ConfigError
from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Attempt, Container, ContainerKind, ContainerPhase, Job, JobState
from gpurm.rm.accounting import Query, aggregate, with_retired
from gpurm.rm.config import RMConfig, load_rm_config
from gpurm.rm.sched.history import Finished
from gpurm.rm.state.cluster import Node
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ContainerReport, ErrorCode, NodeRegistration, RequestError
from gpurm.rm.state.retention import NEVER, Retention, RetentionSettings
from gpurm.rm.storage.store import SCHEMA_VERSION, SqliteStore

H = 3600.0
T0 = 1_800_000_000.0


def finished_job(n: int, finish: float, state: JobState = JobState.SUCCEEDED, user: str = "alice",
                 gpus: int = 2, submit_id: str = "") -> Job:
    return Job(f"job-{n}", JobSpec(gpus=gpus, command=["train"]), user, "root.default", finish - 600, seq=n,
               state=state, start_time=finish - 500, finish_time=finish, submit_id=submit_id,
               attained_gpu_s=gpus * 500.0)


def learner(job: Job, k: int, live: bool = False) -> Container:
    return Container(f"{job.job_id}-c{k}", job.job_id, ContainerKind.LEARNER, "n1", [0, 1], 1,
                     created=job.start_time, phase=ContainerPhase.RUNNING if live else ContainerPhase.COMPLETED,
                     started=job.start_time, finished=0.0 if live else job.finish_time)


def core_with(jobs: list[Job], containers: list[Container]) -> RMCore:
    core = RMCore()
    node = Node("n1", "127.0.0.1", 9000, "r1", "r1", {i: GpuRecord(i) for i in range(8)})
    core.restore(jobs, containers, [node], {"next_job_seq": str(len(jobs) + 1)}, T0)
    return core


def retire(ret: Retention, core: RMCore, now: float) -> list[str]:
    p = ret.plan(core, now)
    ret.apply(core, p)
    return [r.job.job_id for r in p.retired]


# ---------------------------------------------------------------- the policy, on an injected clock

def test_jobs_leave_memory_in_finish_order_once_past_the_memory_retention() -> None:
    jobs = [finished_job(1, T0 + 300), finished_job(2, T0 + 100), finished_job(3, T0 + 200)]
    core = core_with(jobs, [learner(j, 1) for j in jobs])
    ret = Retention(RetentionSettings(memory_s=H, store_s=NEVER))
    assert retire(ret, core, T0 + H + 99) == []
    assert retire(ret, core, T0 + H + 100) == ["job-2"]
    assert set(core.jobs) == {"job-1", "job-3"}
    assert retire(ret, core, T0 + H + 1000) == ["job-3", "job-1"]
    assert core.jobs == {} and core.containers == {} and dict(core.by_job) == {}


def test_a_pass_retires_at_most_a_batch_and_unfinished_jobs_never() -> None:
    jobs = [finished_job(n, T0 + n) for n in range(1, 8)]
    running = Job("job-99", JobSpec(gpus=1, command=["x"]), "bob", "root.default", T0, seq=99,
                  state=JobState.RUNNING)
    core = core_with([*jobs, running], [])
    ret = Retention(RetentionSettings(memory_s=60.0, store_s=NEVER, batch=3))
    assert retire(ret, core, T0 + 10 * H) == ["job-1", "job-2", "job-3"]
    assert retire(ret, core, T0 + 10 * H) == ["job-4", "job-5", "job-6"]
    assert retire(ret, core, T0 + 10 * H) == ["job-7"]
    assert list(core.jobs) == ["job-99"]


def test_a_job_with_a_live_container_waits_until_it_ends() -> None:
    a, b = finished_job(1, T0), finished_job(2, T0 + 1)
    stuck = learner(a, 1, live=True)          # on a node that went silent: its end is not known yet
    core = core_with([a, b], [stuck, learner(b, 1)])
    ret = Retention(RetentionSettings(memory_s=60.0, store_s=NEVER))
    assert retire(ret, core, T0 + H) == ["job-2"]
    assert retire(ret, core, T0 + H + 1) == []
    core.index.unindex_live(stuck)
    stuck.phase = ContainerPhase.COMPLETED
    assert retire(ret, core, T0 + H + 2) == ["job-1"]


def test_a_job_killed_through_the_core_leaves_once_its_am_reported_its_end() -> None:
    core = RMCore()
    core.register_node(NodeRegistration("n1", "127.0.0.1", 9000, "r1", "r1", [GpuRecord(i) for i in range(4)]),
                       "s1", T0)
    ret = Retention(RetentionSettings(memory_s=60.0, store_s=NEVER))
    ret.follow(core)
    job = core.submit(JobSpec(gpus=1, command=["x"]), "alice", T0, submit_id="s-1")
    ret.note(job)                                   # not finished: not a candidate
    am = core.containers[job.am_container]
    core.kill(job.job_id, "alice", "", T0 + 5)
    ret.note(job)
    assert core.take_stops("n1", T0 + 5) and am.container_id in core.stop_orders.sent
    assert retire(ret, core, T0 + 65) == []        # its AM container has not ended yet
    core.node_heartbeat("n1", "s1", [ContainerReport(am.container_id, "EXITED", stopped=True, job_id=job.job_id)],
                        T0 + 66)
    assert not am.phase.live
    assert retire(ret, core, T0 + 67) == [job.job_id]
    assert core.jobs == {} and core.containers == {} and core.submit_ids == {}
    assert am.container_id not in core.stop_orders.sent and not core.live


def test_memory_never_keeps_finished_jobs_for_good() -> None:
    off = Retention(RetentionSettings(memory_s=NEVER, store_s=NEVER))
    core = core_with([finished_job(1, T0)], [])
    assert retire(off, core, T0 + 1000 * 86400) == [] and list(core.jobs) == ["job-1"]


def test_leaving_memory_forgets_every_index_but_not_the_queue_book_or_the_history() -> None:
    jobs = [finished_job(n, T0 + n, submit_id=f"sub-{n}") for n in range(1, 61)]
    live = Job("job-100", JobSpec(gpus=4, command=["x"]), "bob", "root.default", T0, seq=100,
               state=JobState.QUEUED)
    core = core_with([*jobs, live], [learner(j, 1) for j in jobs])
    demand, used = dict(core.queues.demand), dict(core.queues.used)
    sizes = list(core.history.sizes())
    assert len(sizes) == 60 and core.history.ready
    ret = Retention(RetentionSettings(memory_s=60.0, store_s=NEVER))
    assert len(retire(ret, core, T0 + H)) == 60
    assert list(core.jobs) == ["job-100"] and core.containers == {} and dict(core.by_job) == {}
    assert core.submit_ids == {}
    assert dict(core.queues.demand) == demand and dict(core.queues.used) == used
    assert list(core.history.sizes()) == sizes and core.history.ready
    # A re-submit with a retired job's submit id is a new job (dedupe lasts the memory retention).
    again = core.submit(JobSpec(gpus=1, command=["x"]), "alice", T0 + H, submit_id="sub-1")
    assert again.job_id == "job-62" and core.submit_ids == {"sub-1": "job-62"}


# ---------------------------------------------------------------- the store

def shell_core_and_store(tmp_path: Path, n: int = 6) -> tuple[SqliteStore, RMCore, list[Job], list[Container]]:
    store = SqliteStore(tmp_path / "state.db")
    jobs = [finished_job(k, T0 + k * 60, JobState.KILLED if k % 3 == 0 else JobState.SUCCEEDED,
                         user="alice" if k % 2 else "bob") for k in range(1, n + 1)]
    containers = [learner(j, 1) for j in jobs] + [learner(j, 2) for j in jobs[:2]]
    store.save(jobs, containers, [], {"next_job_seq": str(n + 1)})
    snap = store.load()
    core = RMCore()
    core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, T0, snap.learned)
    return store, core, jobs, containers


def test_retired_jobs_leave_the_loaded_tables_keep_a_row_and_their_detail_until_the_store_retention(
        tmp_path: Path) -> None:
    store, core, jobs, _ = shell_core_and_store(tmp_path)
    ret = Retention(RetentionSettings(memory_s=H, store_s=2 * H))
    p = ret.plan(core, T0 + 4 * 60 + H)              # jobs 1-4 finished an hour ago
    assert [r.job.job_id for r in p.retired] == ["job-1", "job-2", "job-3", "job-4"]
    assert store.retire(p.retired, p.purge_before, 100) == 0
    ret.apply(core, p)
    snap = SqliteStore(tmp_path / "state.db").load()
    assert [j.job_id for j in snap.jobs] == ["job-5", "job-6"]
    assert {c.job_id for c in snap.containers} == {"job-5", "job-6"}
    # Jobs 1, 2 and 4 ended on their own (3 was killed): what the history learned of them, who and how big.
    assert [r.size_gpu_s for r in snap.learned] == [1000.0, 1000.0, 1000.0]
    assert [(r.queue, r.user, r.gpus) for r in snap.learned] == \
        [(j.queue, j.user, j.spec.gpu_amount) for j in (jobs[0], jobs[1], jobs[3])]
    restarted = RMCore()                                   # the history relearns all four, retired ones first
    restarted.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, T0 + 2 * H, snap.learned)
    assert list(restarted.history.sizes()) == list(core.history.sizes()) == [1000.0] * 4   # jobs 1, 2, 4 and 5
    job, cs = store.load_retired("job-1") or (None, [])
    assert job == jobs[0] and sorted(c.container_id for c in cs) == ["job-1-c1", "job-1-c2"]
    # Past the store retention the detail goes; the accounting row stays.
    p = ret.plan(core, T0 + 3 * 60 + 2 * H)
    assert [r.job.job_id for r in p.retired] == ["job-5", "job-6"] and p.purge_before == T0 + 3 * 60
    assert store.retire(p.retired, p.purge_before, 100) == 2           # jobs 1 and 2 (finished before job 3)
    ret.apply(core, p)
    assert store.load_retired("job-1") is None and store.load_retired("job-3") is not None
    row = store.finished_row("job-1")
    assert row is not None and row.state == "SUCCEEDED" and row.gpu_s == pytest.approx(2 * 2 * 500)
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM containers").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM retired").fetchone()[0] == 4
    assert db.execute("SELECT COUNT(*) FROM finished").fetchone()[0] == 6
    assert SqliteStore(tmp_path / "state.db").load().jobs == []
    store.close()


def test_a_schema_1_store_is_migrated_and_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path)
    store.save([finished_job(1, T0)], [], [], {"next_job_seq": "2"})
    store.close()
    db = sqlite3.connect(path)                 # as an RM of schema 1 left it: no retention tables
    db.execute("DROP TABLE finished")
    db.execute("DROP TABLE retired")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    db.commit()
    db.close()
    again = SqliteStore(path)
    snap = again.load()
    assert [j.job_id for j in snap.jobs] == ["job-1"] and snap.meta["schema"] == SCHEMA_VERSION == "3"
    assert again.finished_usages() == []
    again.close()


def test_a_schema_2_store_gets_the_name_column_and_keeps_what_the_history_learned(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)                 # as an RM of schema 2 left it: `finished` without job names
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('schema', '2')")
    db.execute("CREATE TABLE finished (job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, user TEXT NOT NULL, "
               "queue TEXT NOT NULL, state TEXT NOT NULL, submit REAL NOT NULL, finish REAL NOT NULL, "
               "gpus REAL NOT NULL, gpu_s REAL NOT NULL, wait_s REAL, preemptions INTEGER NOT NULL, "
               "attempts INTEGER NOT NULL, size REAL)")
    db.execute("INSERT INTO finished VALUES ('job-1', 1, 'ann', 'nlp', 'SUCCEEDED', 0, 10, 4, 40, 0, 0, 1, 40)")
    db.commit()
    db.close()
    store = SqliteStore(path)
    snap = store.load()
    assert snap.meta["schema"] == "3"
    assert snap.learned == [Finished("root.nlp", "ann", "", 4.0, 40.0)]
    store.close()


def test_accounting_totals_are_the_same_before_and_after_retirement(tmp_path: Path) -> None:
    store, core, _, _ = shell_core_and_store(tmp_path, n=9)
    query = Query(by=("user",))

    def totals() -> list[dict[str, object]]:
        records = with_retired(core.jobs, core.containers.values(), store.finished_usages())
        return [r.as_dict() for r in aggregate(records, query)]

    before = totals()
    assert sum(int(str(r["jobs"])) for r in before) == 9
    ret = Retention(RetentionSettings(memory_s=H, store_s=H))
    p = ret.plan(core, T0 + 5 * 60 + H)
    store.retire(p.retired, p.purge_before, 100)
    ret.apply(core, p)
    assert len(core.jobs) == 4 and totals() == before
    p = ret.plan(core, T0 + 100 * H)                 # everything retired, and every detail purged
    store.retire(p.retired, p.purge_before, 100)
    ret.apply(core, p)
    assert core.jobs == {} and store.load_retired("job-9") is None and totals() == before
    # A window selects the rows by finish time, as it does records in memory.
    window = store.finished_usages(since=T0 + 2 * 60, until=T0 + 4 * 60)
    assert sorted(u.job_id for u in window) == ["job-2", "job-3"]
    store.close()


# ---------------------------------------------------------------- the RM shell: the pass, GetJob from the store

def make_shell(tmp_path: Path, memory_s: float = H, store_s: float = 2 * H) -> Any:
    from gpurm.rm.server.daemon import RMShell

    cfg = RMConfig(state_dir=tmp_path / "rm")
    cfg.retention = RetentionSettings(memory_s=memory_s, store_s=store_s)
    return RMShell(cfg)


async def test_the_shell_retires_finished_jobs_and_still_answers_for_them_from_the_store(tmp_path: Path) -> None:
    shell = make_shell(tmp_path)
    jobs = [finished_job(1, T0), finished_job(2, T0 + 10 * H)]
    shell.store.save(jobs, [learner(j, 1) for j in jobs], [], {})
    snap = shell.store.load()
    shell.core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, T0, snap.learned)
    shell.usage["job-1-c1"] = "util 90%"

    class Published:
        retained: dict[str, bytes] = {}

        def publish_retained(self, topic: str, payload: bytes) -> None:
            self.retained[topic] = payload

    shell.publisher = Published()
    assert await shell.retire_finished(T0 + H + 1) == 1
    assert "job-1" not in shell.core.jobs and "job-1-c1" not in shell.usage
    assert shell.publisher.retained == {"gpurm/jobs/job-1": b""}     # an empty retained payload clears the topic
    found = shell.find_job("job-1")                 # between the limits: read from the store
    assert found.job_id == "job-1" and found.state is JobState.SUCCEEDED
    assert shell.job_pb(found).job_id == "job-1"
    job, containers = shell.job_records("job-1")    # what `gpurm logs` needs to find the log on its node
    assert job.job_id == "job-1" and list(containers) == ["job-1-c1"] and containers["job-1-c1"].node_id == "n1"
    await shell.retire_finished(T0 + 3 * H)               # its detail leaves the store
    with pytest.raises(RequestError) as err:
        shell.find_job("job-1")
    assert err.value.code is ErrorCode.NOT_FOUND
    assert "job-1 finished (SUCCEEDED)" in err.value.message and "gpurm acct" in err.value.message
    with pytest.raises(RequestError, match="no job 'job-77'"):
        shell.find_job("job-77")
    shell.persist.close()


async def test_the_preemption_and_retry_counters_never_drop_when_jobs_leave_memory(tmp_path: Path) -> None:
    from tests.unit.test_metrics import samples

    shell = make_shell(tmp_path)
    job = finished_job(1, T0)
    job.preemptions = 2
    job.attempts = [Attempt(k, JobState.FAILED) for k in range(1, 5)]      # 2 preempted, 1 retried, the last
    shell.store.save([job], [], [], {})
    shell.core.restore([job], [], [], {}, T0)
    key = (("queue", "root.default"),)

    def counters() -> tuple[float, float]:
        got = samples(shell.metrics.render())
        return got[("gpurm_preemptions_total", key)], got[("gpurm_retries_total", key)]

    assert counters() == (2, 1)
    assert await shell.retire_finished(T0 + 2 * H) == 1
    assert counters() == (2, 1)
    assert make_shell(tmp_path).store.retired_counts() == {"root.default": (2, 1)}    # what a restart starts from
    shell.persist.close()


async def test_a_refused_retirement_write_keeps_the_jobs_in_memory(tmp_path: Path) -> None:
    from gpurm.rm.storage.store import StoreWriteError

    shell = make_shell(tmp_path)
    shell.core.restore([finished_job(1, T0)], [], [], {}, T0)

    def refuse(*args: object) -> int:
        raise StoreWriteError("disk full")

    shell.store.retire = refuse
    assert await shell.retire_finished(T0 + 2 * H) == 0 and "job-1" in shell.core.jobs
    del shell.store.retire
    assert await shell.retire_finished(T0 + 2 * H) == 1 and "job-1" not in shell.core.jobs
    shell.persist.close()


# ---------------------------------------------------------------- rm.yaml

def test_retention_settings_are_read_and_checked(tmp_path: Path) -> None:
    cfg = load_rm_config(None, {"retention": {"memory": "2h", "store": "90d"}})
    assert cfg.retention.memory_s == 2 * H and cfg.retention.store_s == 90 * 86400
    assert load_rm_config(None, {"retention": {"memory": "never", "store": "never"}}).retention.enabled is False
    assert load_rm_config(None).retention.memory_s == H
    with pytest.raises(ConfigError, match=r"retention\.store"):
        load_rm_config(None, {"retention": {"memory": "2d", "store": "1d"}})
    with pytest.raises(ConfigError, match=r"retention\.memory"):
        load_rm_config(None, {"retention": {"memory": "5s"}})
    with pytest.raises(ConfigError, match=r"retention\.keep"):
        load_rm_config(None, {"retention": {"keep": "1d"}})
