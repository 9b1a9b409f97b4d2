"""Right-sizing evaluation (see rightsize): record phased learners' usage series on a real dev cluster, then
compare reservation policies on them (gpurm/rightsize/policies.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpurm.rightsize.phases import discover
from gpurm.rightsize.policies import ADAPTIVE_WINDOW, compare, table
from gpurm.rightsize.series import SERIES_FILE, Sample, SeriesError, parse_series

ROOT = Path(__file__).resolve().parents[2]
LEARNER = ROOT / "scripts" / "workloads" / "phased_learner.py"
EXAMPLE = """examples:
  scripts/bench/rightsize                                  # 3 learners on a dev cluster, sampled every 0.25 s
  scripts/bench/rightsize --jobs 4 --scale 2 --save-fixture tests/data/rightsize/learner.jsonl
  scripts/bench/rightsize --series tests/data/rightsize/learner.jsonl   # offline, no cluster"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpurm(address: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "GPURM_RM": address}, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"gpurm {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def record(jobs: int, interval: float, scale: float, epochs: int, mem_mib: int, state: Path) -> list[list[Sample]]:
    """Run `jobs` phased learners (one GPU each) on a one-node dev cluster; return their learners' series."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    log = (state / "dev-cluster.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpurm.cli.main", "dev-cluster", "--nodes", "1", "--racks", "1",
         "--gpus-per-node", str(max(jobs, 1)), "--state-dir", str(state), "--port", str(port), "--http-port", "0",
         "--agent-option", f"telemetry.container_interval={interval}s",
         "--agent-option", f"telemetry.interval={interval}s"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(OSError, ValueError):
                if json.loads((state / "cluster.json").read_text()).get("ready"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dev-cluster did not start; see {state / 'dev-cluster.log'}")
            time.sleep(0.2)
        ckpt = state / "checkpoints"     # the jobs may run as another user (nobody): a sticky shared folder
        ckpt.mkdir()
        os.chmod(ckpt, 0o1777)
        ids = [gpurm(address, "submit", "--gpus", "1", "--max-retries", "0", "--name", f"phased-{i}", "--",
                     sys.executable, str(LEARNER), "--scale", str(scale), "--epochs", str(epochs),
                     "--mem-mib", str(mem_mib), "--out", str(ckpt / f"phased-{i}.bin")).strip()
               for i in range(jobs)]
        print(f"recording {jobs} phased learners ({', '.join(ids)}), sampled every {interval}s ...", flush=True)
        pending = set(ids)
        deadline = time.monotonic() + 60 + jobs * epochs * 14 * scale * 3
        while pending and time.monotonic() < deadline:
            for job_id in list(pending):
                status = json.loads(gpurm(address, "status", job_id, "-o", "json"))
                status["state"] = str(status.get("state", "")).removeprefix("JOB_")
                if status["state"] in ("SUCCEEDED", "FAILED", "KILLED"):
                    if status["state"] != "SUCCEEDED":
                        raise RuntimeError(f"{job_id} ended {status['state']}: {status.get('diagnostics', '')}")
                    pending.discard(job_id)
            time.sleep(1)
        if pending:
            raise RuntimeError(f"still running after the deadline: {sorted(pending)}")
        runs = []
        for path in sorted(state.glob(f"agents/*/containers/*-c*/{SERIES_FILE}")):
            runs.append(parse_series(path.read_text()))
        return runs
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, epilog=EXAMPLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", nargs="+", type=Path, help="evaluate these recorded usage.jsonl files (no cluster)")
    p.add_argument("--jobs", type=int, default=3, help="phased learners to record (default 3)")
    p.add_argument("--interval", type=float, default=0.25, help="the agents' sampling interval, s (default 0.25)")
    p.add_argument("--scale", type=float, default=1.0, help="the learner's seconds per phase unit (default 1)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per learner (default 2)")
    p.add_argument("--mem-mib", type=int, default=300, help="the learner's training buffer (default 300 MiB)")
    p.add_argument("--window", type=int, default=ADAPTIVE_WINDOW,
                   help=f"the adaptive policy's window, in samples (default {ADAPTIVE_WINDOW})")
    p.add_argument("--save-fixture", type=Path, help="write the first recorded series here")
    p.add_argument("--keep", action="store_true", help="keep the dev cluster's state dir")
    a = p.parse_args()
    if not (1 <= a.jobs <= 16 and 0.05 <= a.interval <= 60 and 0 < a.scale <= 60 and 1 <= a.epochs <= 20
            and a.window >= 1):
        p.error("--jobs 1-16, --interval 0.05-60, --scale 0-60, --epochs 1-20, --window >= 1")
    if a.series:
        try:
            runs = [parse_series(path.read_text()) for path in a.series]
        except (OSError, SeriesError) as exc:
            p.error(str(exc))
        source = f"{len(runs)} recorded series ({', '.join(str(s) for s in a.series)})"
    else:
        state = Path(tempfile.mkdtemp(prefix="gpurm-rightsize-"))
        os.chmod(state, 0o711)   # a job running as another user reaches its own container dir
        try:
            runs = record(a.jobs, a.interval, a.scale, a.epochs, a.mem_mib, state)
        finally:
            if not a.keep:
                shutil.rmtree(state, ignore_errors=True)
            else:
                print(f"state kept in {state}")
        source = (f"{len(runs)} phased learners on a dev cluster (scale {a.scale}, {a.epochs} epochs, "
                  f"{a.mem_mib} MiB buffer), sampled every {a.interval}s")
        if a.save_fixture and runs:
            a.save_fixture.parent.mkdir(parents=True, exist_ok=True)
            a.save_fixture.write_text("".join(s.line() + "\n" for s in runs[0]))
            print(f"saved {len(runs[0])} samples to {a.save_fixture}")
    runs = [r for r in runs if r]
    if not runs:
        print("no samples recorded", file=sys.stderr)
        return 1
    print(f"source: {source}; {sum(len(r) for r in runs)} samples")
    for i, r in enumerate(runs):
        print(f"  run {i}: {len(r)} samples over {r[-1].t - r[0].t:.1f}s: {discover(r).summary()}")
    print()
    print(table(compare(runs, a.window)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
