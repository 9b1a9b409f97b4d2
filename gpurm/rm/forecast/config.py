"""rm.yaml `forecast:`: whether the RM forecasts queued jobs' starts, how often and within what CPU.

```yaml
forecast:
  enabled: true        # default true
  interval: 30s        # a round at most this often (a round replays every queued job at once)
  cpu_budget: 0.25     # the replays' CPU on average, in cores (0.25: a quarter of one core); a round that cost more
                       # waits longer before the next one
  horizon: 7d          # replayed time at most: a job not started by then is "beyond the horizon"
  quantiles: [0.1, 0.9]   # the range: every job's run time at these quantiles of its history group
  widen: 2.0           # the latest start at least likely + widen x the likely wait (docs/sim.md: coverage measured)
```
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpurm.common.fields import Reader
from gpurm.rm.forecast.records import ForecastSettings


@dataclass
class ForecastConfig:
    enabled: bool = True
    interval_s: float = 30.0
    cpu_budget: float = 0.25
    settings: ForecastSettings = field(default_factory=ForecastSettings)


def read_forecast_section(r: Reader) -> ForecastConfig:
    """`forecast:`; every problem names its field (`forecast.cpu_budget: must be ...`)."""
    out = ForecastConfig()
    f = r.section("forecast")
    out.enabled = f.flag("enabled", out.enabled)
    out.interval_s = f.duration("interval", out.interval_s, maximum=86400.0)
    if out.interval_s < 1.0:
        f.error("interval", f"must be at least 1s, got {out.interval_s:g}s")
        out.interval_s = 1.0
    out.cpu_budget = f.number("cpu_budget", out.cpu_budget, minimum=0.01, maximum=1.0)
    defaults = ForecastSettings()
    horizon = f.duration("horizon", defaults.horizon_s, maximum=90 * 86400.0)
    if horizon < 60.0:
        f.error("horizon", f"must be at least 1m, got {horizon:g}s")
        horizon = defaults.horizon_s
    low, high = defaults.low_quantile, defaults.high_quantile
    raw = f.raw("quantiles")
    if raw is not None:
        if (not isinstance(raw, list) or len(raw) != 2
                or not all(isinstance(q, int | float) and not isinstance(q, bool) for q in raw)):
            f.error("quantiles", f"must be two numbers [LOW, HIGH], got {raw!r:.40}")
        elif not 0.0 <= raw[0] < raw[1] <= 1.0:
            f.error("quantiles", f"need 0 <= LOW < HIGH <= 1, got {raw!r:.40}")
        else:
            low, high = float(raw[0]), float(raw[1])
    widen = f.number("widen", defaults.widen, minimum=0.0, maximum=100.0)
    f.reject_unknown()
    try:
        out.settings = ForecastSettings(horizon_s=horizon, low_quantile=low, high_quantile=high,
                                        widen=max(0.0, widen))
    except ValueError as exc:          # only from values already reported above
        f.error("quantiles", str(exc))
    return out
