"""`gpurm sim --forecast N`: how right the start-time forecasts are, measured on a replay.

At the submission of a sample of the trace's jobs (per size class of 1, 2-4, 5-8, 9-16 and 17+ GPUs, every k-th of
the class in submission order, k = ceil(class's jobs / N): at most N a class, so that the rare big jobs are
measured too), once the RM has settled that instant, a job that is still waiting gets a forecast exactly as the
daemon makes one: `rm/forecast/snapshot.take` from the replay's own `RMCore`, then `rm/forecast/replay.forecast`,
and the naive baseline's (`rm/forecast/baseline.py`). When the run is over each forecast is compared with the job's
real first start in the replay. `summary.json`'s `forecast` object:

- `sampled`, `every`: the jobs looked at and each class's k; `started_at_once`: of those, how many started at their own
  submission's instant (no forecast needed, left out of every figure); `forecast`: how many were forecast;
  `measured`: those that then started (a job that never started in the run has no error);
- `median_abs_error_s`, `p90_abs_error_s`: |likely - actual| over the measured jobs (a forecast "beyond the
  horizon" counts with the horizon as its likely wait);
- `coverage`: the share of measured jobs whose actual start fell in [earliest, latest] (an open `latest` covers
  every start after `earliest`); `beyond_horizon`: forecasts with no `latest`;
- `baseline`: the same errors for the naive baseline (a point forecast: no coverage);
- `by_class`: every figure above per size class (1, 2-4, 5-8, 9-16, 17+ GPUs);
- `settings`, `wall_s` (the forecasts' own time), `replay_events`.
Every forecast, with the job's real wait, is written to `forecasts.csv` (waits in seconds after the submission;
empty: beyond the horizon, or never started).
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpurm.common.model import JobState
from gpurm.rm.forecast.baseline import baseline_wait_s
from gpurm.rm.forecast.records import ForecastSettings
from gpurm.rm.forecast.replay import forecast
from gpurm.rm.forecast.snapshot import HistoryCache, take
from gpurm.sim.engine import Engine
from gpurm.sim.metrics import JobResult, locality_class, percentile

ForecastProgress = Callable[[int, int], None]     # (forecasts made, forecasts planned)
FORECASTS_FILE = "forecasts.csv"


@dataclass(frozen=True)
class Made:
    """One forecast, as waits (seconds after the submission); None: beyond the horizon."""

    trace_id: str
    gpus: int
    earliest_s: float | None
    likely_s: float | None
    latest_s: float | None
    baseline_s: float


class SubmitForecasts:
    """The engine's `after_arrivals` hook: forecasts a sample of the jobs at their submission."""

    def __init__(self, engine: Engine, sample: int, settings: ForecastSettings,
                 progress: ForecastProgress | None = None) -> None:
        counts: dict[str, int] = {}
        self.position: dict[str, tuple[str, int]] = {}     # trace id -> (its class, its index in the class)
        for tj in engine.trace.jobs:
            c = locality_class(tj.gpus)
            self.position[tj.job_id] = (c, counts.get(c, 0))
            counts[c] = counts.get(c, 0) + 1
        self.every = {c: max(1, math.ceil(n / sample)) if sample > 0 else n + 1 for c, n in counts.items()}
        self.planned = sum(len(range(0, n, self.every[c])) for c, n in counts.items())
        self.engine = engine
        self.settings = settings
        self.progress = progress
        self.cache = HistoryCache()
        self.made: list[Made] = []
        self.sampled = 0
        self.at_once = 0
        self.events = 0
        self.wall_s = 0.0

    def __call__(self, now: float, arrived: list[str]) -> None:
        engine = self.engine
        for cid in arrived:
            c, i = self.position[engine.by_trace[cid]]
            if i % self.every[c]:
                continue
            tid = engine.by_trace[cid]
            self.sampled += 1
            job = engine.core.jobs.get(cid)
            if job is None or job.start_time or job.state in (JobState.RUNNING,) or job.state.terminal:
                self.at_once += 1
            else:
                t0 = time.perf_counter()
                snap = take(engine.core, now, self.cache)
                got, stats = forecast(snap, self.settings, [cid])
                f = got[cid]
                self.events += stats.events
                self.made.append(Made(tid, job.spec.gpus, _wait(f.earliest, now), _wait(f.likely, now),
                                      _wait(f.latest, now), baseline_wait_s(snap, cid)))
                self.wall_s += time.perf_counter() - t0
            if self.progress is not None:
                self.progress(self.sampled, self.planned)

    def summary(self, results: Sequence[JobResult]) -> dict[str, object]:
        actual = {r.job_id: r.start_s - r.submit_s for r in results if r.start_s is not None}
        measured = [(m, actual[m.trace_id]) for m in self.made if m.trace_id in actual]
        out: dict[str, object] = {
            "sampled": self.sampled, "every": dict(sorted(self.every.items())), "started_at_once": self.at_once,
            "forecast": len(self.made), **_figures(measured, self.settings.horizon_s),
            "by_class": {c: _figures([(m, a) for m, a in measured if locality_class(m.gpus) == c],
                                     self.settings.horizon_s)
                         for c in ("1", "2-4", "5-8", "9-16", "17+")},
            "settings": {"horizon_s": self.settings.horizon_s, "low_quantile": self.settings.low_quantile,
                         "high_quantile": self.settings.high_quantile, "widen": self.settings.widen},
            "wall_s": self.wall_s, "replay_events": self.events,
        }
        return out


    def write_csv(self, out: Path, results: Sequence[JobResult]) -> Path:
        actual = {r.job_id: r.start_s - r.submit_s for r in results if r.start_s is not None}
        path = out / FORECASTS_FILE
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["job_id", "gpus", "earliest_s", "likely_s", "latest_s", "baseline_s", "actual_s"])
            for m in self.made:
                w.writerow([m.trace_id, m.gpus, *("" if v is None else f"{v:.1f}" for v in
                            (m.earliest_s, m.likely_s, m.latest_s, m.baseline_s, actual.get(m.trace_id)))])
        return path


def _wait(at: float | None, now: float) -> float | None:
    return None if at is None else max(0.0, at - now)


def _figures(measured: Sequence[tuple[Made, float]], horizon_s: float) -> dict[str, object]:
    errors = sorted(abs((m.likely_s if m.likely_s is not None else horizon_s) - a) for m, a in measured)
    base = sorted(abs(m.baseline_s - a) for m, a in measured)
    covered = sum(1 for m, a in measured if (horizon_s if m.earliest_s is None else m.earliest_s) <= a
                  and (m.latest_s is None or a <= m.latest_s))
    return {
        "measured": len(measured),
        "median_abs_error_s": percentile(errors, 50), "p90_abs_error_s": percentile(errors, 90),
        "coverage": covered / len(measured) if measured else None,
        "beyond_horizon": sum(1 for m, _ in measured if m.latest_s is None),
        "median_actual_wait_s": percentile(sorted(a for _, a in measured), 50),
        "baseline": {"median_abs_error_s": percentile(base, 50), "p90_abs_error_s": percentile(base, 90)},
    }
