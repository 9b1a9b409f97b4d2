"""Reservation policies compared on a recorded usage series, as AI4DL compares them (`scripts/bench/rightsize`).

For every sample a policy names the memory and CPU it would have reserved at that moment; the evaluation adds up
what was reserved (GB-seconds, core-seconds: each sample's reservation held until the next sample) and how often
use went above it (violations: samples above the reservation, where a hard limit would have throttled the CPU
or killed the process for memory).

- `peak`: the series' global peak, for the whole run (what a user who asks for "enough" gets).
- `adaptive`: the largest use seen in the previous `window` samples (a sliding-window estimate that follows the
  job; the first sample reserves itself). Cheap and tight, but behind by one sample on every rise.
- `phase`: each sample reserves its phase type's mean + 2 sigma (`phases.discover` on the series itself: the
  phase boundaries are known, as when a job's phase models come from earlier runs of the same job).
- `request`: one static request, the largest per-phase mean + 2 sigma (what `gpurm status` recommends).

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpurm.rightsize.phases import PhaseModel, discover
from gpurm.rightsize.series import Sample

POLICIES = ("peak", "adaptive", "phase", "request")
ADAPTIVE_WINDOW = 4          # samples: one minute at the agent's default 15 s


@dataclass(frozen=True)
class Outcome:
    policy: str
    mem_gb_s: float
    cpu_core_s: float
    mem_violations: int
    cpu_violations: int
    samples: int

    @property
    def mem_violation_pct(self) -> float:
        return 100.0 * self.mem_violations / self.samples if self.samples else 0.0

    @property
    def cpu_violation_pct(self) -> float:
        return 100.0 * self.cpu_violations / self.samples if self.samples else 0.0


def durations(samples: Sequence[Sample]) -> list[float]:
    """How long each sample's reservation is held: until the next sample (the last: the median gap)."""
    gaps = [b.t - a.t for a, b in itertools.pairwise(samples)]
    if not gaps:
        return [0.0] * len(samples)
    last = sorted(gaps)[len(gaps) // 2]
    return [*gaps, last]


def _adaptive(values: Sequence[float], window: int) -> list[float]:
    return [values[0] if i == 0 else max(values[max(0, i - window):i]) for i in range(len(values))]


def reservations(samples: Sequence[Sample], policy: str, model: PhaseModel | None = None,
                 window: int = ADAPTIVE_WINDOW) -> tuple[list[float], list[float]]:
    """(memory MiB, CPU cores) reserved at each sample under `policy`."""
    mem = [s.mem_mib for s in samples]
    cpu = [s.cpu for s in samples]
    if not samples:
        return [], []
    if policy == "peak":
        return [max(mem)] * len(mem), [max(cpu)] * len(cpu)
    if policy == "adaptive":
        if window < 1:
            raise ValueError("window must be at least 1")
        return _adaptive(mem, window), _adaptive(cpu, window)
    model = model if model is not None else discover(samples)
    if policy == "phase":
        return ([model.phase(p).mem_provision for p in model.labels],
                [model.phase(p).cpu_provision for p in model.labels])
    if policy == "request":
        rec = model.recommend()
        return [rec.mem_mib] * len(mem), [rec.cpu] * len(cpu)
    raise ValueError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")


def evaluate(samples: Sequence[Sample], policy: str, model: PhaseModel | None = None,
             window: int = ADAPTIVE_WINDOW) -> Outcome:
    mem_r, cpu_r = reservations(samples, policy, model, window)
    dts = durations(samples)
    eps = 1e-9

    def over(use: Callable[[Sample], float], res: Sequence[float]) -> int:
        return sum(1 for s, r in zip(samples, res, strict=True) if use(s) > r + eps)

    return Outcome(policy=policy,
                   mem_gb_s=sum(r * dt for r, dt in zip(mem_r, dts, strict=True)) / 1024,
                   cpu_core_s=sum(r * dt for r, dt in zip(cpu_r, dts, strict=True)),
                   mem_violations=over(lambda s: s.mem_mib, mem_r),
                   cpu_violations=over(lambda s: s.cpu, cpu_r),
                   samples=len(samples))


def compare(runs: Sequence[Sequence[Sample]], window: int = ADAPTIVE_WINDOW) -> list[Outcome]:
    """Every policy over every run, summed per policy (in POLICIES order)."""
    totals: dict[str, list[float]] = {p: [0.0, 0.0, 0, 0, 0] for p in POLICIES}
    for samples in runs:
        model = discover(samples)
        for p in POLICIES:
            o = evaluate(samples, p, model, window)
            acc = totals[p]
            acc[0] += o.mem_gb_s
            acc[1] += o.cpu_core_s
            acc[2] += o.mem_violations
            acc[3] += o.cpu_violations
            acc[4] += o.samples
    return [Outcome(policy=p, mem_gb_s=a[0], cpu_core_s=a[1], mem_violations=int(a[2]), cpu_violations=int(a[3]),
                    samples=int(a[4])) for p, a in totals.items()]


def table(outcomes: Sequence[Outcome]) -> str:
    """The comparison as a text table; percentages against `peak`."""
    peak = next((o for o in outcomes if o.policy == "peak"), None)
    rows = [("POLICY", "MEM GB-s", "vs PEAK", "MEM VIOL", "CPU core-s", "vs PEAK", "CPU VIOL")]
    for o in outcomes:
        rel_m = f"{100 * o.mem_gb_s / peak.mem_gb_s:.0f}%" if peak and peak.mem_gb_s else "-"
        rel_c = f"{100 * o.cpu_core_s / peak.cpu_core_s:.0f}%" if peak and peak.cpu_core_s else "-"
        rows.append((o.policy, f"{o.mem_gb_s:.2f}", rel_m, f"{o.mem_violation_pct:.1f}%", f"{o.cpu_core_s:.1f}",
                     rel_c, f"{o.cpu_violation_pct:.1f}%"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths,
                     strict=True))).rstrip() for r in rows)
