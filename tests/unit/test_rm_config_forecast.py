"""rm.yaml `forecast:` (rm/forecast/config.py): the defaults, every field read, and each bad value refused naming
its field. Files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import load_rm_config
from gpurm.rm.forecast.config import ForecastConfig
from gpurm.rm.forecast.records import ForecastSettings


def rm_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rm.yaml"
    path.write_text(text)
    return path


def test_the_defaults(tmp_path: Path) -> None:
    f = load_rm_config(rm_yaml(tmp_path, "listen: 127.0.0.1:7070\n")).forecast
    assert f == ForecastConfig()
    assert (f.enabled, f.interval_s, f.cpu_budget) == (True, 30.0, 0.25)
    assert f.settings == ForecastSettings()


def test_every_field_is_read(tmp_path: Path) -> None:
    f = load_rm_config(rm_yaml(tmp_path, "forecast: {enabled: false, interval: 2m, cpu_budget: 0.5, horizon: 2d, "
                                         "quantiles: [0.05, 0.95], widen: 2}\n")).forecast
    assert (f.enabled, f.interval_s, f.cpu_budget) == (False, 120.0, 0.5)
    assert f.settings == ForecastSettings(horizon_s=2 * 86400.0, low_quantile=0.05, high_quantile=0.95, widen=2.0)


@pytest.mark.parametrize(("text", "problem"), [
    ("forecast: {enabled: maybe}", "forecast.enabled: must be true or false"),
    ("forecast: {interval: 0.5s}", "forecast.interval: must be at least 1s"),
    ("forecast: {interval: soon}", "forecast.interval"),
    ("forecast: {cpu_budget: 0}", "forecast.cpu_budget: must be at least 0.01"),
    ("forecast: {cpu_budget: 2}", "forecast.cpu_budget: must be at most 1"),
    ("forecast: {horizon: 10s}", "forecast.horizon: must be at least 1m"),
    ("forecast: {quantiles: [0.9, 0.1]}", "forecast.quantiles: need 0 <= LOW < HIGH <= 1"),
    ("forecast: {quantiles: [0.1]}", "forecast.quantiles: must be two numbers"),
    ("forecast: {quantiles: [0.1, true]}", "forecast.quantiles: must be two numbers"),
    ("forecast: {widen: -1}", "forecast.widen: must be at least 0"),
    ("forecast: {cpu_budjet: 0.1}", "forecast.cpu_budjet: unknown field (did you mean 'cpu_budget'?)"),
    ("forecast: 3", "forecast: expected a mapping"),
])
def test_bad_values_are_refused_naming_the_field(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_rm_config(rm_yaml(tmp_path, text + "\n"))
    assert any(problem in p for p in err.value.problems), err.value.problems
