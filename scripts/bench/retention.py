"""RM restart cost and memory with N finished jobs in the store, without and with retention (see retention).

Fills a store with N finished jobs (each: a 2-learner attempt, its 2 learner containers and its AM container,
as SqliteStore.save writes them), then measures, each in a fresh process: SqliteStore.load + RMCore.restore time
and the process's RSS. Once as the store is (every job loaded: no retention), once after one retention pass
retired them all (rm.yaml retention.memory passed), which it also times. And the raw limits: bare SQLite rows
read per second, and JSON records parsed per second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import (
    Attempt,
    Container,
    ContainerKind,
    ContainerPhase,
    ExitKind,
    ExitStatus,
    Job,
    JobState,
    Learner,
)
from gpurm.rm.storage.store import SqliteStore

T0 = time.time() - 20 * 86400   # the jobs finish 20 to 8 days ago: past retention.memory, within store


def records(n: int) -> tuple[Job, list[Container]]:
    submit = T0 + n * 10
    job_id = f"job-{n}"
    spec = JobSpec(gpus=8, command=["python", "-m", "train", "--config", f"configs/run{n % 97}.yaml", "--epochs", "90"],
                   env={"WANDB_PROJECT": "llm-pretrain", "NCCL_DEBUG": "WARN", "DATA": "/datasets/c4/en"},
                   workdir="/home/alice/projects/llm")
    learners = [Learner(r, f"node{(n + r) % 64:03d}", [0, 1, 2, 3], f"{job_id}-c{2 * n + r}", f"node{r}.cluster",
                        "EXITED", 0, 0, 10000 + r) for r in range(2)]
    job = Job(job_id, spec, "alice" if n % 3 else "bob", "root.research.nlp" if n % 2 else "root.prod", submit,
              seq=n, state=JobState.SUCCEEDED, start_time=submit + 30, finish_time=submit + 3600,
              attempts=[Attempt(1, JobState.SUCCEEDED, submit + 30, submit + 3600, learners)],
              am_container=f"{job_id}-am1", am_node="node000", am_attempt=1, attained_gpu_s=8 * 3570.0,
              diagnostics="all learners exited 0", am_registered=[1])
    containers = [Container(ln.container_id, job_id, ContainerKind.LEARNER, ln.node_id, [0, 1, 2, 3], 1,
                            created=submit + 20, phase=ContainerPhase.COMPLETED, started=submit + 30,
                            finished=submit + 3600, exit=ExitStatus(ExitKind.EXITED, 0, 0, ""), user=job.user)
                  for ln in learners]
    containers.append(Container(f"{job_id}-am1", job_id, ContainerKind.AM, "node000", [], 1, created=submit,
                                phase=ContainerPhase.COMPLETED, started=submit + 1, finished=submit + 3601,
                                exit=ExitStatus(ExitKind.EXITED, 0, 0, ""), user=job.user))
    return job, containers


def fill(path: Path, jobs: int) -> float:
    store = SqliteStore(path)
    began = time.perf_counter()
    for start in range(1, jobs + 1, 5000):
        batch = [records(n) for n in range(start, min(jobs + 1, start + 5000))]
        store.save([j for j, _ in batch], [c for _, cs in batch for c in cs], [],
                   {"next_job_seq": str(jobs + 1), "next_container_seq": str(3 * jobs + 1)})
    store.close()
    return time.perf_counter() - began


def measure(path: Path) -> None:
    """In this (fresh) process: load + restore, then RSS; one JSON line."""
    from gpurm.rm.state.core import RMCore

    began = time.perf_counter()
    store = SqliteStore(path)
    snap = store.load()
    loaded = time.perf_counter()
    core = RMCore()
    core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, time.time(), snap.learned)
    del snap
    done = time.perf_counter()
    rss_kib = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    print(json.dumps({"load_s": loaded - began, "restore_s": done - loaded, "total_s": done - began,
                      "rss_mib": rss_kib / 1024, "jobs_in_memory": len(core.jobs),
                      "gittins_sizes": len(core.history.sizes())}))


def fresh(path: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--measure", str(path)], check=True, capture_output=True,
                         text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def baseline_rss() -> float:
    code = ("import gpurm.rm.state.core, gpurm.rm.storage.store, pathlib\n"
            "print([int(l.split()[1]) for l in pathlib.Path('/proc/self/status').read_text().splitlines()"
            " if l.startswith('VmRSS:')][0])")
    return int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout) / 1024


def retire_all(path: Path, memory_s: float) -> tuple[float, int]:
    """One RM start's retention work on an old store: load, then passes until nothing is due (timed)."""
    from gpurm.rm.state.core import RMCore
    from gpurm.rm.state.retention import Retention, RetentionSettings

    store = SqliteStore(path)
    snap = store.load()
    core = RMCore()
    core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, time.time(), snap.learned)
    ret = Retention(RetentionSettings(memory_s=memory_s))
    began = time.perf_counter()
    total = 0
    while True:
        p = ret.plan(core, time.time())
        if not p.retired:
            break
        store.retire(p.retired, p.purge_before, ret.settings.batch)
        ret.apply(core, p)
        total += len(p.retired)
    store.close()
    return time.perf_counter() - began, total


def raw_limits(path: Path) -> dict[str, float]:
    db = sqlite3.connect(path)
    began = time.perf_counter()
    rows = [data for (data,) in db.execute("SELECT data FROM jobs")]
    rows += [data for (data,) in db.execute("SELECT data FROM containers")]
    read_s = time.perf_counter() - began
    began = time.perf_counter()
    for data in rows:
        json.loads(data)
    parse_s = time.perf_counter() - began
    db.close()
    return {"sqlite_rows_per_s": len(rows) / read_s, "json_records_per_s": len(rows) / parse_s, "rows": len(rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        measure(args.measure)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="gpurm-retention-"))
    try:
        full = tmp / "full.db"
        fill_s = fill(full, args.jobs)
        size_mib = full.stat().st_size / 2**20
        print(f"store: {args.jobs} finished jobs ({3 * args.jobs} containers), {size_mib:.0f} MiB, "
              f"written in {fill_s:.1f} s")
        limits = raw_limits(full)
        print(f"raw limits: {limits['sqlite_rows_per_s']:,.0f} bare SQLite rows read/s, "
              f"{limits['json_records_per_s']:,.0f} JSON records parsed/s ({limits['rows']} rows)")
        base = baseline_rss()
        print(f"RSS of an empty RM core process: {base:.0f} MiB")
        without = fresh(full)
        print(f"no retention:   restart {without['total_s']:.2f} s (load {without['load_s']:.2f} s + restore "
              f"{without['restore_s']:.2f} s), RSS {without['rss_mib']:.0f} MiB, "
              f"{without['jobs_in_memory']:.0f} jobs in memory")
        kept = tmp / "retained.db"
        shutil.copy(full, kept)
        retire_s, retired = retire_all(kept, 3600.0)
        print(f"first retention pass over the old store: {retired} jobs retired in {retire_s:.1f} s "
              f"({retired / max(retire_s, 1e-9):,.0f} jobs/s)")
        with_ret = fresh(kept)
        print(f"with retention: restart {with_ret['total_s']:.2f} s (load {with_ret['load_s']:.2f} s + restore "
              f"{with_ret['restore_s']:.2f} s), RSS {with_ret['rss_mib']:.0f} MiB, "
              f"{with_ret['jobs_in_memory']:.0f} jobs in memory, the history keeps "
              f"{with_ret['gittins_sizes']:.0f} sizes")
        per_job_kib = (without["rss_mib"] - with_ret["rss_mib"]) * 1024 / args.jobs
        print(f"RSS per finished job in memory: {per_job_kib:.1f} KiB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
