"""The forecasts' vocabulary: how one is made (`ForecastSettings`: rm.yaml `forecast:`, `gpurm sim --forecast-*`)
and what it says (`Forecast`). Light: the RM's config reader and views import it without the simulator."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForecastSettings:
    """How a forecast is made (rm.yaml `forecast:`; `gpurm sim --forecast`)."""

    horizon_s: float = 7 * 86400.0     # replayed time at most; a job not started by then is "beyond the horizon"
    low_quantile: float = 0.1          # earliest: every job runs this quantile of what is left of it
    high_quantile: float = 0.9         # latest: ... this quantile
    widen: float = 2.0                 # latest at least likely + widen x (likely - now)
    max_events: int = 2_000_000        # replayed events at most, per replay (a CPU cap)

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_quantile < self.high_quantile <= 1.0:
            raise ValueError(f"quantiles: need 0 <= low < high <= 1, got {self.low_quantile} and "
                             f"{self.high_quantile}")
        if not self.horizon_s > 0:
            raise ValueError(f"horizon: must be positive, got {self.horizon_s}")
        if not self.widen >= 0:
            raise ValueError(f"widen: must be at least 0, got {self.widen}")


@dataclass(frozen=True)
class Forecast:
    """A queued job's start, as times on the snapshot's clock. `latest` None: not within the horizon in the
    pessimistic replay (`likely` and `earliest` None alike when not even they started within it)."""

    job_id: str
    made_at: float
    earliest: float | None
    likely: float | None
    latest: float | None

    def as_dict(self) -> dict[str, float | str | None]:
        return {"job_id": self.job_id, "made_at": self.made_at, "earliest": self.earliest,
                "likely": self.likely, "latest": self.latest}
