"""`gpurm sim --las-thresholds`: the simulator ranks las jobs by the levels an admin would set in rm.yaml
(`preemption.las_thresholds`), so thresholds can be compared on a trace before they are deployed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpurm.cli.main import main
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S, las_thresholds_problem

# One GPU. A (2,000 s) starts at 0; B (100 s) arrives at 1,000, when A has attained 1,000 GPU-seconds.
TRACE = [{"id": "A", "submit": 0, "gpus": 1, "duration": 2000}, {"id": "B", "submit": 1000, "gpus": 1, "duration": 100}]


def replay(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict[str, object],
                                                                                   dict[str, dict[str, str]]]:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(j) + "\n" for j in TRACE))
    out = tmp_path / ("out" + "".join(extra).replace(",", "_"))
    code = main(["sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x1x1", "--policy", "las",
                 "--runtime-model", "ideal", "--no-plots", "-o", "json", "--out", str(out), *extra])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    with (out / "jobs.csv").open(newline="") as f:
        return summary, {r["job_id"]: r for r in csv.DictReader(f)}


def test_the_default_levels_keep_a_job_of_one_gpu_hour_level_with_a_new_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary, jobs = replay(tmp_path, capsys)
    # A is still at level 0 (below 1 GPU-hour) when B comes: same level, no preemption; B waits for A's end.
    assert float(jobs["B"]["start_s"]) == 2000.0 and jobs["A"]["preemptions"] == "0"
    assert summary["inputs"]["las_thresholds_gpu_s"] == list(LAS_THRESHOLDS_GPU_S)   # type: ignore[index]


def test_a_lower_first_threshold_lets_the_new_job_preempt(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    summary, jobs = replay(tmp_path, capsys, "--las-thresholds", "500,2h")
    # A crossed 500 GPU-seconds before B came: B outranks it and takes the GPU at the RM's next look (within half
    # the minimum run, 150 s) and A's grace, long before A would end; A resumes later.
    assert float(jobs["B"]["start_s"]) < 1200.0 and jobs["A"]["preemptions"] == "1"
    assert float(jobs["A"]["finish_s"]) > float(jobs["B"]["finish_s"])
    assert summary["inputs"]["las_thresholds_gpu_s"] == [500.0, 7200.0]   # type: ignore[index]


@pytest.mark.parametrize(("value", "says"), [("2h,1h", "rising"), ("0,1h", "above 0"), ("1h,soon", "--las-thresholds"),
                                             (",", "at least one")])
def test_bad_thresholds_are_refused_before_the_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      value: str, says: str) -> None:
    code = main(["sim", "--trace", str(tmp_path / "missing.jsonl"), "--format", "jsonl", "--cluster", "1x1x1",
                 "--no-plots", "--out", str(tmp_path / "out"), "--las-thresholds", value])
    err = capsys.readouterr().err
    # Refused naming the flag, before the (missing) trace is read.
    assert code == 2 and "--las-thresholds" in err and says in err and "missing.jsonl" not in err, err


def test_the_rule_is_rm_yamls() -> None:
    assert las_thresholds_problem(LAS_THRESHOLDS_GPU_S) == ""
    assert las_thresholds_problem((3600.0, 3600.0)) == "must be above 0 and rising"
    assert "at least one" in las_thresholds_problem(())
