"""tests/parallel.py: how many workers `-n auto` gets, and which tests share a worker (the run itself is checked
by running pytest on a small suite in a temp dir)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.parallel import MAX_WORKERS, MIN_WORKERS, auto_workers, load_durations
from tests.parallel_sched import GROUP, _estimate, _order

ROOT = Path(__file__).resolve().parents[2]


def workers(*args: str, keyword: str = "", last_failed: bool = False, cpus: int = 2, env: str | None = None) -> int:
    return auto_workers(list(args), ROOT, keyword, last_failed, cpus, env)


def test_the_whole_suite_gets_two_workers_a_core_within_bounds() -> None:
    assert workers(cpus=1) == workers() == MIN_WORKERS == 4
    assert workers(cpus=3) == 6
    assert workers(cpus=64) == MAX_WORKERS == 16
    assert workers("tests") == workers("tests/integration") == workers("tests/unit", "tests/security") == 4


def test_a_narrow_selection_runs_without_workers() -> None:
    assert workers("tests/unit") == 0
    assert workers("tests/unit/test_fairshare.py") == 0
    assert workers("tests/integration/test_tls.py::test_x") == 0
    assert workers("tests", keyword="fairshare") == 0
    assert workers("tests", last_failed=True) == 0


def test_the_environment_forces_a_count_and_refuses_nonsense() -> None:
    assert workers("tests/unit", env="3") == 3
    assert workers(env="0") == 0
    assert workers(env="") == 4
    with pytest.raises(pytest.UsageError, match="GPURM_TEST_WORKERS='many'"):
        workers(env="many")
    with pytest.raises(pytest.UsageError, match="0 or more"):
        workers(env="-1")


def test_the_whole_machine_group_goes_first_then_the_longest_work() -> None:
    durations = {"tests/unit/test_a.py::t": 0.1, "tests/integration/test_b.py::t": 30.0,
                 "tests/integration/test_c.py::t": 2.0, "tests/integration/test_d.py::x": 5.0,
                 "tests/integration/test_d.py::y": 6.0}
    units = {"tests/unit/test_a.py::t": ["tests/unit/test_a.py::t"],
             "tests/integration/test_b.py::t": ["tests/integration/test_b.py::t"],
             "tests/integration/test_c.py::t": ["tests/integration/test_c.py::t"],
             GROUP + "module:tests/integration/test_d.py": ["tests/integration/test_d.py::x",
                                                          "tests/integration/test_d.py::y"],
             GROUP + "whole-machine": ["tests/unit/test_e.py::t"],
             "tests/integration/test_new.py::t": ["tests/integration/test_new.py::t"]}
    ordered = sorted(units, key=lambda s: _order(s, _estimate(units[s], durations)))
    assert ordered == [GROUP + "whole-machine", "tests/integration/test_b.py::t",
                       GROUP + "module:tests/integration/test_d.py",       # 5 + 6 s
                       "tests/integration/test_new.py::t",                 # unknown: a typical integration test
                       "tests/integration/test_c.py::t", "tests/unit/test_a.py::t"]


def test_durations_are_read_from_the_record_and_a_bad_record_is_none(tmp_path: Path) -> None:
    assert load_durations(tmp_path) == {}
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "durations.json").write_text('{"tests/unit/test_a.py::t": 1.5}')
    assert load_durations(tmp_path) == {"tests/unit/test_a.py::t": 1.5}
    (tmp_path / "tests" / "durations.json").write_text("[not json")
    assert load_durations(tmp_path) == {}
    assert load_durations(ROOT)          # the suite's own record is there, and readable


SAMPLE = '''
import os, json, pytest
from pathlib import Path

OUT = Path(os.environ["SAMPLE_OUT"])

def record(name):
    (OUT / f"{name}.json").write_text(json.dumps(os.environ.get("PYTEST_XDIST_WORKER", "")))

@pytest.fixture(scope="module")
def shared():
    return object()

@pytest.mark.whole_machine
@pytest.mark.parametrize("n", range(4))
def test_heavy(n):
    record(f"heavy{n}")

@pytest.mark.xdist_group("pair")
@pytest.mark.parametrize("n", range(3))
def test_pair(n):
    record(f"pair{n}")

@pytest.mark.parametrize("n", range(3))
def test_module_fixture(shared, n):
    record(f"shared{n}")

@pytest.mark.parametrize("n", range(12))
def test_free(n):
    record(f"free{n}")
'''


def test_a_run_keeps_each_group_on_one_worker(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ("tests.parallel",)\n')
    (suite / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "SAMPLE_OUT": str(out), "PYTHONPATH": str(ROOT)}
    (suite / "tests").mkdir()
    argv = [sys.executable, "-m", "pytest", "-n", "3", "-q", "-p", "no:cacheprovider", "--rootdir", str(suite),
            "--record-durations", str(suite)]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=suite, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert len(seen) == 22
    for group in ("heavy", "pair", "shared"):
        assert len({w for name, w in seen.items() if name.startswith(group)}) == 1, seen
    assert all(seen.values())                                             # every test ran on a worker
    assert len({w for name, w in seen.items() if name.startswith("free")}) > 1   # the rest was spread
    recorded = json.loads((suite / "tests" / "durations.json").read_text())    # --record-durations, by the controller
    assert len(recorded) == 22 and all(k.startswith("test_sample.py::") and v >= 0 for k, v in recorded.items())


def test_every_level_down_to_a_tests_dir_is_traversable(tmp_path: Path) -> None:
    """Jobs run as another user (nobody) must reach their dirs below a test's temp dir, on a worker too (xdist
    has pytest remake the run dir, 0700, to name the workers' dirs below it)."""
    base = Path(tempfile.gettempdir()) / f"gpurm-tests-{os.getuid()}"
    levels = [tmp_path, *[p for p in tmp_path.parents if base in p.parents or p == base]]
    assert base in levels
    closed = [f"{p} {stat.S_IMODE(p.stat().st_mode):o}" for p in levels if not p.stat().st_mode & stat.S_IXOTH]
    assert closed == []
