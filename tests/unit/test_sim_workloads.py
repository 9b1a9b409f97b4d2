"""The Tiresias-style workload: seeded, shaped as documented, and readable back as a Tiresias CSV."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from gpurm.sim.trace import Trace, TraceJob, load_trace
from gpurm.sim.workloads import TIRESIAS_MODELS, TiresiasStyle, quantile, tiresias_style, to_tiresias_csv


def source(durations: list[float]) -> Trace:
    jobs = [TraceJob(job_id=f"s{i}", submit_s=float(i), gpus=1, duration_s=d, queue="q", line=i + 1)
            for i, d in enumerate(durations)]
    return Trace(jobs=jobs, start_epoch=None, source="src")


SOURCE = source([100.0 * (i % 50 + 1) for i in range(1000)] + [10.0**7])   # one job far past the 99th percentile


def test_same_seed_same_jobs_other_seed_other_jobs() -> None:
    a = tiresias_style(TiresiasStyle(seed=3), SOURCE)
    assert a.jobs == tiresias_style(TiresiasStyle(seed=3), SOURCE).jobs
    assert a.jobs != tiresias_style(TiresiasStyle(seed=4), SOURCE).jobs


def test_shape_follows_the_published_sample() -> None:
    trace = tiresias_style(TiresiasStyle(seed=1), SOURCE)
    assert len(trace.jobs) == 480 and trace.jobs[0].submit_s == 0.0
    sizes = Counter(j.gpus for j in trace.jobs)
    assert set(sizes) == {1, 2, 4, 8}
    assert 0.4 < sizes[1] / 480 < 0.6                                    # half are 1-GPU jobs
    gaps = [b.submit_s - a.submit_s for a, b in zip(trace.jobs, trace.jobs[1:], strict=False)]
    assert all(g >= 0 for g in gaps) and 25 < sum(gaps) / len(gaps) < 35   # Poisson, mean 30 s
    assert {j.name for j in trace.jobs} <= set(TIRESIAS_MODELS)


@pytest.mark.parametrize("load", [0.5, 1.0, 2.0])
def test_offered_load_is_the_one_asked_for(load: float) -> None:
    params = TiresiasStyle(load=load, min_duration_s=1.0, seed=2)
    trace = tiresias_style(params, SOURCE)
    offered = trace.gpu_seconds() / (trace.span_s * params.servers * params.gpus_per_server)
    assert offered == pytest.approx(load, rel=0.01)                      # durations are rounded to whole seconds


def test_durations_clipped_and_floored() -> None:
    params = TiresiasStyle(seed=5, min_duration_s=60.0)
    trace = tiresias_style(params, SOURCE)
    longest = max(j.duration_s for j in trace.jobs)
    assert longest < 10.0**6                                   # the 10^7 s outlier was clipped to the 99th pct
    assert min(j.duration_s for j in trace.jobs) >= 60.0


def test_quantile_is_nearest_rank() -> None:
    assert quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert quantile([5.0, 1.0], 1.0) == 5.0 and quantile([7.0], 0.01) == 7.0


def test_written_csv_reads_back_as_the_same_jobs(tmp_path: Path) -> None:
    trace = tiresias_style(TiresiasStyle(jobs=40, seed=9), SOURCE)
    path = tmp_path / "w.csv"
    path.write_text(to_tiresias_csv(trace))
    back = load_trace(path, "tiresias")
    assert [(j.job_id, j.gpus, j.duration_s, j.name) for j in back.jobs] == \
        [(j.job_id, j.gpus, j.duration_s, j.name) for j in trace.jobs]
    assert all(math.isclose(a.submit_s, b.submit_s, abs_tol=1e-3) for a, b in zip(back.jobs, trace.jobs,
                                                                                  strict=True))


@pytest.mark.parametrize(("params", "field"), [
    (TiresiasStyle(jobs=0), "jobs"), (TiresiasStyle(servers=1), "servers x gpus_per_server"),
    (TiresiasStyle(load=0.0), "load"), (TiresiasStyle(clip_quantile=0.0), "clip_quantile"),
])
def test_bad_parameters_are_refused_by_name(params: TiresiasStyle, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        tiresias_style(params, SOURCE)


def test_empty_source_is_refused() -> None:
    with pytest.raises(ValueError, match="no jobs"):
        tiresias_style(TiresiasStyle(), source([]))
