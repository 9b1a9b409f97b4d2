"""Group commit (rm/storage/writer.py) on a real SQLite file: batches queued together share a transaction, each
future completes only once its rows are on disk, and a failed transaction fails its batches and every batch behind
it until the writer is reset."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from gpurm.rm.storage.store import Rows, SqliteStore, StoreWriteError
from gpurm.rm.storage.writer import StoreWriter


def meta_rows(key: str, value: str) -> Rows:
    return Rows(meta=[(key, value)])


class GatedStore(SqliteStore):
    """A real store whose writes wait at a gate: batches queue up behind the one being written."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.writes: list[int] = []

    def write(self, batches: list[Rows]) -> None:
        self.entered.set()
        self.gate.wait(10)
        self.writes.append(len(batches))
        super().write(batches)


def test_batches_queued_during_a_commit_share_the_next_transaction_and_all_reach_the_disk(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "state.db")
    writer = StoreWriter(store)
    first = writer.commit(meta_rows("k0", "0"))
    assert store.entered.wait(10)            # the first transaction is under way, held at the gate
    rest = [writer.commit(meta_rows(f"k{i}", str(i))) for i in range(1, 51)]
    assert not first.done() and not any(f.done() for f in rest), "nothing is acknowledged before its commit"
    store.gate.set()
    for f in [first, *rest]:
        f.result(10)
    assert store.writes == [1, 50], "the 50 batches that waited went to disk in one transaction"
    writer.close()
    on_disk = dict(sqlite3.connect(tmp_path / "state.db").execute("SELECT key, value FROM meta"))
    assert all(on_disk[f"k{i}"] == str(i) for i in range(51))


def test_a_later_batch_of_the_same_transaction_wins(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "state.db")
    writer = StoreWriter(store)
    writer.commit(meta_rows("warm", "up"))
    assert store.entered.wait(10)
    a, b = writer.commit(meta_rows("k", "old")), writer.commit(meta_rows("k", "new"))
    store.gate.set()
    a.result(10), b.result(10)
    writer.close()
    assert store.load().meta["k"] == "new"


def test_a_failed_transaction_fails_its_batches_and_those_behind_until_reset(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "state.db")
    writer = StoreWriter(store)
    store._db.execute("PRAGMA query_only=1")          # the disk refuses
    failing = writer.commit(meta_rows("a", "1"))
    assert store.entered.wait(10)
    behind = writer.commit(meta_rows("b", "2"))
    store.gate.set()
    with pytest.raises(StoreWriteError, match="readonly"):
        failing.result(10)
    with pytest.raises(StoreWriteError):
        behind.result(10)
    store._db.execute("PRAGMA query_only=0")          # the disk works again, but nothing is taken before reset
    with pytest.raises(StoreWriteError):
        writer.commit(meta_rows("c", "3")).result(10)
    writer.reset()
    writer.commit(meta_rows("d", "4")).result(10)
    writer.close()
    meta = store.load().meta
    assert "d" in meta and not {"a", "b", "c"} & set(meta), "nothing of a failed or refused batch was written"


def test_a_call_runs_after_the_batches_before_it_and_its_failure_is_its_own(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "state.db")
    writer = StoreWriter(store)
    writer.commit(meta_rows("first", "1"))
    assert store.entered.wait(10)
    queued = writer.commit(meta_rows("second", "2"))
    seen = writer.call(lambda: store.load().meta.get("second"))       # e.g. retiring what was just saved

    def refuse() -> None:
        raise StoreWriteError("disk full")

    refused = writer.call(refuse)
    after = writer.commit(meta_rows("third", "3"))
    store.gate.set()
    queued.result(10)
    assert seen.result(10) == "2", "the call saw the batch queued before it"
    with pytest.raises(StoreWriteError, match="disk full"):
        refused.result(10)
    after.result(10)                                                   # batches go on after a failed call
    writer.close()
    assert store.load().meta["third"] == "3"


def test_a_request_that_went_away_does_not_stop_the_writer(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "state.db")
    writer = StoreWriter(store)
    writer.commit(meta_rows("first", "1"))
    assert store.entered.wait(10)
    gone = writer.commit(meta_rows("gone", "2"))
    assert gone.cancel(), "its awaiting request was cancelled (a client hung up)"
    store.gate.set()
    writer.commit(meta_rows("after", "3")).result(10)     # the writer lives on
    writer.close()
    meta = store.load().meta
    assert meta["gone"] == "2" and meta["after"] == "3", "the cancelled batch was written all the same"
