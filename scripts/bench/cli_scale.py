"""The operator's tools at fleet scale (see cli_scale): `gpurm nodes`, `gpurm jobs --all`, the REST lists and the
web UI's overview against a real RM holding N simulated servers and J finished jobs."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpurm.common.jobspec import JobSpec  # noqa: E402
from gpurm.common.model import Job, JobState  # noqa: E402
from gpurm.proto import gpurm_pb2 as pb  # noqa: E402
from gpurm.rm.storage.store import SqliteStore  # noqa: E402
from scripts.bench.rm_scale import FleetProc, note  # noqa: E402
from tests.conftest import run_broker  # noqa: E402
from tests.integration.rmproc import USER, RMProcess  # noqa: E402

USERS = 50
QUEUES = 8
STATES = (JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


class SeededRM(RMProcess):
    """The RM restores every seeded job before it serves: minutes on a busy machine."""

    def start(self, timeout: float = 600.0, standby: bool = False) -> None:
        super().start(timeout, standby)


def seed_jobs(state_dir: Path, count: int) -> None:
    """`count` finished jobs in the RM's store, as if it had run them (restored into memory at start)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(state_dir / "state.db")
    now = time.time()
    batch: list[Job] = []
    for i in range(1, count + 1):
        spec = JobSpec(gpus=1 << (i % 4), command=["/bin/sh", "-c", "python train.py"], name=f"sweep-{i % 997}",
                       queue=f"team{i % QUEUES}", workdir="/tmp")
        state = STATES[i % len(STATES)]
        t = now - 3600 + i * 0.01
        batch.append(Job(job_id=f"job-{i}", spec=spec, user=f"user{i % USERS}", queue=f"root.team{i % QUEUES}",
                         submit_time=t, seq=i, state=state, start_time=t + 1, finish_time=t + 60,
                         diagnostics="exit 0" if state is JobState.SUCCEEDED else "ended", admitted=True))
        if len(batch) == 10_000:
            store.save(batch, [], [], {"next_job_seq": str(i + 1), "next_container_seq": "1"})
            batch = []
    if batch:
        store.save(batch, [], [], {"next_job_seq": str(count + 1), "next_container_seq": "1"})
    store.close()


def timed_command(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a gpurm command: seconds to its first output line and to its end, its CPU seconds (user + system: what
    a shared machine's load does not change), lines and bytes written."""
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gpurm.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, env=env)
    assert proc.stdout is not None
    first = 0.0
    lines = size = 0
    for line in proc.stdout:
        if not first:
            first = time.perf_counter() - began
        lines += 1
        size += len(line)
    err = proc.stderr.read().decode() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    total = time.perf_counter() - began
    if code != 0:
        raise SystemExit(f"gpurm {' '.join(args)} exited {code}: {err[-500:]}")
    return {"first_s": first, "total_s": total, "cpu_s": usage.ru_utime + usage.ru_stime, "lines": lines,
            "bytes": size}


def raw_pages(rm: RMProcess, method: str, request: Any) -> dict[str, Any]:
    """The RM's own answer: every page of a list over gRPC, nothing formatted (the raw limit)."""
    call = getattr(rm.client, method)
    began = time.perf_counter()
    rows = pages = 0
    first = 0.0
    while True:
        reply = call(request, metadata=rm.metadata, timeout=120)
        pages += 1
        first = first or time.perf_counter() - began
        rows += len(reply.nodes) if method == "ListNodes" else len(reply.jobs) or reply.json_count
        if not reply.next_page_token:
            break
        request.page_token = reply.next_page_token
    return {"first_s": first, "total_s": time.perf_counter() - began, "rows": rows, "pages": pages}


def timed_get(url: str) -> dict[str, Any]:
    began = time.perf_counter()
    req = urllib.request.Request(url, headers={"X-Gpurm-User": USER})
    with urllib.request.urlopen(req, timeout=120) as resp:
        body = resp.read()
    return {"total_s": time.perf_counter() - began, "bytes": len(body)}


def browser_render(url: str, work: Path) -> dict[str, Any] | None:
    """Headless Chromium opening the overview: seconds until the page has loaded (None: no Chromium here)."""
    import shutil

    chrome, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chrome is None or driver is None:
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1360,1000", f"--user-data-dir={work / 'chromium'}"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        drv.set_page_load_timeout(120)
        drv.get(f"{url}/view-as?user={USER}")
        began = time.perf_counter()
        drv.get(url + "/")
        loaded = time.perf_counter() - began
        size = len(drv.page_source)
    finally:
        drv.quit()
    return {"total_s": loaded, "bytes": size}


COMMANDS: list[tuple[str, list[str]]] = [
    ("nodes (table)", ["nodes"]),
    ("nodes -o json", ["nodes", "-o", "json"]),
    ("jobs --limit 0 (table)", ["jobs", "--limit", "0"]),
    ("jobs --limit 0 -o json", ["jobs", "--limit", "0", "-o", "json"]),
    ("jobs --user user7 --limit 0 -o json", ["jobs", "--user", "user7", "--limit", "0", "-o", "json"]),
]
FILTERED: list[tuple[str, list[str]]] = [
    ("nodes --rack rack7 -o json", ["nodes", "--rack", "rack7", "-o", "json"]),
    ("nodes --free 8 --state RUNNING", ["nodes", "--free", "8", "--state", "RUNNING"]),
    ("nodes --name 'n000*' -o json", ["nodes", "--name", "n000*", "-o", "json"]),
    ("jobs --all --name 'sweep-1?' (table)", ["jobs", "--all", "--name", "sweep-1?"]),
    ("jobs --all --state FAILED -o json", ["jobs", "--all", "--state", "FAILED", "-o", "json"]),
]


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gpurm-cli-scale-"))
    result: dict[str, Any] = {"nodes": args.nodes, "jobs": args.jobs, "workdir": str(work), "commands": {},
                              "raw": {}, "http": {}}
    note(f"seeding {args.jobs} finished jobs into the store ...")
    began = time.perf_counter()
    seed_jobs(work / "rm-state", args.jobs)
    result["seed_s"] = time.perf_counter() - began
    with run_broker(work / "broker") as broker, contextlib.ExitStack() as stack:
        queues = work / "queues.yaml"
        queues.write_text(yaml.safe_dump({"queues": {f"team{q}": {"weight": 1} for q in range(QUEUES)}}))
        rm = SeededRM(work, broker, heartbeat=f"{args.interval}s", missed_beats=10, queues=str(queues),
                       retention={"memory": "never", "store": "never"})
        stack.callback(rm.close)
        fleet_args = types.SimpleNamespace(gpus=args.gpus, racks=max(1, args.nodes // 40), hold=5.0,
                                           ramp=args.nodes / 500, submit_only=True)
        note(f"starting {args.nodes} simulated servers ...")
        fleet = FleetProc(rm, fleet_args, 0, args.nodes, work / "fleet.log")      # type: ignore[arg-type]
        stack.callback(fleet.close)
        fleet.read()
        env = {**os.environ, "GPURM_RM": rm.address, "PYTHONPATH": str(ROOT)}
        info = rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10)
        http = info.http_url
        note("the raw limit: the RM's list pages over gRPC, unformatted ...")
        for when in ("first", "again"):       # the first listing after a start fills the RM's list views
            result["raw"][f"ListNodes ({when})"] = raw_pages(rm, "ListNodes", pb.ListNodesRequest(page_size=500))
            result["raw"][f"ListJobs ({when})"] = raw_pages(rm, "ListJobs", pb.ListJobsRequest(page_size=500))
        # What `gpurm jobs -o json` asks for: the pages as JSON text the RM writes (ListJobsRequest.json); the
        # first fills the RM's JSON text of the finished jobs, as the first listing above fills their views
        for when in ("first", "again"):
            result["raw"][f"ListJobs as JSON ({when})"] = raw_pages(rm, "ListJobs",
                                                                    pb.ListJobsRequest(page_size=500, json=True))
        commands = COMMANDS + (FILTERED if args.filters else [])
        for label, argv in commands:
            note(f"gpurm {' '.join(argv)} ...")
            result["commands"][label] = timed_command(argv, env)
        note("REST and the web UI ...")
        result["http"]["GET /api/v1/cluster"] = timed_get(f"{http}/api/v1/cluster")
        result["http"]["GET / (overview page)"] = timed_get(f"{http}/")
        result["http"]["GET /api/v1/nodes?limit=5000"] = timed_get(f"{http}/api/v1/nodes?limit=5000")
        result["http"]["GET /jobs (page)"] = timed_get(f"{http}/jobs")
        note("the overview in headless Chromium ...")
        shown = browser_render(http, work)
        if shown is not None:
            result["http"]["overview loaded in Chromium"] = shown
    return result


def table(r: dict[str, Any]) -> str:
    out = [f"{r['nodes']} simulated servers, {r['jobs']} finished jobs (this machine: 2 cores, shared)", "",
           f"{'what':44} {'first row':>10} {'total':>9} {'CPU':>7} {'rows/bytes':>14}"]
    for label, raw in r["raw"].items():
        out.append(f"{'raw: ' + label + ' pages over gRPC':44} {raw['first_s']:>9.2f}s {raw['total_s']:>8.2f}s "
                   f"{'':>7} {raw['rows']:>9} rows")
    for label, c in r["commands"].items():
        out.append(f"{'gpurm ' + label:44} {c['first_s']:>9.2f}s {c['total_s']:>8.2f}s {c['cpu_s']:>6.2f}s "
                   f"{c['lines']:>8} lines")
    for label, h in r["http"].items():
        out.append(f"{label:44} {'':>10} {h['total_s']:>8.2f}s {'':>7} {h['bytes']:>8} bytes")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description="gpurm's listings and web UI against a simulated fleet.",
                                 epilog="example: scripts/bench/cli_scale --nodes 10000 --jobs 100000")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per server")
    ap.add_argument("--jobs", type=int, default=100_000, help="finished jobs seeded into the store")
    ap.add_argument("--interval", type=float, default=10.0, help="heartbeat interval of the simulated servers")
    ap.add_argument("--filters", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the RM-side filters (--no-filters: a gpurm without them)")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    result = run(args)
    print(json.dumps(result, indent=1) if args.output == "json" else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
