"""Fail closed on the store (rm/storage/persist.py): a refused write fails the request, rolls memory back to the disk
and
stops writes until the store works again. A real SQLite store made read-only (PRAGMA query_only) refuses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.queues.tree import default_tree
from gpurm.rm.state.core import ErrorCode, NodeRegistration, RequestError, RMCore, RMSettings
from gpurm.rm.storage.persist import Persister, rebuild_core
from gpurm.rm.storage.store import SqliteStore, StoreWriteError, rows


def registered_core() -> RMCore:
    core = RMCore(RMSettings(), default_tree())
    core.register_node(NodeRegistration(node_id="n1", host="h", port=1, rack="r", ib_domain="r",
                                        gpus=[GpuRecord(index=0), GpuRecord(index=1)], containers=[]), "s1", 0.0)
    return core


async def commit_all(persist: Persister, core: RMCore) -> None:
    dirty = core.take_dirty()
    await persist.commit(rows([core.jobs[j] for j in dirty.jobs], [core.containers[c] for c in dirty.containers],
                              [core.cluster.nodes[n] for n in dirty.nodes], core.meta() if dirty.meta else {}))


async def test_a_refused_write_fails_the_request_rolls_back_and_refuses_writes_until_the_store_works(
        tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    holder: dict[str, RMCore] = {"core": registered_core()}

    def roll_back() -> None:
        holder["core"] = rebuild_core(store, RMSettings(), default_tree(), holder["core"], 5.0)

    persist = Persister(store, tmp_path, roll_back)
    core = holder["core"]
    core.submit(JobSpec(gpus=1, command=["x"]), "alice", 1.0)
    await commit_all(persist, core)
    version_before = core.cluster.version

    store._db.execute("PRAGMA query_only=1")       # the disk refuses from now on
    core.submit(JobSpec(gpus=1, command=["x"]), "alice", 2.0, submit_id="s-2")
    with pytest.raises(RequestError) as refused:
        await commit_all(persist, core)
    assert refused.value.code is ErrorCode.UNAVAILABLE
    assert refused.value.message.startswith("the RM's store cannot be written: ")
    assert f"free space in {tmp_path}" in refused.value.message
    assert persist.error == refused.value.message and not persist.writable

    rebuilt = holder["core"]
    assert rebuilt is not core and sorted(rebuilt.jobs) == ["job-1"], "the refused submit left no trace"
    assert "s-2" not in rebuilt.submit_ids
    assert rebuilt.cluster.version > version_before, "watchers must take the rebuilt view"
    with pytest.raises(RequestError) as again:
        persist.check_writable()
    assert again.value.code is ErrorCode.UNAVAILABLE
    assert not await persist.try_resume()

    store._db.execute("PRAGMA query_only=0")       # space freed
    assert await persist.try_resume() and persist.writable and persist.error == ""
    persist.check_writable()
    rebuilt.submit(JobSpec(gpus=1, command=["x"]), "alice", 3.0)
    await commit_all(persist, rebuilt)
    assert sorted(j.job_id for j in store.load().jobs) == ["job-1", "job-2"]
    persist.close()


def test_a_failed_save_raises_the_write_error_not_the_rollbacks(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store._db.execute("PRAGMA query_only=1")
    with pytest.raises(StoreWriteError, match="readonly"):
        store.save([], [], [], {"k": "v"})
    store._db.execute("PRAGMA query_only=0")
    assert "k" not in store.load().meta


async def test_the_commits_of_one_turn_of_the_loop_go_to_the_writer_as_one_batch_and_are_answered_once_written(
        tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    persist = Persister(store, tmp_path, lambda: None)
    answered: list[str] = []

    async def request(key: str) -> None:
        await persist.commit(rows([], [], [], {key: "v"}))
        answered.append(key)

    batches = persist.writer.batches
    await asyncio.gather(*(request(f"k{i}") for i in range(20)))
    assert sorted(answered) == sorted(f"k{i}" for i in range(20))
    assert persist.writer.batches - batches == 1, "20 requests of one turn: one hand-over"
    assert all(store.load().meta[f"k{i}"] == "v" for i in range(20)), "answered only once on disk"
    # A call (retention's own transaction) runs after the batches committed before it.
    waiting = asyncio.ensure_future(persist.commit(rows([], [], [], {"order": "batch"})))
    await asyncio.sleep(0)                # the batch is waiting for its turn's hand-over
    seen = await asyncio.wrap_future(persist.call(lambda: store.load().meta.get("order")))
    assert seen == "batch"
    await waiting
    persist.close()


async def test_a_failed_group_fails_every_request_in_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    failures: list[int] = []
    persist = Persister(store, tmp_path, lambda: failures.append(1))
    store._db.execute("PRAGMA query_only=1")
    results = await asyncio.gather(*(persist.commit(rows([], [], [], {f"k{i}": "v"})) for i in range(5)),
                                   return_exceptions=True)
    assert all(isinstance(r, RequestError) and r.code is ErrorCode.UNAVAILABLE for r in results)
    assert failures == [1], "memory rolled back once"
    store._db.execute("PRAGMA query_only=0")
    assert not any(k.startswith("k") for k in store.load().meta)
    persist.close()
