"""Start-time forecasts for queued jobs: "when will my job start?"

The RM answers by replaying its live state through the same scheduler code the simulator runs (`sim/engine.py`
over the real `RMCore`): its servers, its running jobs with what they attained, its queued jobs, its queue tree and
`borrowing` setting, with each job's remaining run time drawn from the history the `gittins` policy learns
(`rm/sched/history.py`). Three replays give the range: every job running its history group's low quantile of what
is left (`earliest`), its mean (`likely`), its high quantile (`latest`).

- `records.py`: `ForecastSettings` and `Forecast`, the vocabulary (light: the RM's views import it);
- `config.py`: rm.yaml `forecast:`;
- `snapshot.py`: `Snapshot`, the live state as plain records (picklable in every build), taken from an `RMCore`;
- `replay.py`: the pure forecaster: a snapshot in, a `Forecast` (earliest, likely, latest) per queued job out;
- `worker.py`: the daemon's side: snapshots on the event loop, replays in a separate process within a CPU budget;
- `baseline.py`: the naive forecast the simulator measures against (queue position x mean run time).

The simulator (`gpurm sim --forecast N`, `sim/forecasting.py`) takes its snapshots with the same `snapshot.take`
from its own `RMCore` and forecasts with the same `replay.forecast`: one forecasting code path, two users.
"""
