"""The RM's state store. Everything the RM acknowledges is written here first.

`SqliteStore` keeps jobs, containers, nodes and counters in one SQLite file in WAL mode with
`synchronous=FULL`: a commit has reached the disk when `save` returns, so a record acknowledged to a client
survives a `kill -9` of the RM (and a power cut). `MemoryStore` is for the simulator and unit tests.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpurm.common.gpus import GpuRecord
from gpurm.common.model import Attempt, Container, Job, Learner
from gpurm.rm.accounting import JobUsage
from gpurm.rm.sched.history import Finished
from gpurm.rm.state.cluster import Node
from gpurm.rm.storage import retired
from gpurm.rm.storage.records import FieldTypes, RecordError, from_dict, to_dict

if TYPE_CHECKING:
    from gpurm.rm.state.retention import RetiredJob

BACKUPS = "backups"        # the folder of automatic backups, in the state dir

# The stored records' fields whose full types a compiled build erases (it keeps `list` for `list[Attempt]`): the
# reload needs them to rebuild nested records, int keys and tuples. tests/unit/test_store_field_types.py checks
# this table against the classes' annotations, so a new generic field cannot be forgotten here.
STORED_FIELD_TYPES: FieldTypes = {
    Job: {"attempts": list[Attempt], "am_registered": list[int]},
    Attempt: {"learners": list[Learner]},
    Learner: {"gpu_indices": list[int]},
    Container: {"gpu_indices": list[int]},
    Node: {"gpus": dict[int, GpuRecord], "allocated": dict[int, str], "shared": dict[int, dict[str, int]],
           "islands": list[list[int]],
           "unreachable_since": float | None, "images": set[str]},
    GpuRecord: {"links": list[tuple[int, int, int]]},
}


class StoreDamaged(Exception):
    """The store file, or a record in it, cannot be read. The message is one line: what, where, what to do."""


class StoreWriteError(Exception):
    """A write to the store did not reach the disk; nothing of it was committed."""


class StoreTooNew(StoreDamaged):
    """The store's schema is newer than this RM reads: a newer gpurm wrote it. Never opened, never migrated back."""


def too_new(where: str, found: int, reads: int) -> StoreTooNew:
    return StoreTooNew(f"the RM's store {where} has schema version {found}, newer than the {reads} this RM reads: "
                       f"a newer gpurm has used it; run that gpurm version (or newer), or restore a backup taken "
                       f"before the upgrade into a new store")


@dataclass
class Damage:
    """One unreadable thing in a store: `where` is `file`, or `TABLE KEY` for a record."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def recovery_hint(path: Path) -> str:
    state_dir = path.parent
    return (f"list what is damaged with `gpurm admin store check --state-dir {state_dir}`, then restore a backup "
            f"with `gpurm admin store restore --state-dir {state_dir} FILE` (automatic backups in "
            f"{state_dir / BACKUPS})")


@dataclass
class Rows:
    """Records serialised for the store: taken when a request ends, written later (the records change on)."""

    jobs: list[tuple[str, int, str, str]] = field(default_factory=list)
    containers: list[tuple[str, str, str, str]] = field(default_factory=list)
    nodes: list[tuple[str, str]] = field(default_factory=list)
    meta: list[tuple[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.containers or self.nodes or self.meta)


def rows(jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node], meta: dict[str, str]) -> Rows:
    """The records as the store keeps them (JSON), frozen now."""
    return Rows([(j.job_id, j.seq, j.state.name, json.dumps(to_dict(j))) for j in jobs],
                [(c.container_id, c.job_id, c.phase.name, json.dumps(to_dict(c))) for c in containers],
                [(n.node_id, json.dumps(to_dict(n))) for n in nodes], list(meta.items()))


def decode_record(record: type, data: str) -> object:
    """A stored record (JSON text) back into its dataclass; RecordError naming what is wrong."""
    try:
        raw = json.loads(data)
    except (ValueError, TypeError) as exc:
        raise RecordError(f"not JSON ({exc})") from None
    return from_dict(record, raw, STORED_FIELD_TYPES)


@dataclass
class Snapshot:
    jobs: list[Job] = field(default_factory=list)
    containers: list[Container] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)
    learned: list[Finished] = field(default_factory=list)   # what the history learned from retired jobs (finish order)


class Store(Protocol):
    def load(self) -> Snapshot: ...

    def save(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
             meta: dict[str, str]) -> None: ...

    def close(self) -> None: ...


class RMStore(Protocol):
    """What the RM needs of its durable store (SqliteStore, rm/storage/postgres.py's PostgresStore): the same semantics
    behind each (tests/integration/test_store_contract.py runs one set of assertions over both)."""

    where: str          # the store as messages name it: a path, or a URL without its password
    remedy: str         # what to do when a write fails (free disk space; check the database server)

    def load(self) -> Snapshot: ...

    def load_meta(self) -> dict[str, str]: ...

    def save(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
             meta: dict[str, str]) -> None: ...

    def write(self, batches: list[Rows]) -> None: ...

    def retire(self, jobs: Iterable[RetiredJob], purge_before: float | None, purge_limit: int) -> int: ...

    def load_retired(self, job_id: str) -> tuple[Job, list[Container]] | None: ...

    def finished_row(self, job_id: str) -> JobUsage | None: ...

    def finished_usages(self, since: float | None = None, until: float | None = None) -> list[JobUsage]: ...

    def retired_counts(self) -> dict[str, tuple[int, int]]: ...

    def check(self) -> list[Damage]: ...

    def counts(self) -> tuple[int, int, int]: ...

    def fence_with(self, holder: str, epoch: int) -> None: ...

    def close(self) -> None: ...


class MemoryStore:
    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, object]] = {}
        self._containers: dict[str, dict[str, object]] = {}
        self._nodes: dict[str, dict[str, object]] = {}
        self._meta: dict[str, str] = {}

    def load(self) -> Snapshot:
        return Snapshot([from_dict(Job, d, STORED_FIELD_TYPES) for d in self._jobs.values()],
                        [from_dict(Container, d, STORED_FIELD_TYPES) for d in self._containers.values()],
                        [from_dict(Node, d, STORED_FIELD_TYPES) for d in self._nodes.values()], dict(self._meta))

    def save(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
             meta: dict[str, str]) -> None:
        for j in jobs:
            self._jobs[j.job_id] = to_dict(j)
        for c in containers:
            self._containers[c.container_id] = to_dict(c)
        for n in nodes:
            self._nodes[n.node_id] = to_dict(n)
        self._meta.update(meta)

    def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL,
                                 data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS containers (container_id TEXT PRIMARY KEY, job_id TEXT NOT NULL,
                                       phase TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS containers_by_job ON containers (job_id);
""" + retired.SCHEMA
SCHEMA_VERSION = "3"          # 2: the retention tables (rm/storage/retired.py); 3: finished jobs' names (the history)
MIGRATES = ("1", "2")         # older stores are migrated on open (_migrate)


_RECORDS: tuple[tuple[str, str, type], ...] = (("jobs", "job_id", Job), ("containers", "container_id", Container),
                                               ("nodes", "node_id", Node))


_UPSERTS = (("jobs", "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?)"),
            ("containers", "INSERT OR REPLACE INTO containers VALUES (?, ?, ?, ?)"),
            ("nodes", "INSERT OR REPLACE INTO nodes VALUES (?, ?)"),
            ("meta", "INSERT OR REPLACE INTO meta VALUES (?, ?)"))


def _describe(exc: sqlite3.Error | OSError) -> str:
    return str(exc) or type(exc).__name__


class SqliteStore:
    def __init__(self, path: Path) -> None:
        """Open (or create) the store. StoreDamaged when the file is not a readable gpurm store."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.where = str(path)
        self.remedy = f"free space in {path.parent} (or fix the disk)"
        self._read_db: sqlite3.Connection | None = None
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None or row[0] in MIGRATES:      # new, or older: the new tables were just made
                if row is not None and row[0] == "2":
                    self._db.execute("ALTER TABLE finished ADD COLUMN name TEXT NOT NULL DEFAULT ''")
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
                row = None
        except sqlite3.DatabaseError as exc:
            self._db.close()
            if "locked" in str(exc) or "disk is full" in str(exc) or "readonly" in str(exc):
                raise StoreWriteError(f"the RM's store {path} cannot be opened: {_describe(exc)}") from None
            raise StoreDamaged(f"the RM's store {path} cannot be read ({_describe(exc)}); "
                               f"{recovery_hint(path)}") from None
        if row is not None and row[0] != SCHEMA_VERSION:
            self._db.close()
            if str(row[0]).isdigit() and int(row[0]) > int(SCHEMA_VERSION):
                raise too_new(str(path), int(row[0]), int(SCHEMA_VERSION))
            raise StoreDamaged(f"the RM's store {path} has schema {str(row[0])[:32]!r}, this RM reads "
                               f"{SCHEMA_VERSION} (written by another gpurm version?); {recovery_hint(path)}")

    # Retention (rm/state/retention.py): finished jobs leaving memory, their detail leaving the store
    # (rm/storage/retired.py).

    def retire(self, jobs: Iterable[RetiredJob], purge_before: float | None, purge_limit: int) -> int:
        """Move the jobs' records out of the tables loaded at start-up and write their accounting rows; delete
        the detail of jobs finished before `purge_before`. One transaction. Returns the details deleted."""
        try:
            return retired.retire(self._db, jobs, purge_before, purge_limit)
        except (sqlite3.Error, OSError) as exc:
            raise StoreWriteError(_describe(exc)) from exc

    def _reader(self) -> sqlite3.Connection:
        """A second connection for reads off the hot path (WAL: it sees what was committed), used from the event
        loop's thread only."""
        if self._read_db is None:
            self._read_db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        return self._read_db

    def load_retired(self, job_id: str) -> tuple[Job, list[Container]] | None:
        """A job that left memory, as stored (None: unknown, or its detail was purged). StoreDamaged if unreadable."""
        try:
            return retired.load_detail(self._reader(), job_id, STORED_FIELD_TYPES)
        except (RecordError, ValueError, TypeError, sqlite3.Error) as exc:
            raise StoreDamaged(f"the record of {job_id[:128]} in {self.path} cannot be read: {str(exc)[:200]}"
                               ) from None

    def finished_row(self, job_id: str) -> JobUsage | None:
        return retired.finished_row(self._reader(), job_id)

    def finished_usages(self, since: float | None = None, until: float | None = None) -> list[JobUsage]:
        """The accounting rows of jobs out of memory that finished in [since, until). Its own connection: callers
        run it in a worker thread (GetAccounting)."""
        db = sqlite3.connect(str(self.path), isolation_level=None)
        try:
            return retired.finished_usages(db, since, until)
        finally:
            db.close()

    def retired_counts(self) -> dict[str, tuple[int, int]]:
        """Per queue: (preemptions, retries) of the jobs out of memory."""
        return retired.retired_counts(self._db)

    def load_meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._db.execute("SELECT key, value FROM meta")}

    def _rows(self) -> Iterator[tuple[str, str, type, str]]:
        for table, key, cls in _RECORDS:
            order = " ORDER BY seq" if table == "jobs" else ""
            for record_key, data in self._db.execute(f"SELECT {key}, data FROM {table}{order}"):
                yield table, str(record_key), cls, data

    def load(self) -> Snapshot:
        """Every record. StoreDamaged naming the first record that cannot be read."""
        snap = Snapshot()
        lists: dict[str, list[Any]] = {"jobs": snap.jobs, "containers": snap.containers, "nodes": snap.nodes}
        try:
            for table, key, cls, data in self._rows():
                try:
                    lists[table].append(decode_record(cls, data))
                except RecordError as exc:
                    raise StoreDamaged(f"the RM's store {self.path} has a record it cannot read: {table} "
                                       f"{key[:128]}: {str(exc)[:300]}; {recovery_hint(self.path)}") from None
            snap.meta = self.load_meta()
            snap.learned = retired.learned_records(self._db)
        except sqlite3.DatabaseError as exc:
            raise StoreDamaged(f"the RM's store {self.path} cannot be read ({_describe(exc)}); "
                               f"{recovery_hint(self.path)}") from None
        return snap

    def check(self) -> list[Damage]:
        """Read every record; what cannot be read, each named (empty: the store is sound)."""
        out: list[Damage] = []
        try:
            row = self._db.execute("PRAGMA integrity_check").fetchone()
            if row is None or row[0] != "ok":
                out.append(Damage("file", f"SQLite integrity check: {row[0] if row else 'no answer'}"))
            for table, key, cls, data in self._rows():
                try:
                    decode_record(cls, data)
                except RecordError as exc:
                    out.append(Damage(f"{table} {key[:128]}", str(exc)[:300]))
            for k, v in self._db.execute("SELECT key, value FROM meta"):
                if k in ("next_job_seq", "next_container_seq") and not str(v).isdigit():
                    out.append(Damage(f"meta {k}", f"not a number: {str(v)[:32]!r}"))
        except sqlite3.DatabaseError as exc:
            out.append(Damage("file", _describe(exc)))
        return out

    def save(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
             meta: dict[str, str]) -> None:
        """Commit all of it or none of it. StoreWriteError when the disk refuses (full, read-only, I/O error):
        the transaction is rolled back and the error is never masked by the rollback's own."""
        self.write([rows(jobs, containers, nodes, meta)])

    def write(self, batches: list[Rows]) -> None:
        """Commit several requests' rows in one transaction (group commit: rm/storage/writer.py), in order: a later
        batch's version of a record wins. All or nothing, as `save`."""
        db = self._db
        # One statement per table for the whole group, in order (a later batch's row replaces an earlier one's):
        # every statement hands the GIL back and waits for it again, and the RM's busy event loop holds it.
        tables = [(sql, [row for b in batches for row in getattr(b, table)]) for table, sql in _UPSERTS]
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                for sql, values in tables:
                    if values:
                        db.executemany(sql, values)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:     # SQLite may have rolled back itself (e.g. on SQLITE_FULL)
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise
        except (sqlite3.Error, OSError) as exc:
            raise StoreWriteError(_describe(exc)) from exc

    def counts(self) -> tuple[int, int, int]:
        """How many jobs, containers and nodes the store holds (0 for a table that cannot be read)."""
        out = []
        for table in ("jobs", "containers", "nodes"):
            try:
                out.append(int(self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]))
            except sqlite3.Error:
                out.append(0)
        return out[0], out[1], out[2]

    def fence_with(self, holder: str, epoch: int) -> None:
        """Only a PostgreSQL store is shared by several RMs (rm/server/leadership.py); rm.yaml refuses `ha` here."""
        raise StoreWriteError("several RMs (rm.yaml ha:) need a PostgreSQL store")

    def backup(self, target: Path) -> None:
        """An online copy of the store (SQLite's backup API: consistent while the RM writes)."""
        dest = sqlite3.connect(str(target))
        try:
            self._db.backup(dest)
        finally:
            dest.close()

    def close(self) -> None:
        if self._read_db is not None:
            self._read_db.close()
        self._db.close()
