"""gpurm's simulator beside Tiresias' own (see tiresias_compare): the same workloads, the same policies."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpurm.sim.trace import Trace, load_trace
from gpurm.sim.workloads import TiresiasStyle, tiresias_style, to_tiresias_csv

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests/data/philly/jobs-2017-10-02_to_10-15.csv"
GPURM = Path(sys.executable).with_name("gpurm")
# N servers x 4 GPUs under one switch, CPUs and memory as in Tiresias' n32g4.csv (they never bind here).
SPEC = "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,{servers},4,40,256\n"
# (row, Tiresias' --schedule, gpurm's --policy). dlas-gpu is its 2D-LAS (its paper's), dlas-gpu-gittins its
# discretized 2D-Gittins (the las queues, the index inside a queue); its `gittins` is a single queue by index.
PAIRS = (("fifo", "fifo", "fifo"), ("2D-LAS", "dlas-gpu", "las"), ("2D-Gittins", "dlas-gpu-gittins", "gittins"),
         ("gittins", "gittins", "gittins"))
# Runs run_sim.py unchanged under Python 2.7 or 3: Python 3 has no sys.maxint, and its `gittins` schedule reads
# JOBS.job_dist_data, which its main() never sets (it crashes on the first job without this).
BOOT = """import sys
sys.maxint = getattr(sys, 'maxint', sys.maxsize)
sys.path.insert(0, '.')
import run_sim
def parse_job_dist(load=run_sim.parse_job_dist):
    run_sim.JOBS.job_dist_data = load()
    return run_sim.JOBS.job_dist_data
run_sim.parse_job_dist = parse_job_dist
run_sim.main()
"""
MISSING = """--tiresias DIR: Tiresias' simulator folder is needed ({got}). gpurm does not ship it:
  git clone https://github.com/SymbioticLab/Tiresias    # then pass --tiresias Tiresias/simulator
It runs under Python 2.7 with numpy (its README; give it with --python), else under this venv's Python 3."""


@dataclasses.dataclass
class Figures:
    jobs: int
    jct_s: float
    queue_s: float        # first start - submit, as gpurm's avg_queue_s
    preemptions: int


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiresias", help="Tiresias' simulator folder (a checkout's simulator/): needed")
    parser.add_argument("--python", help="interpreter for Tiresias (default: python2.7 or python2 if they import "
                                         "numpy, else this one)")
    parser.add_argument("--trace", action="append",
                        help="compare on this Tiresias CSV (times in whole seconds) instead (repeatable)")
    parser.add_argument("--source", default=str(SOURCE), help="philly-csv trace the workload's durations come from")
    parser.add_argument("--jobs", type=int, default=480)
    parser.add_argument("--servers", type=int, default=15, help="servers of 4 GPUs, one switch (default 15)")
    parser.add_argument("--loads", default="1.0,1.5,2.0", help="comma-separated offered loads (default 1.0,1.5,2.0)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated workload (and gpurm) seeds")
    parser.add_argument("--gpurm-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG to every gpurm sim (repeatable), e.g. --gpurm-arg=--relax=immediate")
    parser.add_argument("--locality", help="give gpurm the trace as jsonl with this locality for every job (JSON, "
                                           "docs/sim.md), e.g. '{\"mode\": \"any\", \"timeout\": \"7d\"}'")
    parser.add_argument("--workdir", help="keep the traces and both simulators' logs here (default: a temp dir)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    tiresias = Path(args.tiresias or ".").resolve()
    if not args.tiresias or not (tiresias / "run_sim.py").is_file():
        parser.exit(2, MISSING.format(got=f"{tiresias} has no run_sim.py" if args.tiresias else "none given") + "\n")
    python = args.python or interpreter()
    locality = json.loads(args.locality) if args.locality else None
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tiresias-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = work / f"n{args.servers}g4.csv"
    spec.write_text(SPEC.format(servers=args.servers))
    print(f"Tiresias' simulator: {tiresias} under {python}, --schedule {', '.join(s for _, s, _ in PAIRS)}; "
          f"gpurm sim --runtime-model ideal --policy {', '.join(dict.fromkeys(p for *_, p in PAIRS))} "
          f"{' '.join(args.gpurm_arg)}{' with locality ' + args.locality if locality else ''}; work in {work}")
    cases: list[tuple[str, Path, int, str]] = []      # (name, trace, seed, the group averaged over)
    if args.trace:
        cases = [(Path(t).name, Path(t).resolve(), 0, Path(t).name) for t in args.trace]
    else:
        source = load_trace(Path(args.source), "philly-csv")
        for load in [float(x) for x in args.loads.split(",") if x.strip()]:
            for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
                path = work / f"load{load:g}-seed{seed}.csv"
                path.write_text(to_tiresias_csv(whole_seconds(tiresias_style(
                    TiresiasStyle(jobs=args.jobs, servers=args.servers, load=load, seed=seed), source))))
                cases.append((f"load {load:g} seed {seed}", path, seed, f"load {load:g}"))
    results: dict[str, dict[str, Figures]] = {}
    for name, path, seed, _ in cases:
        runs = results[name] = {}
        out = work / path.stem
        for policy in dict.fromkeys(p for _, _, p in PAIRS):
            runs["gpurm " + policy] = run_gpurm(path, policy, seed, f"1x{args.servers}x4", out / f"gpurm-{policy}",
                                                args.gpurm_arg, locality)
        for _, schedule, _ in PAIRS:
            runs["tiresias " + schedule] = run_tiresias(tiresias, python, path, schedule, out, spec)
        table(name, runs)
    for group in dict.fromkeys(g for *_, g in cases):
        runs_of = [results[n] for n, *_, g in cases if g == group]
        if len(runs_of) > 1:
            table(f"{group}, mean of seeds {args.seeds}", {k: mean([r[k] for r in runs_of]) for k in runs_of[0]})
    if args.json:
        Path(args.json).write_text(json.dumps({n: {k: dataclasses.asdict(f) for k, f in r.items()}
                                               for n, r in results.items()}, indent=2) + "\n")
    return 0


def mean(figures: list[Figures]) -> Figures:
    return Figures(round(statistics.fmean(f.jobs for f in figures)),
                   statistics.fmean(f.jct_s for f in figures), statistics.fmean(f.queue_s for f in figures),
                   round(statistics.fmean(f.preemptions for f in figures)))


def interpreter() -> str:
    """Python 2.7 as Tiresias' README asks, where it has numpy; else this Python (BOOT fills in sys.maxint)."""
    for name in ("python2.7", "python2"):
        found = shutil.which(name)
        if found and subprocess.run([found, "-c", "import numpy"], capture_output=True, check=False).returncode == 0:
            return found
    return sys.executable


def whole_seconds(trace: Trace) -> Trace:
    """Submit times and durations to the second: Tiresias reads a field as a number only if it is all digits
    (jobs.py add_job), so "12.5" would stay a string and sort as one."""
    jobs = [dataclasses.replace(j, submit_s=float(round(j.submit_s)), duration_s=float(max(1, round(j.duration_s))))
            for j in trace.jobs]
    return dataclasses.replace(trace, jobs=jobs)


def run_gpurm(trace: Path, policy: str, seed: int, cluster: str, out: Path, extra: list[str],
              locality: dict[str, object] | None) -> Figures:
    fmt = "tiresias"
    if locality is not None:
        fmt, trace = "jsonl", jsonl(trace, locality, out.with_suffix(".jsonl"))
    cmd = [str(GPURM), "sim", "--trace", str(trace), "--format", fmt, "--cluster", cluster, "--runtime-model",
           "ideal", "--policy", policy, "--seed", str(seed), "--no-plots", "-o", "json", "--out", str(out), *extra]
    summary = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    with (out / "jobs.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["jct_s"]]
    if len(rows) != summary["jobs"]:
        print(f"  gpurm {policy}: only {len(rows)} of {summary['jobs']} jobs finished")
    return Figures(len(rows), statistics.fmean(float(r["jct_s"]) for r in rows),
                   statistics.fmean(float(r["queue_s"]) for r in rows), sum(int(r["preemptions"]) for r in rows))


def jsonl(trace: Path, locality: dict[str, object], path: Path) -> Path:
    """The Tiresias CSV as a jsonl trace whose every job has `locality` (to try gpurm's AM settings on it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with trace.open(newline="") as f:
        path.write_text("".join(json.dumps({"id": r["job_id"], "submit": float(r["submit_time"]),
                                            "gpus": int(r["num_gpu"]), "duration": float(r["duration"]),
                                            "name": r.get("model_name", ""), "locality": locality}) + "\n"
                                for r in csv.DictReader(f)))
    return path


def run_tiresias(sim: Path, python: str, trace: Path, schedule: str, out: Path, spec: Path) -> Figures:
    logs = out / f"tiresias-{schedule}"
    cmd = [python, "-c", BOOT, f"--cluster_spec={spec}", "--scheme=yarn", f"--trace_file={trace}",
           f"--schedule={schedule}", f"--log_path={logs}"]
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / "stdout.txt").open("w") as stdout:
        subprocess.run(cmd, cwd=sim, stdout=stdout, stderr=subprocess.STDOUT, check=True)
    with (logs / "job.csv").open(newline="") as f:      # one row per finished job (its log.py)
        rows = list(csv.DictReader(f))
    with trace.open(newline="") as f:
        total = sum(1 for _ in csv.DictReader(f))
    if len(rows) != total:
        print(f"  tiresias {schedule}: only {len(rows)} of {total} jobs finished")
    return Figures(len(rows), statistics.fmean(float(r["JCT"]) for r in rows),
                   statistics.fmean(float(r["start_time"]) - float(r["submit_time"]) for r in rows),
                   sum(int(r["preempt"]) for r in rows))


def table(name: str, runs: dict[str, Figures]) -> None:
    print(f"\n{name}: average JCT (average queueing: first start - submit), preemptions")
    print(f"  {'policy':<11}{'Tiresias':>27}{'gpurm':>27}{'JCT gpurm/Tiresias':>20}")
    for row, schedule, policy in PAIRS:
        t, g = runs["tiresias " + schedule], runs["gpurm " + policy]
        print(f"  {row:<11}" + "".join(f"{f.jct_s:>9,.0f}s ({f.queue_s:>6,.0f}s) {f.preemptions:>5}p" for f in (t, g))
              + f"{g.jct_s / t.jct_s:>19.3f}x")


if __name__ == "__main__":
    raise SystemExit(main())
