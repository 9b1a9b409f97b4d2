"""The RM's store in PostgreSQL (rm.yaml `store: {url: postgresql://USER@HOST:PORT/DBNAME}`).

The same contract as SqliteStore (rm/storage/store.py), so the RM, its group-commit writer (rm/storage/writer.py) and
the retention moves (rm/state/retention.py) cannot tell them apart: `write` commits several requests' rows in one
transaction, a later batch's row winning; a failed transaction rolls back whole and raises StoreWriteError; records are
JSON text, so `check` finds a record the RM cannot read exactly as it does in SQLite. A commit returns once PostgreSQL
has it durable (its `synchronous_commit`, on by default).

Connections: one for the writer thread (writes and retention moves, each in its own transaction), one for reads
from the event loop's thread (start-up load, a retired job's detail, accounting), each taken again after the
server dropped it. Every session has `idle_in_transaction_session_timeout` (SESSION_OPTIONS): a transaction whose
RM was cut off mid-write (its COMMIT never arrives) is rolled back by the server within seconds, so its locks
(the fence's FOR SHARE on the lease row, rm/server/leadership.py) never keep a standby from taking over for the
hours TCP takes to notice. The RM's own open (`exclusive=True`) holds a session advisory lock on the writer
connection for its whole life, so a second RM (or `gpurm admin store restore`) pointed at the same database is
refused at once.

Schema: `schema_version` holds one row per migration applied (MIGRATIONS, in order, each in one transaction
under an advisory lock, at every open); a database whose version is newer than SCHEMA_VERSION is refused with one
line (StoreTooNew), never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg

from gpurm.common.model import Container, Job
from gpurm.rm.accounting import JobUsage
from gpurm.rm.server.leadership import Fenced, fence
from gpurm.rm.storage import retired
from gpurm.rm.storage.records import RecordError, from_dict, to_dict
from gpurm.rm.storage.store import (
    _RECORDS,
    STORED_FIELD_TYPES,
    Damage,
    Rows,
    Snapshot,
    StoreDamaged,
    StoreWriteError,
    decode_record,
    too_new,
)
from gpurm.rm.storage.url import redact

if TYPE_CHECKING:
    from gpurm.rm.state.cluster import Node
    from gpurm.rm.state.retention import RetiredJob

log = logging.getLogger(__name__)

# pg_advisory locks: the RM's hold on the store (whole session), and migrations (one transaction).
RM_LOCK = 0x6770_726D_0001          # "gprm" 1
MIGRATE_LOCK = 0x6770_726D_0002
CONNECT_TIMEOUT_S = 10
# The RM's transactions never wait on the RM between statements: one idle for this long lost its RM (a cut
# network, a killed process) and is rolled back by the server, releasing its locks.
IDLE_IN_TRANSACTION_MS = 5000
SESSION_OPTIONS = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"

_V1 = """
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, state TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE containers (container_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, phase TEXT NOT NULL,
                         data TEXT NOT NULL);
CREATE INDEX containers_by_job ON containers (job_id);
CREATE TABLE nodes (node_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE finished (job_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, "user" TEXT NOT NULL, queue TEXT NOT NULL,
                       state TEXT NOT NULL, submit DOUBLE PRECISION NOT NULL, finish DOUBLE PRECISION NOT NULL,
                       gpus DOUBLE PRECISION NOT NULL, gpu_s DOUBLE PRECISION NOT NULL, wait_s DOUBLE PRECISION,
                       preemptions INTEGER NOT NULL, attempts INTEGER NOT NULL, size DOUBLE PRECISION);
CREATE INDEX finished_by_finish ON finished (finish);
CREATE TABLE retired (job_id TEXT PRIMARY KEY, finish DOUBLE PRECISION NOT NULL, job TEXT NOT NULL,
                      containers TEXT NOT NULL);
CREATE INDEX retired_by_finish ON retired (finish);
"""

# (version, SQL): applied in order to a database below that version. Append; never edit one that has shipped.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, _V1),
    (2, "ALTER TABLE finished ADD COLUMN name TEXT NOT NULL DEFAULT ''"),   # finished jobs' names (the history)
)
SCHEMA_VERSION = MIGRATIONS[-1][0]

_UPSERTS = (
    ("jobs", "INSERT INTO jobs VALUES (%s, %s, %s, %s) ON CONFLICT (job_id) DO UPDATE SET seq = EXCLUDED.seq, "
             "state = EXCLUDED.state, data = EXCLUDED.data"),
    ("containers", "INSERT INTO containers VALUES (%s, %s, %s, %s) ON CONFLICT (container_id) DO UPDATE SET "
                   "job_id = EXCLUDED.job_id, phase = EXCLUDED.phase, data = EXCLUDED.data"),
    ("nodes", "INSERT INTO nodes VALUES (%s, %s) ON CONFLICT (node_id) DO UPDATE SET data = EXCLUDED.data"),
    ("meta", "INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"),
)

# The records move inside PostgreSQL, as stored (see rm/storage/retired.py); the containers go as one JSON array.
_MOVE = ("INSERT INTO retired SELECT j.job_id, m.finish, j.data, "
         "(SELECT COALESCE(json_agg(c.data::json), '[]'::json)::text FROM containers c WHERE c.job_id = j.job_id) "
         "FROM jobs j JOIN unnest(%s::text[], %s::float8[]) AS m(job_id, finish) ON m.job_id = j.job_id "
         "ON CONFLICT (job_id) DO UPDATE SET finish = EXCLUDED.finish, job = EXCLUDED.job, "
         "containers = EXCLUDED.containers RETURNING job_id")
_UPSERT_RETIRED = ("INSERT INTO retired VALUES (%s, %s, %s, %s) ON CONFLICT (job_id) DO UPDATE SET "
                   "finish = EXCLUDED.finish, job = EXCLUDED.job, containers = EXCLUDED.containers")
_COLUMNS = 'job_id, "user", queue, state, submit, finish, gpu_s, wait_s, preemptions, attempts'


def _describe(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


class PostgresStore:
    def __init__(self, url: str, *, exclusive: bool = False) -> None:
        """Connect, migrate the schema to SCHEMA_VERSION, and (exclusive) take the RM's lock on the store.
        StoreWriteError when the server cannot be reached or another RM holds the store; StoreTooNew when a
        newer gpurm's schema is there."""
        self.url = url
        self.where = redact(url)
        self.remedy = f"check the PostgreSQL server of {self.where} (up, reachable, with space)"
        self.exclusive = exclusive
        self._fenced_by: tuple[str, int] | None = None     # (holder, epoch) of this RM's lead, with rm.yaml ha:
        self._read_lock = threading.Lock()
        self._read_db: psycopg.Connection[Any] | None = None
        self._db = self._connect()
        try:
            self._migrate(self._db)
            self._prepare_writer(self._db)
        except BaseException:
            self._db.close()
            raise

    # Connections.

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name="gpurm-rm", options=SESSION_OPTIONS)
        except psycopg.Error as exc:
            raise StoreWriteError(f"the RM's store {self.where} cannot be opened: {_describe(exc)}") from None

    def _lock(self, db: psycopg.Connection[Any]) -> None:
        row = db.execute("SELECT pg_try_advisory_lock(%s)", (RM_LOCK,)).fetchone()
        if not row or not row[0]:
            holder = db.execute(
                "SELECT a.pid, a.client_addr::text, a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND "
                "(l.classid::bigint << 32 | l.objid::bigint) = %s", (RM_LOCK,)).fetchone()
            who = f" (server pid {holder[0]}, from {holder[1] or 'a local socket'})" if holder else ""
            raise StoreWriteError(f"the RM's store {self.where} is in use by another RM{who}; stop it first, or "
                                  "give this RM its own database")

    def _prepare_writer(self, db: psycopg.Connection[Any]) -> None:
        """A commit is acknowledged only once durable: a server (or role) set to `synchronous_commit = off` is
        overridden for this session (a stricter setting, e.g. remote_apply, is kept). Then the RM's lock."""
        try:
            row = db.execute("SHOW synchronous_commit").fetchone()
            if row and str(row[0]) == "off":
                db.execute("SET synchronous_commit = on")
                log.info("%s: synchronous_commit is off on the server; on for the RM's writes", self.where)
        except psycopg.Error as exc:
            raise StoreWriteError(f"the RM's store {self.where} cannot be opened: {_describe(exc)}") from None
        if self.exclusive:
            self._lock(db)

    def _writer(self) -> psycopg.Connection[Any]:
        """The writer thread's connection, taken again (and the lock with it) after the server dropped it."""
        if self._db.closed or self._db.broken:
            self._db.close()
            db = self._connect()
            try:
                self._prepare_writer(db)
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _reader(self) -> psycopg.Connection[Any]:
        """The connection for reads (hold _read_lock)."""
        if self._read_db is None or self._read_db.closed or self._read_db.broken:
            if self._read_db is not None:
                self._read_db.close()
            self._read_db = self._connect()
        return self._read_db

    def _migrate(self, db: psycopg.Connection[Any]) -> None:
        try:
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
                db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, "
                           "applied DOUBLE PRECISION NOT NULL)")
                row = db.execute("SELECT max(version) FROM schema_version").fetchone()
                current = int(row[0]) if row and row[0] is not None else 0
                if current > SCHEMA_VERSION:
                    raise too_new(self.where, current, SCHEMA_VERSION)
                for version, sql in MIGRATIONS:
                    if version > current:
                        db.execute(sql.encode())
                        db.execute("INSERT INTO schema_version VALUES (%s, %s)", (version, time.time()))
        except psycopg.Error as exc:
            raise StoreDamaged(f"the RM's store {self.where} cannot be prepared (schema {SCHEMA_VERSION}): "
                               f"{_describe(exc)}") from None

    def schema_version(self) -> int:
        with self._read_lock:
            row = self._reader().execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    # Writes (the writer thread).

    def fence_with(self, holder: str, epoch: int) -> None:
        """From now on every write checks, in its transaction, that `epoch` still leads (rm/server/leadership.py)."""
        self._fenced_by = (holder, epoch)

    def _fence(self, cur: psycopg.Cursor[Any]) -> None:
        if self._fenced_by is not None:
            fence(cur, *self._fenced_by)

    def save(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
             meta: dict[str, str]) -> None:
        from gpurm.rm.storage.store import rows

        self.write([rows(jobs, containers, nodes, meta)])

    def write(self, batches: list[Rows]) -> None:
        """Commit several requests' rows in one transaction, in order (a later batch's row wins). All or nothing:
        StoreWriteError, with nothing committed, on any failure."""
        tables = []
        for table, sql in _UPSERTS:
            last: dict[str, tuple[Any, ...]] = {}
            for b in batches:
                for row in getattr(b, table):
                    last[row[0]] = row
            if last:
                tables.append((sql, list(last.values())))
        try:
            db = self._writer()
            with db.transaction(), db.cursor() as cur:
                self._fence(cur)
                for sql, values in tables:
                    cur.executemany(sql, values)
        except psycopg.Error as exc:
            raise StoreWriteError(_describe(exc)) from exc
        except Fenced as exc:
            raise StoreWriteError(str(exc)) from exc

    def retire(self, jobs: Iterable[RetiredJob], purge_before: float | None, purge_limit: int) -> int:
        """See SqliteStore.retire: one transaction; returns the details purged."""
        finished_rows = []
        by_id: dict[str, RetiredJob] = {}
        for r in jobs:
            u, j = r.usage, r.job
            by_id[j.job_id] = r
            finished_rows.append((j.job_id, j.seq, u.user, u.queue, u.state, u.submit_time, u.finish_time,
                                  j.spec.gpu_amount, u.gpu_s, u.wait_s, u.preemptions, u.attempts, r.size_gpu_s,
                                  j.spec.name))
        if not by_id and purge_before is None:
            return 0
        ids = list(by_id)
        try:
            db = self._writer()
            with db.transaction(), db.cursor() as cur:
                self._fence(cur)
                purged = 0
                if ids:
                    cur.execute("DELETE FROM finished WHERE job_id = ANY(%s)", (ids,))
                    cur.executemany(f"INSERT INTO finished ({retired.FINISHED_COLUMNS}) VALUES (%s, %s, %s, %s, %s, "
                                    "%s, %s, %s, %s, %s, %s, %s, %s, %s)", finished_rows)
                    cur.execute(_MOVE, (ids, [by_id[i].job.finish_time for i in ids]))
                    moved = {str(row[0]) for row in cur.fetchall()}
                    missing = [by_id[i] for i in ids if i not in moved]   # never stored (written elsewhere)
                    if missing:
                        cur.executemany(_UPSERT_RETIRED, [
                            (r.job.job_id, r.job.finish_time, json.dumps(to_dict(r.job)),
                             json.dumps([to_dict(c) for c in r.containers])) for r in missing])
                    cur.execute("DELETE FROM jobs WHERE job_id = ANY(%s)", (ids,))
                    cur.execute("DELETE FROM containers WHERE job_id = ANY(%s)", (ids,))
                if purge_before is not None:
                    cur.execute("DELETE FROM retired WHERE job_id IN (SELECT job_id FROM retired WHERE finish < %s "
                                "ORDER BY finish LIMIT %s)", (purge_before, purge_limit))
                    purged = cur.rowcount
            return purged
        except psycopg.Error as exc:
            raise StoreWriteError(_describe(exc)) from exc
        except Fenced as exc:
            raise StoreWriteError(str(exc)) from exc

    # Reads (the event loop's thread, or a worker thread: each under the reader's lock).

    def _query(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            return self._reader().execute(sql.encode(), args).fetchall()

    def load_retired(self, job_id: str) -> tuple[Job, list[Container]] | None:
        try:
            rows = self._query("SELECT job, containers FROM retired WHERE job_id = %s", (job_id,))
            if not rows:
                return None
            job = from_dict(Job, json.loads(rows[0][0]), STORED_FIELD_TYPES)
            return job, [from_dict(Container, d, STORED_FIELD_TYPES) for d in json.loads(rows[0][1])]
        except (RecordError, ValueError, TypeError, psycopg.Error) as exc:
            raise StoreDamaged(f"the record of {job_id[:128]} in {self.where} cannot be read: {str(exc)[:200]}"
                               ) from None

    def finished_row(self, job_id: str) -> JobUsage | None:
        rows = self._query(f"SELECT {_COLUMNS} FROM finished WHERE job_id = %s", (job_id,))
        return retired.usage_of(rows[0]) if rows else None

    def finished_usages(self, since: float | None = None, until: float | None = None) -> list[JobUsage]:
        sql, args = retired.finished_query(since, until, "%s", _COLUMNS)
        return [retired.usage_of(row) for row in self._query(sql, args)]

    def retired_counts(self) -> dict[str, tuple[int, int]]:
        rows = self._query("SELECT queue, SUM(preemptions), SUM(GREATEST(0, attempts - 1 - preemptions)) "
                           "FROM finished GROUP BY queue")
        return {f"root.{queue}" if queue != "root" else queue: (int(p), int(r)) for queue, p, r in rows}

    def load_meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._query("SELECT key, value FROM meta")}

    def _rows(self, db: psycopg.Connection[Any]) -> Iterator[tuple[str, str, type, str]]:
        for table, key, cls in _RECORDS:
            order = " ORDER BY seq" if table == "jobs" else ""
            for record_key, data in db.execute(f"SELECT {key}, data FROM {table}{order}".encode()).fetchall():
                yield table, str(record_key), cls, data

    @contextlib.contextmanager
    def _snapshot_read(self) -> Iterator[psycopg.Connection[Any]]:
        """The reader connection inside one read-only repeatable-read transaction (every table as of one
        moment), under the reader's lock."""
        with self._read_lock:
            db = self._reader()
            db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield db
            finally:
                if not db.closed and not db.broken:
                    db.execute("ROLLBACK")

    def load(self) -> Snapshot:
        """Every record, as of one moment. StoreDamaged naming the first record that cannot be read."""
        snap = Snapshot()
        lists: dict[str, list[Any]] = {"jobs": snap.jobs, "containers": snap.containers, "nodes": snap.nodes}
        try:
            with self._snapshot_read() as db:
                for table, key, cls, data in self._rows(db):
                    try:
                        lists[table].append(decode_record(cls, data))
                    except RecordError as exc:
                        raise StoreDamaged(f"the RM's store {self.where} has a record it cannot read: {table} "
                                           f"{key[:128]}: {str(exc)[:300]}; list what is damaged with `gpurm admin "
                                           f"store check --url URL`, then restore a backup (`gpurm admin store "
                                           f"restore --url URL FILE`)") from None
                snap.meta = {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta").fetchall()}
                snap.learned = [retired.learned_record(*row) for row in db.execute(retired.LEARNED_QUERY).fetchall()]
        except psycopg.Error as exc:
            raise StoreWriteError(f"the RM's store {self.where} cannot be read: {_describe(exc)}") from None
        return snap

    def check(self) -> list[Damage]:
        """Read every record; what cannot be read, each named (empty: the store is sound)."""
        out: list[Damage] = []
        try:
            with self._snapshot_read() as db:
                for table, key, cls, data in self._rows(db):
                    try:
                        decode_record(cls, data)
                    except RecordError as exc:
                        out.append(Damage(f"{table} {key[:128]}", str(exc)[:300]))
                for k, v in db.execute("SELECT key, value FROM meta").fetchall():
                    if k in ("next_job_seq", "next_container_seq") and not str(v).isdigit():
                        out.append(Damage(f"meta {k}", f"not a number: {str(v)[:32]!r}"))
        except psycopg.Error as exc:
            out.append(Damage("database", _describe(exc)))
        return out

    def counts(self) -> tuple[int, int, int]:
        rows = self._query("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM containers), "
                           "(SELECT count(*) FROM nodes)")
        return int(rows[0][0]), int(rows[0][1]), int(rows[0][2])

    def close(self) -> None:
        with self._read_lock:
            if self._read_db is not None:
                self._read_db.close()
        self._db.close()     # drops the RM's advisory lock with the session
