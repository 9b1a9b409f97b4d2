"""How the suite runs in parallel (pytest-xdist): the worker count, and which tests must share a worker.

Most of the suite waits on daemons (an RM, agents, AMs, a broker) rather than on the CPU, so more workers than
cores pays: `./scripts/test` passes `-n auto`, which `pytest_xdist_auto_num_workers` below turns into
`GPURM_TEST_WORKERS` when set, else 0 (run in-process, no start-up cost) for a narrow selection (only unit tests, or
named test ids, or `-k`, `--lf`), else twice the cores (at least 4, at most 16).

xdist's own `--dist loadgroup` does not work with pytest 9 (it renames items through an attribute pytest no longer
reads), so this plugin schedules instead, for `--dist load` (what `-n` implies) and `--dist loadgroup`:
- the tests of one `@pytest.mark.xdist_group(name)` run on one worker, one after the other;
  `@pytest.mark.whole_machine` is the group `whole-machine`: tests that are timing-sensitive or load the machine
  (chaos, many processes, a browser) and must not run beside each other;
- the tests that share a module- or class-scoped fixture (one dev cluster for a module) run on one worker, so the
  fixture starts once, as in a serial run;
- every other test goes to whichever worker is free;
- work goes out longest first, by the durations in tests/durations.json (`--record-durations` rewrites it from
  the run it ends: do that after adding slow tests).
Workers know the markers and fixtures, the controller only test ids: each worker writes its test id -> group map
to a folder the controller names, and the controller reads it before it hands out the first test.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

WHOLE_MACHINE = "whole-machine"
GROUPS_DIR_KEY = "gpurm_groups_dir"
DURATIONS_FILE = Path("tests") / "durations.json"
MIN_WORKERS = 4
MAX_WORKERS = 16
# Measured on 2 cores, the same hour: 4 workers 340-350 s, 8 workers 405-444 s (more only add contention).
WORKERS_PER_CPU = 2


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true", default=False,
                     help="write each test's duration (setup + call + teardown) into tests/durations.json, which "
                          "the parallel run uses to hand out the longest work first")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(config.rootpath / DURATIONS_FILE), "gpurm-durations")
    config.addinivalue_line("markers", "whole_machine: runs on the one worker that runs such tests one at a time "
                                       "(timing-sensitive, loads the machine); tests/parallel.py")
    config.addinivalue_line("markers", "xdist_group(name): tests of one group run on one worker (tests/parallel.py)")


# -- how many workers


def auto_workers(args: list[str], rootdir: Path, keyword: str, last_failed: bool, cpus: int,
                 env: str | None) -> int:
    """The worker count for `-n auto`: `env` (GPURM_TEST_WORKERS) wins; 0 for a narrow selection; else
    WORKERS_PER_CPU x `cpus`, within [MIN_WORKERS, MAX_WORKERS]."""
    if env is not None and env.strip():
        try:
            count = int(env)
        except ValueError:
            raise pytest.UsageError(f"GPURM_TEST_WORKERS={env!r}: want a number of workers (0: none)") from None
        if count < 0:
            raise pytest.UsageError(f"GPURM_TEST_WORKERS={env!r}: want 0 or more workers")
        return count
    if keyword or last_failed:
        return 0
    unit = (rootdir / "tests" / "unit").resolve()
    paths = [a for a in args if not a.startswith("-")]
    if paths and all("::" in a or _under((rootdir / a.split("::")[0]).resolve(), unit) for a in paths):
        return 0
    return max(MIN_WORKERS, min(MAX_WORKERS, WORKERS_PER_CPU * cpus))


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return auto_workers([str(a) for a in config.args], config.rootpath, config.option.keyword or "",
                        bool(getattr(config.option, "lf", False)), os.cpu_count() or 1,
                        os.environ.get("GPURM_TEST_WORKERS"))


# -- how long each test takes


def load_durations(rootdir: Path) -> dict[str, float]:
    """Test id -> seconds, as last recorded ({} when there is no readable record)."""
    try:
        data = json.loads((rootdir / DURATIONS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


class DurationRecorder:
    """(controller, or a run without workers) Adds up each test's phases; at the end, merges them into the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.took: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.took[report.nodeid] = self.took.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.took:
            merged = {**load_durations(session.config.rootpath), **{k: round(v, 2) for k, v in self.took.items()}}
            self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


# -- which tests share a worker


def group_of(item: pytest.Item) -> str | None:
    """The group `item` runs in, or None when any worker may run it."""
    if item.get_closest_marker("whole_machine") is not None:
        return WHOLE_MACHINE
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    info = getattr(item, "_fixtureinfo", None)
    defs: dict[str, Any] = getattr(info, "name2fixturedefs", {}) or {}
    scopes = {d.scope for fixturedefs in defs.values() for d in fixturedefs}
    if "module" in scopes or "package" in scopes:
        return f"module:{item.nodeid.split('::')[0]}"
    if "class" in scopes:
        return f"class:{'::'.join(item.nodeid.split('::')[:2])}"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(controller) Tell each worker where to write its groups."""
    node.workerinput[GROUPS_DIR_KEY] = str(_groups_dir(node.config))


def _groups_dir(config: pytest.Config) -> Path:
    path: Path | None = getattr(config, "_gpurm_groups_dir", None)
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="gpurm-xdist-groups-"))
        config._gpurm_groups_dir = path  # type: ignore[attr-defined]
    return path


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """(worker) Write this worker's test id -> group map for the controller's scheduler."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if not workerinput or GROUPS_DIR_KEY not in workerinput:
        return
    groups = {item.nodeid: g for item in items if (g := group_of(item)) is not None}
    folder = Path(workerinput[GROUPS_DIR_KEY])
    tmp = folder / f".{workerinput['workerid']}.tmp"
    tmp.write_text(json.dumps(groups))
    tmp.replace(folder / f"{workerinput['workerid']}.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    path: Path | None = getattr(config, "_gpurm_groups_dir", None)
    if path is not None:
        for f in path.iterdir():
            f.unlink()
        path.rmdir()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") not in ("load", "loadgroup"):
        return None
    from tests.parallel_sched import GroupScheduling

    return GroupScheduling(config, log, _groups_dir(config))
