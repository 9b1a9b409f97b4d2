"""The controller's scheduler for tests/parallel.py: xdist's load-by-scope scheduling, where a scope is a group
(whole-machine, xdist_group, a module-scoped fixture's module) or else a test of its own.

Work units go out longest first (LPT scheduling: the last minutes are short tests, not a 2-minute one that started
late), by the durations tests/durations.json records (refresh it with `./scripts/test --record-durations`); a test
it does not know counts as a typical one of its folder.

Kept apart from tests/parallel.py, which must load without xdist (`-p no:xdist`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler.loadscope import LoadScopeScheduling

from tests.parallel import WHOLE_MACHINE, load_durations

GROUP = "group:"   # never the start of a test id
# What a test the durations file does not know is taken to last (seconds), by its folder.
UNKNOWN_S = {"tests/unit/": 0.2, "tests/integration/": 8.0, "tests/security/": 4.0}


class GroupScheduling(LoadScopeScheduling):
    """Groups go first (the whole-machine group, then the largest), each to one worker; then single tests, the
    integration and security tests before the quick unit tests, so that the last minutes are short tests."""

    def __init__(self, config: pytest.Config, log: Any, groups_dir: Path) -> None:
        super().__init__(config, log)
        self._groups_dir = groups_dir
        self._groups: dict[str, str] | None = None
        self._durations = load_durations(config.rootpath)

    def _load_groups(self) -> dict[str, str]:
        groups: dict[str, str] = {}
        for path in sorted(self._groups_dir.glob("*.json")):
            groups.update(json.loads(path.read_text()))
        if not groups:
            self.log(f"no test groups in {self._groups_dir}: every test runs on any worker")
        return groups

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = self._load_groups()
        group = self._groups.get(nodeid)
        return GROUP + group if group is not None else nodeid

    def schedule(self) -> None:
        """LoadScopeScheduling.schedule with our order of the work units."""
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for scope, unit in sorted(units.items(), key=lambda kv: _order(kv[0], _estimate(kv[1], self._durations))):
            self.workqueue[scope] = unit
        extra_nodes = len(self.nodes) - len(self.workqueue)
        for _ in range(max(0, extra_nodes)):
            unused_node, _assigned = self.assigned_work.popitem()
            unused_node.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()


def _estimate(nodeids: Iterable[str], durations: Mapping[str, float]) -> float:
    """The seconds a work unit is expected to take: its tests' recorded durations, a typical one for the rest."""
    return sum(durations.get(n, _unknown(n)) for n in nodeids)


def _unknown(nodeid: str) -> float:
    return next((s for folder, s in UNKNOWN_S.items() if nodeid.startswith(folder)), 1.0)


def _order(scope: str, seconds: float) -> tuple[int, float]:
    """The whole-machine group first (it is the longest chain of tests that must not overlap), then longest first."""
    return (0 if scope == GROUP + WHOLE_MACHINE else 1, -seconds)
