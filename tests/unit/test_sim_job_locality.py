"""A trace job's own locality (jsonl `locality`, the job file's keys): how it is read, how the simulated AM uses it,
and the run-time sensitivity it implies (sim/runtime.py `sensitivity_of`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurm.common.jobspec import Locality, LocalityLevel, LocalityMode
from gpurm.queues.tree import Policy
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, RelaxPolicy, SimOptions
from gpurm.sim.metrics import JobResult
from gpurm.sim.run import trace_tree
from gpurm.sim.runtime import RuntimeConfig, sensitivity_of
from gpurm.sim.trace import TraceError, TraceLocality, load_trace

CFG = RuntimeConfig()


def jsonl(tmp_path: Path, *jobs: dict[str, object]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


def test_locality_is_read_as_a_mode_or_a_mapping_and_absent_keys_stay_the_runs(tmp_path: Path) -> None:
    path = jsonl(tmp_path,
                 {"id": "s", "submit": 0, "gpus": 2, "duration": 60, "locality": "strict"},
                 {"id": "m", "submit": 1, "gpus": 2, "duration": 60,
                  "locality": {"mode": "any", "start_level": "node", "timeout": "5m", "backoff_base": 2,
                               "backoff_max": "500ms"}},
                 {"id": "p", "submit": 2, "gpus": 2, "duration": 60, "locality": {"start_level": "rack"}},
                 {"id": "d", "submit": 3, "gpus": 2, "duration": 60})
    jobs = {j.job_id: j for j in load_trace(path, "jsonl").jobs}
    assert jobs["s"].locality == TraceLocality(mode=LocalityMode.STRICT)
    assert jobs["m"].locality == TraceLocality(LocalityMode.ANY, LocalityLevel.NODE, 300.0, 2.0, 0.5)
    assert jobs["d"].locality is None
    run = Locality(timeout_s=7.0, backoff_base_s=1.0, backoff_max_s=9.0)
    assert jobs["p"].locality is not None
    assert jobs["p"].locality.over(run) == Locality(7.0, 1.0, 9.0, LocalityLevel.RACK, LocalityMode.PREFER)
    assert jobs["m"].locality is not None
    assert jobs["m"].locality.over(run) == Locality(300.0, 2.0, 0.5, LocalityLevel.NODE, LocalityMode.ANY)


@pytest.mark.parametrize(("locality", "field", "reason"), [
    ("sloppy", "locality", "strict, prefer, any"),
    (3, "locality", "a mode"),
    ({"mode": "lax"}, "locality.mode", "strict, prefer, any"),
    ({"start_level": "server"}, "locality.start_level", "node, packed, rack, any"),
    ({"timeout": "soon"}, "locality.timeout", ""),
    ({"timeout": -1}, "locality.timeout", "negative"),
    ({"timout": "5m"}, "locality.timout", "unknown field"),
])
def test_a_bad_locality_names_the_line_and_the_field(tmp_path: Path, locality: object, field: str,
                                                      reason: str) -> None:
    path = jsonl(tmp_path, {"submit": 0, "gpus": 1, "duration": 60},
                 {"submit": 0, "gpus": 1, "duration": 60, "locality": locality})
    with pytest.raises(TraceError) as err:
        load_trace(path, "jsonl")
    assert (err.value.line, err.value.field) == (2, field)
    assert reason in err.value.reason


# Two racks of two 4-GPU servers. A, C and E (3 GPUs, 1,000 s each) take a server each (best fit: A and C share a
# rack), leaving 1 + 1 GPUs free in one rack and 1 + 4 in the other. B (6 GPUs, 100 s, fewest servers 2) then finds
# 7 free GPUs, but no rack with 6: only spread over three servers and both racks (`any`); at 1,000 all is free.
# (B needs two servers at best: a job that fits on one server is never split under `prefer`, see am/master.py.)
def b_with(tmp_path: Path, locality: object, relax: RelaxPolicy = RelaxPolicy.TIMEOUT,
           runtime: RuntimeConfig | None = None) -> JobResult:
    b: dict[str, object] = {"id": "B", "submit": 10, "gpus": 6, "duration": 100}
    if locality is not None:
        b["locality"] = locality
    trace = load_trace(jsonl(tmp_path, *({"id": j, "submit": 0, "gpus": 3, "duration": 1000} for j in "ACE"), b),
                       "jsonl")
    options = SimOptions(policy=Policy.FIFO, relax=relax, runtime=runtime)
    result = Engine(trace, parse_cluster("2x2x4"), trace_tree(trace.queues()), options).run()
    return next(r for r in result.results if r.job_id == "B")


def test_each_job_relaxes_by_its_own_locality(tmp_path: Path) -> None:
    strict = b_with(tmp_path, "strict")
    assert strict.start_s == 1000.0 and strict.servers == 2          # waits for two servers in one rack
    anywhere = b_with(tmp_path, "any")
    assert anywhere.start_s == 10.0 and anywhere.servers == 3        # spreads at once
    quick = b_with(tmp_path, {"timeout": "5s", "backoff_base": "1s", "backoff_max": "1s"})
    # packed and rack time out (5 s each, a back-off of at most 1 s after each), then it spreads at `any`
    assert quick.start_s is not None and 15.0 <= quick.start_s <= 27.0 and quick.servers == 3
    default = b_with(tmp_path, None)
    assert default.start_s is not None and 70.0 <= default.start_s < 1000.0


def test_relax_never_or_immediate_still_rules_every_job(tmp_path: Path) -> None:
    # `--relax` is an experiment over every job: it sets the mode even of a job whose trace gives one.
    assert b_with(tmp_path, "strict", RelaxPolicy.IMMEDIATE).start_s == 10.0
    never = b_with(tmp_path, {"mode": "any", "timeout": "5s"}, RelaxPolicy.NEVER)
    assert never.start_s is not None and never.start_s >= 1000.0 and never.servers == 2   # (then its back-off)


def test_sensitivity_follows_the_locality_mode_where_the_trace_gives_one(tmp_path: Path) -> None:
    assert sensitivity_of("j", "resnet50", None, CFG, mode=LocalityMode.STRICT) == CFG.sensitive_value
    assert sensitivity_of("j", "vgg16", None, CFG, mode=LocalityMode.ANY) == CFG.insensitive_value
    assert sensitivity_of("j", "resnet50", None, CFG, mode=LocalityMode.PREFER) == 0.2   # prefer: the model's
    assert sensitivity_of("j", "vgg16", 0.3, CFG, mode=LocalityMode.ANY) == 0.3          # a given value first
    draws = {sensitivity_of(f"t{i}", "", None, CFG, mode=LocalityMode.PREFER) for i in range(200)}
    assert draws == {CFG.sensitive_value, CFG.insensitive_value}                           # prefer: the mix
    mixed = RuntimeConfig(sensitive_value=0.8, insensitive_value=0.1)
    assert b_with(tmp_path, "strict", runtime=mixed).sensitivity == 0.8    # and the engine passes the mode on
    assert b_with(tmp_path, "any", runtime=mixed).sensitivity == 0.1
