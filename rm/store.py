"""The RM's state store. Everything the RM acknowledges is written here first.

`SqliteStore` keeps jobs, containers, nodes and counters in one SQLite file in WAL mode with
`synchronous=FULL`: a commit has reached the disk when `save` returns, so a record acknowledged to a client
survives a `kill -9` of the RM (and a power cut). `MemoryStore` is for the simulator and unit tests.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpurm.rm.cluster import Node
from gpurm.rm.model import Container, Job
from gpurm.rm.records import from_dict, to_dict


@dataclass
class Snapshot:
    jobs: list[Job] = field(default_factory=list)
    containers: list[Container] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)


class Store(Protocol):
    def load(self) -> Snapshot: ...

    def save(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
             meta: dict[str, str]) -> None: ...

    def close(self) -> None: ...


class MemoryStore:
    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, object]] = {}
        self._containers: dict[str, dict[str, object]] = {}
        self._nodes: dict[str, dict[str, object]] = {}
        self._meta: dict[str, str] = {}

    def load(self) -> Snapshot:
        return Snapshot([from_dict(Job, d) for d in self._jobs.values()],
                        [from_dict(Container, d) for d in self._containers.values()],
                        [from_dict(Node, d) for d in self._nodes.values()], dict(self._meta))

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
"""
SCHEMA_VERSION = "1"


class SqliteStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise RuntimeError(f"state store {path} has schema {row[0]}, this RM reads {SCHEMA_VERSION}")

    def load(self) -> Snapshot:
        db = self._db
        return Snapshot(
            jobs=[from_dict(Job, json.loads(d)) for (d,) in db.execute("SELECT data FROM jobs ORDER BY seq")],
            containers=[from_dict(Container, json.loads(d)) for (d,) in db.execute("SELECT data FROM containers")],
            nodes=[from_dict(Node, json.loads(d)) for (d,) in db.execute("SELECT data FROM nodes")],
            meta={k: v for k, v in db.execute("SELECT key, value FROM meta")},
        )

    def save(self, jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node],
             meta: dict[str, str]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?)",
                           [(j.job_id, j.seq, j.state.name, json.dumps(to_dict(j))) for j in jobs])
            db.executemany("INSERT OR REPLACE INTO containers VALUES (?, ?, ?, ?)",
                           [(c.container_id, c.job_id, c.phase.name, json.dumps(to_dict(c))) for c in containers])
            db.executemany("INSERT OR REPLACE INTO nodes VALUES (?, ?)",
                           [(n.node_id, json.dumps(to_dict(n))) for n in nodes])
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(meta.items()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
