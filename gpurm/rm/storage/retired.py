"""The store's tables for retention (rm/state/retention.py), and the SQL over them. SqliteStore calls these.

- `finished`: one compact accounting row per job that left the RM's memory (what `gpurm acct` sums, and the size
  gittins learned from it), kept for good.
- `retired`: the full records (job, containers) of jobs that left memory, as JSON, until the store retention
  deletes them. Never read at start-up: the RM loads only the `jobs` and `containers` tables, which hold
  exactly the jobs in memory, so a restart costs what is retained in memory, not what the cluster ever ran.

A retired job's rows leave `jobs` / `containers` and its rows enter `finished` / `retired` in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpurm.common.model import Container, Job
from gpurm.rm.accounting import JobUsage
from gpurm.rm.sched.history import Finished
from gpurm.rm.storage.records import FieldTypes, from_dict, to_dict

if TYPE_CHECKING:
    from gpurm.rm.state.retention import RetiredJob

SCHEMA = """
CREATE TABLE IF NOT EXISTS finished (job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, user TEXT NOT NULL,
                                     queue TEXT NOT NULL, state TEXT NOT NULL, submit REAL NOT NULL,
                                     finish REAL NOT NULL, gpus REAL NOT NULL, gpu_s REAL NOT NULL, wait_s REAL,
                                     preemptions INTEGER NOT NULL, attempts INTEGER NOT NULL, size REAL,
                                     name TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS finished_by_finish ON finished (finish);
CREATE TABLE IF NOT EXISTS retired (job_id TEXT PRIMARY KEY, finish REAL NOT NULL, job TEXT NOT NULL,
                                    containers TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS retired_by_finish ON retired (finish);
"""

_COLUMNS = "job_id, user, queue, state, submit, finish, gpu_s, wait_s, preemptions, attempts"
# Every column of `finished`, in the order the rows are written (name came last, in schema 3).
FINISHED_COLUMNS = ("job_id, seq, \"user\", queue, state, submit, finish, gpus, gpu_s, wait_s, preemptions, attempts, "
                    "size, name")


# The records move inside SQLite, as stored (the shell commits every change before a retention pass), so a pass
# costs no Python serialisation; the containers go as one JSON array.
_MOVE = ("INSERT OR REPLACE INTO retired SELECT job_id, ?, data, "
         "(SELECT COALESCE(json_group_array(json(c.data)), '[]') FROM containers c WHERE c.job_id = jobs.job_id) "
         "FROM jobs WHERE job_id = ?")


def retire(db: sqlite3.Connection, jobs: Iterable[RetiredJob], purge_before: float | None, purge_limit: int) -> int:
    """See SqliteStore.retire. Rolls back (and raises) on any error."""
    finished_rows = []
    moves = []
    ids = []
    by_id = {}
    for r in jobs:
        u, j = r.usage, r.job
        ids.append((j.job_id,))
        by_id[j.job_id] = r
        moves.append((j.finish_time, j.job_id))
        finished_rows.append((j.job_id, j.seq, u.user, u.queue, u.state, u.submit_time, u.finish_time,
                              j.spec.gpu_amount, u.gpu_s, u.wait_s, u.preemptions, u.attempts, r.size_gpu_s,
                              j.spec.name))
    if not ids and purge_before is None:
        return 0
    db.execute("BEGIN IMMEDIATE")
    try:
        db.executemany(f"INSERT OR REPLACE INTO finished ({FINISHED_COLUMNS}) VALUES "
                       "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       finished_rows)
        for finish, job_id in moves:
            if db.execute(_MOVE, (finish, job_id)).rowcount == 0:    # never stored (a record written elsewhere)
                r = by_id[job_id]
                db.execute("INSERT OR REPLACE INTO retired VALUES (?, ?, ?, ?)",
                           (job_id, finish, json.dumps(to_dict(r.job)), json.dumps([to_dict(c) for c in r.containers])))
        db.executemany("DELETE FROM jobs WHERE job_id = ?", ids)
        db.executemany("DELETE FROM containers WHERE job_id = ?", ids)
        purged = 0
        if purge_before is not None:
            purged = db.execute("DELETE FROM retired WHERE job_id IN (SELECT job_id FROM retired WHERE finish < ? "
                                "ORDER BY finish LIMIT ?)", (purge_before, purge_limit)).rowcount
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        raise
    return purged


def load_detail(db: sqlite3.Connection, job_id: str, types: FieldTypes) -> tuple[Job, list[Container]] | None:
    row = db.execute("SELECT job, containers FROM retired WHERE job_id = ?", (job_id,)).fetchone()
    if row is None:
        return None
    job = from_dict(Job, json.loads(row[0]), types)
    return job, [from_dict(Container, d, types) for d in json.loads(row[1])]


def usage_of(row: tuple[object, ...]) -> JobUsage:
    job_id, user, queue, state, submit, finish, gpu_s, wait_s, preemptions, attempts = row
    return JobUsage(job_id=str(job_id), user=str(user), queue=str(queue), state=str(state),
                    submit_time=float(submit), finish_time=float(finish),   # type: ignore[arg-type]
                    gpu_s=float(gpu_s), wait_s=None if wait_s is None else float(wait_s),  # type: ignore[arg-type]
                    preemptions=int(preemptions), attempts=int(attempts))  # type: ignore[call-overload]


def finished_row(db: sqlite3.Connection, job_id: str) -> JobUsage | None:
    row = db.execute(f"SELECT {_COLUMNS} FROM finished WHERE job_id = ?", (job_id,)).fetchone()
    return usage_of(row) if row is not None else None


def finished_query(since: float | None, until: float | None, mark: str = "?",
                   columns: str = _COLUMNS) -> tuple[str, list[float]]:
    """The SELECT of finished rows in [since, until), and its arguments, in a driver's dialect: `mark` its
    placeholder (SQLite `?`, psycopg `%s`), `columns` the column list as it must be spelled there."""
    where, args = [], []
    if since is not None:
        where.append(f"finish >= {mark}")
        args.append(since)
    if until is not None:
        where.append(f"finish < {mark}")
        args.append(until)
    return f"SELECT {columns} FROM finished" + (" WHERE " + " AND ".join(where) if where else ""), args


def finished_usages(db: sqlite3.Connection, since: float | None, until: float | None) -> list[JobUsage]:
    sql, args = finished_query(since, until)
    return [usage_of(row) for row in db.execute(sql, args)]


def retired_counts(db: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """Per queue path: the preemptions and retries of the jobs out of memory (rm/server/metrics.py's counters)."""
    rows = db.execute("SELECT queue, SUM(preemptions), SUM(MAX(0, attempts - 1 - preemptions)) FROM finished "
                      "GROUP BY queue")
    return {f"root.{queue}" if queue != "root" else queue: (int(p), int(r)) for queue, p, r in rows}


def learned_records(db: sqlite3.Connection) -> list[Finished]:
    """What the history learned from retired jobs, in finish order (it relearns them on every restore)."""
    return [learned_record(*row) for row in db.execute(LEARNED_QUERY)]


# The learned rows of `finished`, in finish order; read by both stores (the same columns).
LEARNED_QUERY = 'SELECT queue, "user", name, gpus, size FROM finished WHERE size IS NOT NULL ORDER BY finish, seq'


def learned_record(queue: str, user: str, name: str, gpus: float, size: float) -> Finished:
    """A `finished` row as the history learns it (the row keeps the queue's short path)."""
    return Finished(queue if queue == "root" or queue.startswith("root.") else f"root.{queue}", str(user),
                    str(name or ""), float(gpus), float(size))
