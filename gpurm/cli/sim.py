"""`gpurm sim`: replay a trace through the real scheduler code on a virtual clock (see docs/sim.md)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpurm.cli.basics import CliError
from gpurm.cli.output import print_json, table
from gpurm.common.fields import format_duration, parse_duration
from gpurm.queues.tree import Borrowing, Policy
from gpurm.rm.forecast.records import ForecastSettings
from gpurm.rm.sched.behind import MAX_BEHIND
from gpurm.rm.sched.history import DEFAULT_CONDITIONING, LEVELS
from gpurm.rm.sched.prior import PriorError, load_prior
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S, las_thresholds_problem
from gpurm.rm.state.messages import RESERVATIONS, RESERVE_BEHIND
from gpurm.sim.metrics import LOCALITY_CLASSES, SIZE_CLASSES
from gpurm.sim.options import RelaxPolicy
from gpurm.sim.run import SimInputError, SimRequest, run
from gpurm.sim.runtime import RuntimeModel
from gpurm.sim.trace import FORMATS, TraceError, split_window

EXAMPLE = ("  gpurm sim --trace jobs-2017-10-02_to_10-15.csv --format philly-csv --cluster 8x8x8 --out /tmp/sim-fifo\n"
           "  gpurm sim --trace jobs.csv --format philly-csv --cluster 8x8x8 --policy las --borrowing las"
           " --queues configs/queues.yaml \\\n      --window 2017-10-03,2017-10-05 --failures 0.5 --seed 7"
           " --out /tmp/sim-las -o json\n"
           "  gpurm sim --trace jobs.csv --format philly-csv --cluster 8x8x8 --forecast 300 --no-plots"
           " --out /tmp/sim-forecast")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, metavar="FILE", help="the workload (a .gz file is read through gzip)")
    p.add_argument("--format", required=True, choices=FORMATS, help="the trace's format (see docs/sim.md)")
    p.add_argument("--cluster", required=True, metavar="SPEC",
                   help="RxNxG (R racks x N servers x G GPUs, e.g. 8x8x8) or a Philly cluster_machine_list file")
    p.add_argument("--queues", metavar="FILE", help="queue config (docs/queues.md); default: every queue of the "
                                                    "trace with weight 1 under root")
    p.add_argument("--policy", choices=[p.value for p in Policy],
                   help="every leaf's policy: fifo, las (Tiresias 2D-LAS, preempting inside a queue) or srtf (the "
                        "oracle: shortest remaining GPU-time first); default: the queue config's, else fifo")
    p.add_argument("--borrowing", choices=[b.value for b in Borrowing],
                   help="how GPUs beyond a queue's steady share are ordered across queues: fair (YARN: the queue "
                        "furthest below its share) or a policy (las, gittins, srtf) ranking every such job "
                        "cluster-wide, preempting worse-ranked borrowers; default: the queue config's `borrowing`, "
                        "else fair (docs/queues.md)")
    p.add_argument("--window", metavar="START,END", help="only jobs submitted in [START, END): dates "
                   "(2017-10-03 or '2017-10-03 12:00') for traces with dates, or offsets from the first submission "
                   "(0,2d or 6h,); either side may be empty")
    p.add_argument("--failures", type=float, default=0.0, metavar="RATE",
                   help="inject infrastructure failures: RATE per 1000 learner GPU-hours (Poisson); default 0")
    p.add_argument("--seed", type=int, default=0, help="random seed (back-off jitter, failures); default 0")
    p.add_argument("--runtime-model", choices=[m.value for m in RuntimeModel], default=RuntimeModel.PLACEMENT.value,
                   help="placement (default): a job's speed depends on how spread it is and who shares its servers' "
                        "links, and preemption loses work since the last checkpoint; ideal: full speed anywhere, "
                        "instant checkpoints (see docs/sim.md)")
    p.add_argument("--runtime-config", metavar="FILE",
                   help="YAML file of the placement model's constants (sim/runtime.py RuntimeConfig)")
    p.add_argument("--checkpoint-interval", metavar="DURATION",
                   help="placement model: how often a job checkpoints (e.g. 30m, 1800); default 30m")
    p.add_argument("--restart-cost", metavar="DURATION",
                   help="placement model: time an attempt after an interruption spends before making progress "
                        "(e.g. 60, 2m); default 60s")
    p.add_argument("--relax", choices=[r.value for r in RelaxPolicy], default=RelaxPolicy.TIMEOUT.value,
                   help="how every AM trades waiting for locality against running spread: timeout (default: wait "
                        "the locality timeout at each level), cost (wait while the time waited is below the run time "
                        "locality saves, the job's and its neighbours'; the trace's duration as the run time), "
                        "never (every job strict), "
                        "immediate (every job locality any)")
    p.add_argument("--elastic-share", type=float, default=0.0, metavar="F",
                   help="placement model: make this share of the jobs (0-1, drawn from the seed and job id) elastic, "
                        "growing on idle GPUs up to --elastic-max times their size and shrinking when others wait "
                        "(docs/sim.md); default 0")
    p.add_argument("--elastic-max", type=float, default=2.0, metavar="K",
                   help="with --elastic-share: an elastic job grows up to K times its GPUs (default 2)")
    p.add_argument("--reservations", type=int, default=RESERVATIONS, metavar="N",
                   help="reservations held at once for waiting jobs no placement fits, so that no job size starves "
                        f"(rm.yaml scheduler.reservations; 0: none); default {RESERVATIONS}")
    p.add_argument("--reserve-after", metavar="DURATION",
                   help="a waiting job may get a reservation once it has waited this long (rm.yaml "
                        "scheduler.reserve_after; e.g. 10m); default 0")
    p.add_argument("--reserve-behind", type=float, default=RESERVE_BEHIND, metavar="K",
                   help="a waiting job may get a reservation once it has waited K times what the one-GPU jobs "
                        "recently queued (at least 600 s; rm.yaml scheduler.reserve_behind; 0: as soon as it does "
                        f"not fit); default {RESERVE_BEHIND:g}")
    p.add_argument("--history-by", choices=list(LEVELS), default=DEFAULT_CONDITIONING, metavar="LEVEL",
                   help="what run-time estimates and gittins condition on: none, gpus, queue (and GPUs) or full "
                        f"(user and job name, then queue and GPUs; rm.yaml scheduler.history.group_by); default "
                        f"{DEFAULT_CONDITIONING}")
    p.add_argument("--history-prior", metavar="FILE",
                   help="a CSV of finished jobs the history starts from (gpus and duration_s or size_gpu_s; "
                        "queue, user, name optional; a jobs.csv of an earlier run serves): rm.yaml "
                        "scheduler.history.prior")
    p.add_argument("--las-thresholds", metavar="T1,T2,...",
                   help="las and gittins: the GPU-times (GPUs x duration: 1h is one GPU-hour) at which a job drops "
                        "a priority level, rising (rm.yaml preemption.las_thresholds); default "
                        + ",".join(f"{t / 3600:g}h" for t in LAS_THRESHOLDS_GPU_S))
    p.add_argument("--forecast", type=int, default=0, metavar="N",
                   help="measure start-time forecasts: forecast at most N jobs of each size class (every k-th "
                        "submitted) at their submission, as the RM does, and report their accuracy against a naive "
                        "baseline in summary.json's `forecast` (docs/sim.md, \"Start-time forecasts\"); each "
                        "costs three short replays; default 0 (off)")
    p.add_argument("--forecast-horizon", metavar="DURATION", default="7d",
                   help="with --forecast: replayed time a forecast looks ahead at most; default 7d")
    p.add_argument("--forecast-widen", type=float, default=ForecastSettings().widen, metavar="W",
                   help="with --forecast: the range's latest start is at least likely + W x the likely wait; "
                        f"default {ForecastSettings().widen:g} (rm.yaml forecast.widen)")
    p.add_argument("--out", required=True, metavar="DIR", help="where summary.json, jobs.csv and the plots go")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="table for people (default), json (the summary) for scripts")


def cmd_sim(args: argparse.Namespace) -> int:
    try:
        window = split_window(args.window) if args.window else None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    checkpoint = _duration_flag("--checkpoint-interval", args.checkpoint_interval)
    restart = _duration_flag("--restart-cost", args.restart_cost)
    reserve_after = _duration_flag("--reserve-after", args.reserve_after)
    thresholds = _las_thresholds(args.las_thresholds)
    if args.reservations < 0:
        raise CliError(f"--reservations: must be 0 or more, got {args.reservations}")
    if not 0 <= args.reserve_behind <= MAX_BEHIND:
        raise CliError(f"--reserve-behind: must be 0 to {MAX_BEHIND:g}, got {args.reserve_behind:g}")
    try:
        prior = load_prior(Path(args.history_prior)) if args.history_prior else ()
    except PriorError as exc:
        raise CliError(f"--history-prior: {exc}") from None
    try:
        fsettings = ForecastSettings(horizon_s=_duration_flag("--forecast-horizon", args.forecast_horizon) or 1.0,
                                     widen=args.forecast_widen)
    except ValueError as exc:
        raise CliError(f"--forecast-widen: {exc}") from None
    if args.forecast < 0:
        raise CliError(f"--forecast: must be 0 or more, got {args.forecast}")
    req = SimRequest(trace=Path(args.trace), fmt=args.format, cluster=args.cluster, out=Path(args.out),
                     queues=Path(args.queues) if args.queues else None,
                     policy=Policy(args.policy) if args.policy else None,
                     borrowing=Borrowing(args.borrowing) if args.borrowing else None, window=window,
                     failures_per_1000_gpu_h=args.failures, seed=args.seed, plots=not args.no_plots,
                     runtime_model=RuntimeModel(args.runtime_model),
                     runtime_config=Path(args.runtime_config) if args.runtime_config else None,
                     checkpoint_interval_s=checkpoint, restart_cost_s=restart, relax=RelaxPolicy(args.relax),
                     elastic_share=args.elastic_share, elastic_max=args.elastic_max,
                     reservations=args.reservations, reserve_after_s=reserve_after or 0.0,
                     reserve_behind=args.reserve_behind,
                     history_by=args.history_by, history_prior=prior, las_thresholds_gpu_s=thresholds,
                     forecast=args.forecast,
                     forecast_settings=fsettings)
    if req.plots:
        missing = plotting_missing()
        if missing:      # before the replay, which may take minutes, not after it
            raise CliError(missing)
    progress = _Progress()
    try:
        outcome = run(req, progress, progress.forecasts if req.forecast else None)
    except (SimInputError, TraceError, ValueError) as exc:
        raise CliError(str(exc)) from None
    progress.done()
    if args.output == "json":
        print_json(outcome.summary)
        return 0
    _print_summary(outcome.summary)
    print(f"\nwrote {', '.join(p.name for p in outcome.files)} to {req.out}")
    return 0


def plotting_missing() -> str:
    """Why the plots cannot be drawn here (matplotlib is not installed), with the fix; empty when they can."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        return ""
    return (f"the plots need matplotlib, which {sys.executable} lacks: install it with "
            f"`{sys.executable} -m pip install 'matplotlib>=3.8'` (or `pip install 'gpurm[sim]'`), "
            "or pass --no-plots")


def _duration_flag(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise CliError(f"{flag}: {exc}") from None


def _las_thresholds(text: str | None) -> tuple[float, ...]:
    """`--las-thresholds`: comma-separated GPU-times, as rm.yaml's preemption.las_thresholds."""
    if text is None:
        return LAS_THRESHOLDS_GPU_S
    out = tuple(_duration_flag("--las-thresholds", part.strip()) or 0.0 for part in text.split(",") if part.strip())
    problem = las_thresholds_problem(out)
    if problem:
        raise CliError(f"--las-thresholds: {problem}, got {text[:60]!r}")
    return out


class _Progress:
    """One line on stderr: simulated time, jobs finished, wall time (rewritten in place on a terminal)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False
        self.forecast_text = ""

    def forecasts(self, made: int, planned: int) -> None:
        self.forecast_text = f", forecasts {made}/{planned}"

    def __call__(self, sim_now: float, finished: int, total: int) -> None:
        wall = time.monotonic() - self.start
        if not self.tty and wall - self.last < 5.0:
            return
        self.last = wall
        line = (f"simulating: {finished}/{total} jobs done ({100 * finished / max(total, 1):.0f}%), "
                f"simulated {format_duration(sim_now)}{self.forecast_text}, {wall:.0f}s")
        sys.stderr.write(f"\r{line}\033[K" if self.tty else line + "\n")
        sys.stderr.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _num(value: object, unit: str = "s") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and unit == "s":
        return format_duration(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _share(value: object) -> str:
    return "-" if not isinstance(value, float | int) else f"{100 * value:.0f}%"


def _runtime_line(s: dict[str, object]) -> str:
    runtime = s.get("runtime")
    if not isinstance(runtime, dict):
        return "-"
    if runtime.get("model") != "placement":
        return str(runtime.get("model"))
    return (f"placement (checkpoint every {format_duration(float(runtime['checkpoint_interval_s']))}, "
            f"restart {format_duration(float(runtime['restart_cost_s']))})")


def _borrowing_line(s: dict[str, object]) -> str:
    b = s.get("borrowing")
    if not isinstance(b, dict):
        return "-"
    if b.get("policy") == "fair":
        return "fair (the queue furthest below its share)"
    return f"{b.get('policy')} ({b.get('preemptions')} borrowers preempted)"


def _fairness_line(s: dict[str, object]) -> str:
    f = s.get("fairness")
    if not isinstance(f, dict) or not f.get("worst_queue"):
        return "none (no queue waited below its share)"
    return (f"{f['worst_queue']}: {_num(f['max_below_share_s'])} ({100 * float(f['max_below_share_fraction']):.1f}% "
            f"of the makespan); mean over queues {_num(f['mean_below_share_s'])}")


def _print_summary(s: dict[str, object]) -> None:
    rows: list[list[object]] = [
        ["jobs", f"{s['jobs']} ({s['finished']} finished)"],
        ["GPUs", s["gpus"]],
        ["load factor", _num(s["load_factor"], "")],
        ["makespan", _num(s["makespan_s"])],
        ["JCT avg / p50 / p99", " / ".join(_num(s[k]) for k in ("avg_jct_s", "p50_jct_s", "p99_jct_s"))],
        ["queueing avg / p99", " / ".join(_num(s[k]) for k in ("avg_queue_s", "p99_queue_s"))],
        ["GPU utilization", _num(s["gpu_utilization"], "")],
        ["locality", _num(s["locality"], "")],
        ["preemptions / retries", f"{s['preemptions']} / {s['retries']}"],
        ["borrowed GPUs ordered by", _borrowing_line(s)],
        ["run-time model", _runtime_line(s)],
        ["mean placement slowdown", _num(s["mean_slowdown"], "")],
        ["GPU-hours lost: preemption / failures",
         f"{_num(s['gpu_hours_lost_preemption'], '')} / {_num(s['gpu_hours_lost_failures'], '')}"],
        ["time below fair share: worst queue", _fairness_line(s)],
        ["JCT excess over the trace avg / p99",
         " / ".join(_num(s[k]) for k in ("avg_jct_excess_s", "p99_jct_excess_s"))],
        ["wall time", f"{s['wall_s']:.1f}s"],
    ]
    table(["FIGURE", "VALUE"], rows)
    by_size = s["queue_by_size"]
    assert isinstance(by_size, dict)
    print()
    table(["JOB SIZE (GPUs)", *SIZE_CLASSES], [["avg queueing", *(_num(by_size[c]) for c in SIZE_CLASSES)]])
    by_class, p99, ratio = s["queue_by_class"], s["queue_p99_by_class"], s["queue_ratio_by_class"]
    packed, counts = s["locality_by_size"], s["jobs_by_class"]
    assert isinstance(by_class, dict) and isinstance(packed, dict) and isinstance(p99, dict)
    assert isinstance(ratio, dict) and isinstance(counts, dict)
    classes = ("1", *LOCALITY_CLASSES)
    print()
    table(["JOBS BY SIZE (GPUs)", *classes],
          [["finished", *(counts[c] for c in classes)],
           ["avg queueing", *(_num(by_class[c]) for c in classes)],
           ["p99 queueing", *(_num(p99[c]) for c in classes)],
           ["avg queueing / one-GPU's", *("-" if ratio[c] is None else f"{ratio[c]:.1f}x" for c in classes)],
           ["on the fewest servers", "", *(_share(packed[c]) for c in LOCALITY_CLASSES)]])
    per_queue = s["per_queue"]
    assert isinstance(per_queue, dict)
    print()
    qrows: list[list[object]] = []
    for name, q in sorted(per_queue.items(), key=lambda kv: -float(kv[1]["gpu_time_share"])):
        qrows.append([name, q["jobs"], _num(q["avg_jct_s"]), _num(q["avg_queue_s"]), q["preemptions"],
                      f"{100 * q['gpu_time_share']:.1f}%", _num(q.get("below_share_s", 0.0))])
    table(["QUEUE", "JOBS", "AVG JCT", "AVG QUEUEING", "PREEMPTED", "GPU-TIME SHARE", "BELOW SHARE"], qrows)
    forecast = s.get("forecast")
    if isinstance(forecast, dict):
        print()
        _print_forecast(forecast)


def _print_forecast(f: dict[str, object]) -> None:
    """The forecasts' accuracy: the replay's against the naive baseline's, all jobs and per size class."""
    by_class = f["by_class"]
    assert isinstance(by_class, dict)
    rows: list[list[object]] = []
    for name, g in [("all", f), *by_class.items()]:
        assert isinstance(g, dict)
        base = g["baseline"]
        assert isinstance(base, dict)
        rows.append([name, g["measured"], _num(g["median_actual_wait_s"]), _num(g["median_abs_error_s"]),
                     _num(g["p90_abs_error_s"]), _share(g["coverage"]), _num(base["median_abs_error_s"]),
                     _num(base["p90_abs_error_s"])])
    print(f"start-time forecasts: {f['forecast']} of {f['sampled']} sampled jobs waited at submission "
          f"({f['started_at_once']} started at once); {_num(f['wall_s'])} forecasting")
    table(["SIZE (GPUs)", "MEASURED", "MEDIAN WAIT", "MEDIAN ERROR", "P90 ERROR", "IN RANGE",
           "BASELINE MEDIAN", "BASELINE P90"], rows)
