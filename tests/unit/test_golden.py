"""The golden check: refactoring the RM core (or compiling it) must not change a single scheduling decision.

Each case replays the shared Philly window (2017-10-03 to 10-05, 2,641 jobs) through the simulator, which runs
the RM's own policy code: the policies on a 128-GPU cluster (2 racks x 8 servers x 8 GPUs), loaded enough to
queue and preempt (thousands of preemptions), and failure injection on the real machine list. It compares the
summary (less its wall time) and every job's row (start, finish, attempts, preemptions, servers, GPU-seconds)
with what was recorded in tests/data/golden/; the interpreted and the compiled build agree.

A change that is meant to change decisions re-records them, and the diff of the recorded files shows what moved:

    GPURM_GOLDEN_UPDATE=1 .venv/bin/python -m pytest tests/unit/test_golden.py
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from pathlib import Path
from typing import cast

import pytest

from gpurm.queues.tree import Policy
from gpurm.sim.run import SimRequest, run
from gpurm.sim.runtime import RuntimeModel
from tests.conftest import philly_data

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
WINDOW = ("2017-10-03", "2017-10-05")
SMALL = "2x8x8"
CASES = {
    "fifo": (Policy.FIFO, 0.0, SMALL),
    "las": (Policy.LAS, 0.0, SMALL),
    "srtf": (Policy.SRTF, 0.0, SMALL),
    "las-failures": (Policy.LAS, 0.5, ""),   # infrastructure failures (retries, back-off) on the machine list
}
UNSTABLE = ("wall_s",)                       # how long the replay took, not what it decided
PATHS = ("trace", "cluster")                 # input files: compared by name (the checkout's folder differs)


def portable(summary: dict[str, object]) -> dict[str, object]:
    """The summary with its input files named without the folder of the checkout that recorded it."""
    inputs = summary.get("inputs")
    if isinstance(inputs, dict):
        summary = {**summary, "inputs": {k: Path(v).name if k in PATHS and isinstance(v, str) else v
                                         for k, v in inputs.items()}}
    return summary


def pinned(mine: object, recorded: object) -> object:
    """`mine` cut to the keys the record has, at every depth (a per-queue figure added since is not pinned)."""
    if isinstance(mine, dict) and isinstance(recorded, dict):
        return {k: pinned(v, recorded[k]) for k, v in mine.items() if k in recorded}
    return mine


def replay(name: str, out: Path) -> tuple[dict[str, object], list[dict[str, str]]]:
    policy, failures, cluster = CASES[name]
    run(SimRequest(trace=philly_data("jobs-2017-10-02_to_10-15.csv"), fmt="philly-csv",
                   cluster=cluster or str(philly_data("cluster_machine_list")), out=out, policy=policy, window=WINDOW,
                   failures_per_1000_gpu_h=failures, seed=7, plots=False, runtime_model=RuntimeModel.IDEAL))
    summary = json.loads((out / "summary.json").read_text())
    for key in UNSTABLE:
        summary.pop(key, None)
    with (out / "jobs.csv").open() as f:
        rows = list(csv.DictReader(f))
    return summary, rows


@pytest.mark.parametrize("name", list(CASES))
def test_replay_decisions_are_unchanged(name: str, tmp_path: Path) -> None:
    summary, rows = replay(name, tmp_path)
    summary_file, jobs_file = GOLDEN / f"{name}.summary.json", GOLDEN / f"{name}.jobs.csv.gz"
    if os.environ.get("GPURM_GOLDEN_UPDATE"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        summary_file.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        with gzip.open(jobs_file, "wt", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        pytest.skip(f"recorded {name}")
    assert summary_file.exists(), f"no golden record for {name}: run with GPURM_GOLDEN_UPDATE=1 once"
    with gzip.open(jobs_file, "rt", newline="") as f:
        want_rows = list(csv.DictReader(f))
    assert len(rows) == len(want_rows)
    # Figures added since the recording (the run-time model's) are not pinned here: every recorded column and key
    # must be present and equal; the new ones must show the ideal model's neutral values.
    assert set(want_rows[0]) <= set(rows[0])
    moved = [(want, got) for want, got in zip(want_rows, rows, strict=True) if want != {k: got[k] for k in want}]
    assert not moved, (f"{len(moved)} of {len(rows)} jobs were scheduled differently; the first:\n"
                       f"  recorded {moved[0][0]}\n  now      {moved[0][1]}")
    recorded = portable(json.loads(summary_file.read_text()))
    mine = cast(dict[str, object], pinned(portable(summary), recorded))
    inputs = cast(dict[str, object], mine["inputs"])
    # An input added since some records: the default, whether or not the record names it.
    assert inputs.pop("relax", "timeout") == cast(dict[str, object], recorded["inputs"]).pop("relax", "timeout") \
        == "timeout"
    assert mine == recorded
    assert all(float(r["slowdown"]) == 1.0 and float(r["lost_preemption_gpu_s"]) == 0.0 for r in rows)
    assert summary["runtime"] == {"model": "ideal"}
