"""A start forecast in words, the same in the CLI and the web UI: "in ~1h20m (40m to 3h10m)", with when it was
made. Pure: `now` is passed in; times are Unix milliseconds as `StartForecast` carries them (0: beyond the
horizon)."""

from __future__ import annotations

from gpurm.common.fields import format_duration


def _after(at_ms: int, now: float) -> str:
    return format_duration(max(0.0, at_ms / 1000 - now))


def short(earliest_ms: int, likely_ms: int, latest_ms: int, horizon_ms: int, made_ms: int, now: float) -> str:
    """The START column: `~1h20m (40m-3h10m)`; `now` when even the latest is past; `>7d` beyond the horizon."""
    beyond = f">{format_duration((made_ms + horizon_ms) / 1000 - now)}"
    if not likely_ms:
        return beyond if not earliest_ms else f"{beyond} (from {_after(earliest_ms, now)})"
    if latest_ms and latest_ms / 1000 <= now:
        return "now (overdue)"
    low = _after(earliest_ms, now) if earliest_ms else "0s"
    high = _after(latest_ms, now) if latest_ms else beyond
    return f"~{_after(likely_ms, now)} ({low}-{high})"


def sentence(earliest_ms: int, likely_ms: int, latest_ms: int, horizon_ms: int, made_ms: int, now: float) -> str:
    """`gpurm status`'s and the job page's line: the range, and when the forecast was made."""
    made = f"forecast made {format_duration(max(0.0, now - made_ms / 1000))} ago"
    if not likely_ms:
        return (f"not within the forecast's horizon of {format_duration(horizon_ms / 1000)} (earliest "
                f"{_after(earliest_ms, now) if earliest_ms else 'beyond it too'}); {made}")
    if latest_ms and latest_ms / 1000 <= now:
        return (f"any time now (it was expected to start within {format_duration((latest_ms - made_ms) / 1000)} of "
                f"the forecast); {made}")
    low = _after(earliest_ms, now) if earliest_ms else "now"
    high = _after(latest_ms, now) if latest_ms else f"beyond the {format_duration(horizon_ms / 1000)} horizon"
    return f"likely in {_after(likely_ms, now)}, between {low} and {high}; {made}"
