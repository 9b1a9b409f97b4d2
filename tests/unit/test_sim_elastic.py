"""Elastic jobs in the simulator (`placement` model): the same RM and AM code as the daemon grows them on idle GPUs
and takes the growth back for a waiting job; their speed follows the scaling-efficiency curve (sim/runtime.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.jobspec import Locality
from gpurm.rm.sched.elastic import IDLE_HOLD_S
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.metrics import JobResult
from gpurm.sim.run import SimInputError, SimRequest, load_inputs, trace_tree
from gpurm.sim.runtime import RuntimeConfig, RuntimeModel, elastic_speedup
from gpurm.sim.trace import Trace, TraceJob, make_elastic

# Every job indifferent to placement, resizes free and scaling linear: times can be worked out by hand.
PLAIN = RuntimeConfig(sensitive_share=0.0, resize_cost_s=0.0, elastic_efficiency=1.0)
LONG = Locality(timeout_s=1e7)


def run(*jobs: TraceJob, config: RuntimeConfig = PLAIN) -> dict[str, JobResult]:
    trace = Trace(list(jobs), None, "test")
    engine = Engine(trace, parse_cluster("1x2x4"), trace_tree(trace.queues()),
                    SimOptions(runtime=config, locality=LONG))
    return {r.job_id: r for r in engine.run().results}


def test_an_elastic_job_alone_grows_onto_idle_gpus_and_finishes_sooner() -> None:
    rigid = run(TraceJob("A", 0, 4, 1000, "q", line=1))
    elastic = run(TraceJob("A", 0, 4, 1000, "q", line=1, max_gpus=8))
    assert rigid["A"].finish_s == pytest.approx(1000)
    # 4 GPUs until the idle hold is over, then 8: twice the speed for the 700 s of work left.
    assert elastic["A"].finish_s == pytest.approx(IDLE_HOLD_S + (1000 - IDLE_HOLD_S) / 2)


def test_growth_waits_for_the_idle_hold_and_a_job_arriving_first_takes_nothing_back() -> None:
    jobs = run(TraceJob("A", 0, 4, 1000, "q", line=1, max_gpus=8), TraceJob("B", 100, 4, 300, "q", line=2))
    assert jobs["B"].start_s == pytest.approx(100) and jobs["B"].preemptions == 0
    # B came before A's growth (idle since 0, for IDLE_HOLD_S = 300): A runs at 4 until B is gone at 400, grows
    # 300 s later, at 700 (700 s of work done), and does the last 300 at twice the speed: done at 850.
    assert jobs["A"].finish_s == pytest.approx(850) and jobs["A"].preemptions == 0


def test_growth_is_taken_back_for_a_waiting_job_which_starts_at_once() -> None:
    jobs = run(TraceJob("A", 0, 4, 1000, "q", line=1, max_gpus=8), TraceJob("B", 400, 4, 300, "q", line=2))
    assert jobs["B"].start_s == pytest.approx(400) and jobs["B"].preemptions == 0
    # A: 300 s at 4 GPUs, grows at 300, 100 s at 8 (200 s of work) until B takes the growth back at 400, then
    # at 4 beside B: 200 s of work left at 700, when B ends, and done at 900 before the idle hold lets it regrow.
    assert jobs["A"].finish_s == pytest.approx(900) and jobs["A"].preemptions == 0


def test_the_scaling_curve_and_resize_cost_slow_growth_down() -> None:
    config = RuntimeConfig(sensitive_share=0.0, resize_cost_s=30.0, elastic_efficiency=0.9)
    assert elastic_speedup(config, 8, 4) == pytest.approx(1.8) and elastic_speedup(config, 4, 4) == 1.0
    jobs = run(TraceJob("A", 0, 4, 1000, "q", line=1, max_gpus=8), config=config)
    # 4 GPUs from 0 to the growth at IDLE_HOLD_S (300 s of work), then 30 s of resize, then the 700 s left at 1.8x.
    assert jobs["A"].finish_s == pytest.approx(IDLE_HOLD_S + 30 + (1000 - IDLE_HOLD_S) / 1.8)


def test_make_elastic_draws_a_share_from_the_seed_and_job_id() -> None:
    trace = Trace([TraceJob(f"j{i}", i, 1 + i % 4, 100, "q", line=i + 1) for i in range(400)], None, "test")
    half = make_elastic(trace, 0.5, 2.0, seed=1)
    chosen = {j.job_id for j in half.jobs if j.max_gpus}
    assert 150 < len(chosen) < 250 and all(j.max_gpus == 2 * j.gpus for j in half.jobs if j.max_gpus)
    assert {j.job_id for j in make_elastic(trace, 0.5, 2.0, seed=1).jobs if j.max_gpus} == chosen
    assert {j.job_id for j in make_elastic(trace, 0.5, 2.0, seed=2).jobs if j.max_gpus} != chosen
    assert make_elastic(trace, 0.0, 2.0) is trace
    with pytest.raises(ValueError, match="elastic-share"):
        make_elastic(trace, 1.5, 2.0)


def test_elastic_share_needs_the_placement_model(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"submit": 0, "gpus": 1, "duration": 10, "queue": "q"}\n')
    req = SimRequest(trace=trace, fmt="jsonl", cluster="1x1x4", out=tmp_path / "out", elastic_share=0.5,
                     runtime_model=RuntimeModel.IDEAL)
    with pytest.raises(SimInputError, match="--elastic-share: needs --runtime-model placement"):
        load_inputs(req)
    req.runtime_model = RuntimeModel.PLACEMENT
    req.elastic_max = 0.5
    with pytest.raises(SimInputError, match="--elastic-max"):
        load_inputs(req)
