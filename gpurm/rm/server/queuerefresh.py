"""The queue config as the running RM takes it: the tree it starts with (the configured queues file, else the config
last applied and stored, else one `default` queue), and a live refresh (`gpurm admin refresh-queues`, SIGHUP): all
or nothing, read and parsed off the event loop, swapped into the core by one mutation, one refresh at a time.
`QueueRefresh.committed_tree` is the config the store holds: a rollback after a failed write keeps it.

Parsing and validation are gpurm/queues/; what a swap changes in the core is RMCore.replace_tree.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from gpurm.common.fields import ConfigError
from gpurm.proto import gpurm_pb2 as pb
from gpurm.queues.config import MAX_YAML_BYTES, capacity_warnings, parse_queues
from gpurm.queues.tree import QueueTree, default_tree
from gpurm.rm.config import RMConfig
from gpurm.rm.server import pbviews
from gpurm.rm.state.core import RMCore
from gpurm.rm.storage.persist import Persister
from gpurm.rm.storage.store import RMStore

if TYPE_CHECKING:
    from gpurm.rm.server.daemon import Mutation

log = logging.getLogger("gpurm.rm.server.daemon")     # the RM's one log name, whichever module writes the line


def initial_queues(config: RMConfig, store: RMStore) -> QueueTree:
    """The configured queues file wins; without one, the config last applied by refresh-queues; else one
    `default` queue."""
    path = config.queues_file
    if path:
        try:
            return parse_queues(Path(path).read_text(), path)
        except OSError as exc:
            raise ConfigError([f"queues: cannot read {path}: {exc.strerror}"]) from None
    text = store.load_meta().get("queues_yaml", "")
    if text:
        try:
            return parse_queues(text, "the last applied queue config")
        except ConfigError as exc:
            log.error("ignoring the stored queue config: %s", "; ".join(exc.problems))
    return default_tree()


def read_queues_file(path: Path) -> str:
    """The text of a queues file, at most MAX_YAML_BYTES (ConfigError naming the file and the reason)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"cannot read {path}: {exc.strerror}"]) from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError([f"{path}: larger than {MAX_YAML_BYTES} bytes (the limit for a queue config)"])
    return raw.decode("utf-8", errors="replace")


class QueueRefresh:
    def __init__(self, config: RMConfig, persist: Persister, core: Callable[[], RMCore],
                 mutation: Callable[[], AbstractAsyncContextManager[Mutation]]) -> None:
        """`core`: the shell's core now (a failed write replaces it). `mutation`: RMShell.mutation (the applied
        config is written with the core's changes, in the same commit)."""
        self.config = config
        self.persist = persist
        self._core = core
        self._mutation = mutation
        self.committed_tree = core().queues.tree    # the queue config the store holds (a rollback keeps it)
        self._lock = asyncio.Lock()

    async def refresh(self, text: str) -> pb.RefreshQueuesResponse:
        """All or nothing: an invalid config, or one that drops a queue still holding jobs, changes nothing.
        Reading, parsing and validating run in a worker thread (a big config does not stall other clients); the
        swap runs on the loop. One refresh at a time."""
        async with self._lock:
            return await self._refresh(text)

    async def _refresh(self, text: str) -> pb.RefreshQueuesResponse:
        source = "the uploaded config"
        self.persist.check_writable()
        if not text:
            if not self.config.queues_file:
                return pb.RefreshQueuesResponse(applied=False, errors=[
                    "the RM was started without a queues file: pass one (gpurm admin refresh-queues FILE)"])
            source = self.config.queues_file
            try:
                text = await asyncio.to_thread(read_queues_file, Path(source))
            except ConfigError as exc:
                return pb.RefreshQueuesResponse(applied=False, errors=exc.problems)
        try:
            tree = await asyncio.to_thread(parse_queues, text, source)
        except ConfigError as exc:
            log.warning("queue config rejected (%d problems); the old one stays", len(exc.problems))
            return pb.RefreshQueuesResponse(applied=False, errors=exc.problems)
        async with self._mutation() as m:
            core = self._core()
            problems = core.replace_tree(tree)
            if not problems:
                m.meta["queues_yaml"] = text
                core.schedule(time.time())
        if not problems:
            self.committed_tree = tree      # written: a later rollback keeps it
        if problems:
            log.warning("queue config rejected: %s", "; ".join(problems))
            return pb.RefreshQueuesResponse(applied=False, errors=problems)
        log.info("queue config applied from %s: %d leaf queues", source, len(tree.leaves))
        warnings = capacity_warnings(tree, self._core().cluster.capacity)
        for warning in warnings:
            log.warning("queue config: %s", warning)
        return pb.RefreshQueuesResponse(applied=True, queues=pbviews.queues(self._core()).queues, warnings=warnings)
