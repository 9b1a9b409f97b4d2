"""The compiled hot paths (gpurm.native): used only while fresh, and deciding exactly what the interpreted code does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpurm import native

ROOT = Path(__file__).resolve().parents[2]

# Replays the first 400 Philly jobs under LAS (preemptions, back-offs, relaxing) and prints every job's outcome.
REPLAY = """
import json, sys
from pathlib import Path
from gpurm.native import status
from gpurm.queues.tree import Policy
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import load_trace
import gpurm.rm.core
trace = load_trace(Path("tests/data/philly/jobs-2017-10-02_to_10-15.csv"), "philly-csv")
trace.jobs = trace.jobs[:400]
r = Engine(trace, parse_cluster("2x4x8"), trace_tree(trace.queues()), SimOptions(policy=Policy.LAS)).run()
print(json.dumps({"compiled": gpurm.rm.core.__file__.endswith(".so"), "active": status().active,
                  "events": r.events, "jobs": [[j.job_id, j.start_s, j.finish_s, j.preemptions] for j in r.results]}))
"""


def replay(env_native: str) -> dict[str, object]:
    env = {**os.environ, "GPURM_NATIVE": env_native}
    out = subprocess.run([sys.executable, "-c", REPLAY], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_the_compiled_modules_are_imported_exactly_when_the_build_is_fresh() -> None:
    import gpurm.rm.core
    compiled = str(gpurm.rm.core.__file__).endswith(".so")
    assert compiled == native.status().active, native.status()
    assert str(gpurm.rm.core.__file__).startswith(str(native.LIB_DIR)) == compiled


def test_gpurm_native_0_runs_interpreted() -> None:
    out = replay("0")
    assert out["compiled"] is False and out["active"] is False


@pytest.mark.skipif(not native.status().active, reason=f"no fresh compiled build: {native.status().reason}")
def test_compiled_and_interpreted_replays_decide_the_same() -> None:
    compiled, interpreted = replay("1"), replay("0")
    assert compiled["compiled"] is True
    assert compiled["events"] == interpreted["events"] and compiled["jobs"] == interpreted["jobs"]
    assert any(j[3] for j in compiled["jobs"])          # preemptions happened: the replay exercised them
