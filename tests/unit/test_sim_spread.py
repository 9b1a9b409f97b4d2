"""A trace job's `placement` (jsonl, the job file's key): read, refused when bad, and spread by the simulated AM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurm.common.jobspec import Placement
from gpurm.queues.tree import Policy
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.metrics import JobResult
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import TraceError, load_trace


def jsonl(tmp_path: Path, *jobs: dict[str, object]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


def test_placement_is_read_and_defaults_to_pack(tmp_path: Path) -> None:
    path = jsonl(tmp_path, {"id": "s", "submit": 0, "gpus": 4, "duration": 60, "placement": "spread"},
                 {"id": "p", "submit": 1, "gpus": 4, "duration": 60})
    jobs = {j.job_id: j for j in load_trace(path, "jsonl").jobs}
    assert jobs["s"].placement is Placement.SPREAD and jobs["p"].placement is Placement.PACK


@pytest.mark.parametrize("value", ["wide", 1, ["spread"]])
def test_a_bad_placement_names_the_line_and_the_field(tmp_path: Path, value: object) -> None:
    path = jsonl(tmp_path, {"submit": 0, "gpus": 1, "duration": 60},
                 {"submit": 0, "gpus": 1, "duration": 60, "placement": value})
    with pytest.raises(TraceError) as err:
        load_trace(path, "jsonl")
    assert (err.value.line, err.value.field) == (2, "placement") and "pack, spread" in err.value.reason


def run(tmp_path: Path, *jobs: dict[str, object]) -> dict[str, JobResult]:
    trace = load_trace(jsonl(tmp_path, *jobs), "jsonl")
    # Two racks of two 8-GPU servers.
    result = Engine(trace, parse_cluster("2x2x8"), trace_tree(trace.queues()), SimOptions(policy=Policy.FIFO)).run()
    return {r.job_id: r for r in result.results}


def test_spread_takes_four_servers_where_pack_takes_one(tmp_path: Path) -> None:
    results = run(tmp_path, {"id": "S", "submit": 0, "gpus": 4, "duration": 100, "placement": "spread"},
                  {"id": "P", "submit": 200, "gpus": 4, "duration": 100})
    assert results["S"].start_s == 0.0 and results["S"].servers == 4
    assert results["P"].start_s is not None and results["P"].servers == 1


def test_spread_over_fewer_servers_than_gpus_takes_the_least_per_server(tmp_path: Path) -> None:
    # 8 GPUs on 4 servers: 2 per server at once (the cluster's shape), even under `strict`.
    results = run(tmp_path, {"id": "S", "submit": 0, "gpus": 8, "duration": 100, "placement": "spread",
                             "locality": "strict"})
    assert results["S"].start_s == 0.0 and results["S"].servers == 4
