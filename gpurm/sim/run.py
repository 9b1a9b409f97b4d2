"""One `gpurm sim` run: load the trace and the cluster, build the queue tree, run the engine, write the results.

The pieces live elsewhere (`trace.py`, `clusterspec.py`, `engine.py`, `metrics.py`, `plots.py`); this module
only wires them together so the CLI and the tests run exactly the same thing.

Output directory (`--out DIR`, created if missing):
- `summary.json`: the run's figures (see `metrics.py` for every definition), plus `inputs` (what was run);
- `jobs.csv`: one row per job;
- `queue_timeline.csv`: allocated GPUs per queue over time;
- `jct_cdf.png`, `queue_delay_by_size.png`, `gpu_utilization.png`, `queue_shares.png`.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpurm.common.fields import ConfigError
from gpurm.queues.config import parse_queues
from gpurm.queues.tree import Borrowing, Policy, QueueDef, QueueTree
from gpurm.rm.forecast.records import ForecastSettings
from gpurm.rm.sched.history import DEFAULT_CONDITIONING, Finished
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S
from gpurm.rm.state.messages import RESERVATIONS, RESERVE_AFTER_S, RESERVE_BEHIND
from gpurm.sim import metrics
from gpurm.sim.clusterspec import SimServer, parse_cluster, total_gpus
from gpurm.sim.engine import Engine
from gpurm.sim.forecasting import ForecastProgress, SubmitForecasts
from gpurm.sim.options import RelaxPolicy, SimOptions, SimResult
from gpurm.sim.runtime import RuntimeConfig, RuntimeModel, load_config
from gpurm.sim.trace import Trace, load_trace, make_elastic

log = logging.getLogger(__name__)

Progress = Callable[[float, int, int], None]    # (simulated seconds, jobs finished, jobs in all)


class SimInputError(ValueError):
    """Bad input for a run (a file, a queue config that does not fit the trace): nothing was simulated."""


@dataclass
class SimRequest:
    trace: Path
    fmt: str
    cluster: str                      # RxNxG or a machine-list file
    out: Path
    queues: Path | None = None
    policy: Policy | None = None      # None: each leaf's own policy (fifo unless the queue config says)
    borrowing: Borrowing | None = None   # None: the queue config's `borrowing` (fair unless it says)
    window: tuple[str, str] | None = None
    failures_per_1000_gpu_h: float = 0.0
    seed: int = 0
    plots: bool = True
    runtime_model: RuntimeModel = RuntimeModel.PLACEMENT
    runtime_config: Path | None = None       # a YAML file of RuntimeConfig fields (placement only)
    checkpoint_interval_s: float | None = None   # these two override the config's
    restart_cost_s: float | None = None
    relax: RelaxPolicy = RelaxPolicy.TIMEOUT
    elastic_share: float = 0.0        # the share of jobs made elastic (trace.make_elastic), placement model only
    elastic_max: float = 2.0          # ... growing up to this many times their GPUs
    reservations: int = RESERVATIONS       # reservations at once (rm/sched/reservations.py)
    reserve_after_s: float = RESERVE_AFTER_S
    reserve_behind: float = RESERVE_BEHIND     # reserve only for a job waiting this many times the one-GPU jobs'
    history_by: str = DEFAULT_CONDITIONING     # what the history conditions on (rm/sched/history.py LEVELS)
    history_prior: tuple[Finished, ...] = ()   # finished jobs it starts from (rm/sched/prior.py)
    las_thresholds_gpu_s: tuple[float, ...] = LAS_THRESHOLDS_GPU_S   # rm.yaml preemption.las_thresholds
    forecast: int = 0                 # forecast the start of at most this many jobs at submission (0: none)
    forecast_settings: ForecastSettings = field(default_factory=ForecastSettings)


@dataclass
class SimOutcome:
    summary: dict[str, object]
    result: SimResult
    trace: Trace
    files: list[Path]


def trace_tree(queues: list[str]) -> QueueTree:
    """The tree used without `--queues`: every queue of the trace with weight 1 under root (a dotted name such
    as `research.nlp` becomes a leaf under an inner queue `research`, also of weight 1). Everyone may submit."""
    root = QueueDef("root", "root", submit_acl=["*"])
    by_path = {"root": root}
    for name in queues:
        parent = root
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            path = "root." + ".".join(parts[:depth])
            q = by_path.get(path)
            if q is None:
                q = by_path[path] = QueueDef(parts[depth - 1], path)
                parent.children.append(q)
            parent = q
    return QueueTree(root)


def config_tree(path: Path, trace: Trace) -> QueueTree:
    """The queue config given with `--queues`, checked against the trace: every queue the trace names must be a
    leaf of it (a job of another queue could never be submitted)."""
    try:
        tree = parse_queues(path.read_text(), str(path))
    except OSError as exc:
        raise SimInputError(f"--queues: cannot read {path}: {exc.strerror}") from None
    except ConfigError as exc:
        raise SimInputError(f"--queues: {path} is invalid:\n  " + "\n  ".join(exc.problems)) from None
    leaves = {q.path.removeprefix("root.") for q in tree.leaves}
    missing = [q for q in trace.queues() if q not in leaves]
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise SimInputError(f"--queues: the trace names queues that are not leaves of {path}: {shown}; add them "
                            "or leave out --queues (then every trace queue gets weight 1)")
    return tree


def load_inputs(req: SimRequest) -> tuple[Trace, list[SimServer], QueueTree]:
    servers = parse_cluster(req.cluster)          # cheap, so a bad spec is reported before a big trace loads
    try:
        trace = load_trace(req.trace, req.fmt, req.window)
    except OSError as exc:
        raise SimInputError(f"--trace: cannot read {req.trace}: {exc.strerror}") from None
    if not trace.jobs:
        raise SimInputError(f"--trace: {req.trace} has no jobs" + (" in the window" if req.window else ""))
    biggest = max(j.gpus for j in trace.jobs)
    if biggest > total_gpus(servers):
        raise SimInputError(f"--cluster: {req.cluster} has {total_gpus(servers)} GPUs but the trace has a job of "
                            f"{biggest}; give a bigger cluster")
    tree = config_tree(req.queues, trace) if req.queues is not None else trace_tree(trace.queues())
    if req.elastic_share:
        if req.runtime_model is RuntimeModel.IDEAL:
            raise SimInputError("--elastic-share: needs --runtime-model placement (an elastic job's speed follows "
                                "its GPUs: the scaling-efficiency curve, docs/sim.md)")
        try:
            trace = make_elastic(trace, req.elastic_share, req.elastic_max, req.seed)
        except ValueError as exc:
            raise SimInputError(str(exc)) from None
    return trace, servers, tree


def runtime_config(req: SimRequest) -> RuntimeConfig | None:
    """The `placement` model's constants (None for `ideal`); SimInputError naming the option when one is bad."""
    if req.checkpoint_interval_s is not None and not req.checkpoint_interval_s > 0:
        raise SimInputError(f"--checkpoint-interval: must be positive, got {req.checkpoint_interval_s:g}")
    if req.restart_cost_s is not None and not req.restart_cost_s >= 0:
        raise SimInputError(f"--restart-cost: must be at least 0, got {req.restart_cost_s:g}")
    try:
        config = load_config(req.runtime_config) if req.runtime_config is not None else RuntimeConfig()
    except ValueError as exc:
        raise SimInputError(f"--runtime-config: {exc}") from None
    if req.runtime_model is RuntimeModel.IDEAL:
        if req.runtime_config is not None or req.checkpoint_interval_s is not None or req.restart_cost_s is not None:
            raise SimInputError("--runtime-model: ideal takes no --runtime-config, --checkpoint-interval or "
                                "--restart-cost (it runs at full speed with instant checkpoints)")
        return None
    changes: dict[str, float] = {}
    if req.checkpoint_interval_s is not None:
        changes["checkpoint_interval_s"] = req.checkpoint_interval_s
    if req.restart_cost_s is not None:
        changes["restart_cost_s"] = req.restart_cost_s
    return dataclasses.replace(config, **changes) if changes else config


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic collector off for the block, as it was after.

    The engine turns it off while it replays (Engine.run), but a run keeps the whole replay alive while it
    summarizes and writes: with the collector back on, each young collection walks the hundreds of thousands of
    objects the replay made while it was off (they were never aged), and the summary, the CSVs and the plots paid a
    second and more for collections that found nothing (the replay is still alive)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def run(req: SimRequest, progress: Progress | None = None,
        forecast_progress: ForecastProgress | None = None) -> SimOutcome:
    """Simulate and write every output file. Raises SimInputError (or TraceError / ValueError from the loaders)
    before anything is simulated when an input is bad."""
    with _gc_paused():
        return _run(req, progress, forecast_progress)


def _run(req: SimRequest, progress: Progress | None, forecast_progress: ForecastProgress | None) -> SimOutcome:
    if req.forecast < 0:
        raise SimInputError(f"--forecast: must be at least 0 (jobs to forecast), got {req.forecast}")
    if req.failures_per_1000_gpu_h < 0:
        raise SimInputError(f"--failures: must be at least 0, got {req.failures_per_1000_gpu_h:g}")
    config = runtime_config(req)
    trace, servers, tree = load_inputs(req)
    options = SimOptions(policy=req.policy, borrowing=req.borrowing,
                         failures_per_1000_gpu_h=req.failures_per_1000_gpu_h, seed=req.seed,
                         runtime=config, relax=req.relax, reservations=req.reservations,
                         reserve_after_s=req.reserve_after_s, reserve_behind=req.reserve_behind,
                         history_by=req.history_by, history_prior=req.history_prior,
                         las_thresholds_gpu_s=req.las_thresholds_gpu_s)
    engine = Engine(trace, servers, tree, options)
    forecasts = SubmitForecasts(engine, req.forecast, req.forecast_settings, forecast_progress) if req.forecast \
        else None
    engine.after_arrivals = forecasts
    result = engine.run(progress)
    capacity = total_gpus(servers)
    load = metrics.load_factor(trace.gpu_seconds(), capacity, trace.span_s)
    inputs: dict[str, object] = {
        "trace": str(req.trace), "format": req.fmt, "cluster": req.cluster, "servers": len(servers),
        "queues": str(req.queues) if req.queues else None, "policy": req.policy.value if req.policy else None,
        "borrowing": result.borrowing,
        "window": list(req.window) if req.window else None, "failures_per_1000_gpu_h": req.failures_per_1000_gpu_h,
        "seed": req.seed, "relax": req.relax.value, "trace_rows_fixed": len(trace.fixed),
        "elastic_share": req.elastic_share, "elastic_max": req.elastic_max,
        "elastic_jobs": sum(1 for j in trace.jobs if j.max_gpus),
        "reservations": req.reservations, "reserve_after_s": req.reserve_after_s,
        "reserve_behind": req.reserve_behind,
        "history_by": req.history_by, "history_prior_jobs": len(req.history_prior),
        "las_thresholds_gpu_s": list(req.las_thresholds_gpu_s),
        "trace_rows_skipped": len(trace.skipped), "forecast": req.forecast,
    }
    extra: dict[str, object] = {}
    if forecasts is not None:
        extra["forecast"] = forecasts.summary(result.results)
    summary = metrics.summarize(result.results, result.timeline, capacity, load, result.wall_s,
                                extra={**extra, "inputs": inputs, "events": result.events,
                                       **result.extra,
                                       "borrowing": {"policy": result.borrowing,
                                                     "preemptions": result.borrow_preemptions},
                                       "runtime": {"model": req.runtime_model.value,
                                                   **(dataclasses.asdict(config) if config else {})}})
    req.out.mkdir(parents=True, exist_ok=True)
    metrics.write_summary(req.out, summary)
    metrics.write_jobs_csv(req.out, result.results)
    metrics.write_queue_timeline_csv(req.out, result.timeline)
    files = [req.out / metrics.SUMMARY_FILE, req.out / metrics.JOBS_FILE, req.out / metrics.QUEUE_TIMELINE_FILE]
    if forecasts is not None:
        files.append(forecasts.write_csv(req.out, result.results))
    if req.plots:
        from gpurm.sim.plots import write_plots  # matplotlib is slow to import: only when plotting
        files += write_plots(req.out, result.results, result.timeline, capacity,
                             placement=config is not None)
    return SimOutcome(summary, result, trace, files)
