"""Reservation policies (rightsize/policies.py): on hand-made series, and on series recorded from real phased
learners on a dev cluster (tests/data/rightsize/, made by scripts/bench/rightsize --keep)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.rightsize.policies import POLICIES, compare, durations, evaluate, reservations, table
from gpurm.rightsize.series import Sample, parse_series

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "data" / "rightsize").glob("*.jsonl"))


def steps(mems: list[float], cpu: float = 1.0) -> list[Sample]:
    return [Sample(t=10.0 * i, cpu=cpu, mem_mib=m, gpu=None) for i, m in enumerate(mems)]


def test_peak_and_adaptive_by_hand() -> None:
    s = steps([1024, 1024, 2048, 2048, 1024, 1024])
    assert durations(s) == [10.0] * 6
    peak = evaluate(s, "peak")
    assert peak.mem_gb_s == pytest.approx(6 * 10 * 2.0) and peak.mem_violations == 0
    mem, _ = reservations(s, "adaptive", window=1)
    assert mem == [1024, 1024, 1024, 2048, 2048, 1024]
    adaptive = evaluate(s, "adaptive", window=1)
    assert adaptive.mem_violations == 1                    # the rise to 2048 is seen one sample late
    assert adaptive.mem_gb_s == pytest.approx(10 * (1 + 1 + 1 + 2 + 2 + 1))
    assert evaluate(s, "adaptive", window=4).mem_gb_s == pytest.approx(10 * (1 + 1 + 1 + 2 + 2 + 2))


def test_phase_policy_reserves_each_phase_its_own_level() -> None:
    s = steps([1000.0] * 10 + [4000.0] * 10 + [1000.0] * 10)
    phase = evaluate(s, "phase")
    assert phase.mem_violations == 0
    assert phase.mem_gb_s == pytest.approx(10 * (20 * 1000 + 10 * 4000) / 1024)
    assert evaluate(s, "request").mem_gb_s == evaluate(s, "peak").mem_gb_s
    with pytest.raises(ValueError, match="unknown policy"):
        reservations(s, "magic")


def test_recorded_learners_phase_policy_saves_memory_with_few_violations() -> None:
    assert len(FIXTURES) >= 1
    runs = [parse_series(p.read_text()) for p in FIXTURES]
    assert all(len(r) >= 50 for r in runs)
    out = {o.policy: o for o in compare(runs)}
    assert list(out) == list(POLICIES)
    peak, adaptive, phase = out["peak"], out["adaptive"], out["phase"]
    assert peak.mem_violations == 0 and peak.cpu_violations == 0
    # Phase-based reserves clearly less than the peak, and is exceeded far less often than the adaptive estimate.
    assert phase.mem_gb_s < 0.9 * peak.mem_gb_s
    assert phase.mem_violation_pct < 5.0
    assert phase.mem_violation_pct < adaptive.mem_violation_pct
    text = table(list(out.values()))
    assert text.splitlines()[0].split()[:3] == ["POLICY", "MEM", "GB-s"]
    assert "100%" in text.splitlines()[1]
