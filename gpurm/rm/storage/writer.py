"""Group commit: the RM's store writes, off the event loop.

Each request serialises what it changed on the event loop (the records go on changing after it returns), hands the
rows to `StoreWriter.commit` and awaits the future before it answers. A writer thread takes every batch queued
while the previous transaction was on its way to the disk and commits them together in one transaction (one
fsync), so many concurrent requests share the cost of one durable commit, and the loop keeps serving while the
disk works.

A failed transaction fails every request in it and every batch queued behind it (they may build on the failed
changes), and the writer refuses batches from then on, until the shell has rolled its memory back to the store and
calls `reset` (rm/storage/persist.py): nothing after a failed write is acknowledged, and nothing half-done reaches the
disk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from gpurm.rm.storage.store import RMStore, Rows, StoreWriteError

log = logging.getLogger(__name__)

MAX_GROUP = 512       # batches per transaction: bounds one transaction's size and the wait of its first request
T = TypeVar("T")


class StoreWriter:
    def __init__(self, store: RMStore) -> None:
        self.store = store
        self._cv = threading.Condition()
        # Batches of rows, and calls (`call`) that write in their own transaction, in the order they came.
        self._queue: list[tuple[Rows | Callable[[], Any], Future[Any]]] = []
        self._error = ""            # set after a failed transaction: batches are refused until reset()
        self._closed = False
        self.transactions = 0       # commits done, and the batches they carried (group commit at work)
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="gpurm-store-writer", daemon=True)
        self._thread.start()

    def commit(self, rows: Rows) -> Future[None]:
        """A future that completes once `rows` are on disk, or fails with StoreWriteError."""
        fut: Future[None] = Future()
        self._enqueue(rows, fut)
        return fut

    def call(self, write: Callable[[], T]) -> Future[T]:
        """Run `write` (a store method that commits its own transaction, e.g. retiring finished jobs) on the
        writer thread, after every batch queued before it. Its failure fails its future alone."""
        fut: Future[T] = Future()
        self._enqueue(write, fut)
        return fut

    def _enqueue(self, item: Rows | Callable[[], Any], fut: Future[Any]) -> None:
        """Queue a batch or a call, or fail its future at once while the writer refuses (after a failed
        transaction, until reset) or is closed."""
        with self._cv:
            if self._error or self._closed:
                fut.set_exception(StoreWriteError(self._error or "the store is closed"))
                return
            self._queue.append((item, fut))
            self._cv.notify()

    def reset(self) -> None:
        """Take batches again (the shell rolled memory back to what the store holds)."""
        with self._cv:
            self._error = ""

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                head = self._queue[0]
                if not isinstance(head[0], Rows):
                    self._queue = self._queue[1:]
                    group = []
                else:
                    n = 1
                    while n < min(len(self._queue), MAX_GROUP) and isinstance(self._queue[n][0], Rows):
                        n += 1
                    group, self._queue = self._queue[:n], self._queue[n:]
            if not group:
                self._run_call(head[0], head[1])
                continue
            try:
                self.store.write([rows for rows, _ in group if isinstance(rows, Rows)])
            except StoreWriteError as exc:
                self._fail(group, exc)
                continue
            except BaseException as exc:       # never leave a request waiting forever
                self._fail(group, StoreWriteError(f"{type(exc).__name__}: {exc}"))
                continue
            self.transactions += 1
            self.batches += len(group)
            for _, fut in group:
                _settle(fut, None)

    @staticmethod
    def _run_call(write: Rows | Callable[[], Any], fut: Future[Any]) -> None:
        assert not isinstance(write, Rows)
        try:
            result = write()
        except BaseException as exc:       # the caller decides; the batches go on
            _settle(fut, None, exc)
            return
        _settle(fut, result)

    def _fail(self, group: list[tuple[Rows | Callable[[], Any], Future[Any]]], exc: StoreWriteError) -> None:
        with self._cv:
            self._error = str(exc) or "write failed"
            behind, self._queue = self._queue, []
        log.error("store write failed (%s): %d requests in the transaction and %d behind it fail", exc,
                  len(group), len(behind))
        for _, fut in group + behind:
            _settle(fut, None, StoreWriteError(str(exc)))


def _settle(fut: Future[Any], result: Any, exc: BaseException | None = None) -> None:
    """Complete a request's future, unless its request went away (a cancelled future: the client hung up or the
    stream ended while its rows were being written; they are written all the same, just not acknowledged)."""
    if fut.cancelled():
        return
    try:
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)
    except InvalidStateError:
        pass                  # cancelled in between: as above
