"""The RM at scale (see rm_scale): a real RM, a real broker and SQLite store, N simulated agents, K submitters."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpurm.common.callers import USER_KEY  # noqa: E402
from gpurm.proto import gpurm_pb2 as pb  # noqa: E402
from gpurm.proto import gpurm_pb2_grpc as pbg  # noqa: E402
from gpurm.rm.storage.postgres import PostgresStore  # noqa: E402
from gpurm.rm.storage.store import SqliteStore  # noqa: E402
from tests.conftest import run_broker  # noqa: E402
from tests.integration.rmproc import USER, RMProcess  # noqa: E402
from tests.pg import run_postgres  # noqa: E402

ECHO_SERVER = """
import asyncio, sys, grpc
async def main():
    ident = lambda b: b
    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req, ident, ident)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


def note(text: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ---------------------------------------------------------------- raw limits


async def echo_rate(clients: int, seconds: float) -> float:
    """Unary calls/s a bare grpc.aio server answers to `clients` concurrent callers (the gRPC ceiling)."""
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/bench.Echo/Echo")
            payload = b"x" * 200
            end = time.perf_counter() + seconds
            done = 0

            async def one() -> None:
                nonlocal done
                while time.perf_counter() < end:
                    await call(payload, timeout=10)
                    done += 1

            began = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(clients)))
            return done / (time.perf_counter() - began)
    finally:
        proc.kill()
        proc.wait()


def commit_rate(folder: Path, seconds: float, pg_url: str = "") -> float:
    """Durable commits/s, one small row each: SQLite (WAL, synchronous=FULL: the RM's store settings), or the
    PostgreSQL database `pg_url` (a server with fsync on)."""
    store: SqliteStore | PostgresStore = PostgresStore(pg_url) if pg_url else SqliteStore(folder / "commit-bench.db")
    try:
        end = time.perf_counter() + seconds
        n = 0
        began = time.perf_counter()
        while time.perf_counter() < end:
            store.save([], [], [], {"bench": str(n)})
            n += 1
        return n / (time.perf_counter() - began)
    finally:
        store.close()


# ---------------------------------------------------------------- the RM process


def proc_usage(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds) of a process, from /proc."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def metrics_text(rm: RMProcess) -> str:
    info = json.loads((rm.state_dir / "rm.json").read_text())
    text: str = urllib.request.urlopen(info["http_url"] + "/metrics", timeout=30).read().decode()
    return text


def buckets(text: str, name: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets (upper bound, count) from the RM's /metrics text."""
    out = []
    for line in text.splitlines():
        m = re.match(rf'^{name}_bucket\{{le="([^"]+)"\}} (\S+)$', line)
        if m:
            out.append((float(m.group(1)), float(m.group(2))))
    return out


def bucket_pct(now: list[tuple[float, float]], before: list[tuple[float, float]], q: float) -> float:
    """The q-quantile's bucket bound in ms, of what was observed between two scrapes (an upper bound)."""
    base = dict(before)
    diff = [(le, n - base.get(le, 0.0)) for le, n in now]
    total = diff[-1][1] if diff else 0
    return next((le * 1000 for le, n in diff if total and n >= q * total), 0.0)


def scrape(rm: RMProcess) -> dict[str, Any]:
    """The RM's loss counters, its event loop's lag (p50 / p99 from the histogram's buckets, in ms) and the
    buckets of its own allocate handling time (gpurm_allocate_seconds)."""
    text = metrics_text(rm)
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = re.match(r"^(gpurm_(?:nodes_lost|containers_lost)_total) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    lag = buckets(text, "gpurm_event_loop_lag_seconds")
    out["loop_lag_p50_ms"] = bucket_pct(lag, [], .5)
    out["loop_lag_p99_ms"] = bucket_pct(lag, [], .99)
    for name in ("allocate", "schedule_pass", "store_commit"):
        out[f"{name}_buckets"] = buckets(text, f"gpurm_{name}_seconds")
    return out


class FleetProc:
    def __init__(self, rm: RMProcess, args: argparse.Namespace, first: int, nodes: int, log: Path,
                 extra: tuple[str, ...] = ()) -> None:
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts/bench/rm_scale_fleet.py"), "--rm", rm.address,
             "--keys", str(rm.state_dir / "token.key"), "--nodes", str(nodes), "--first", str(first),
             "--gpus", str(args.gpus), "--racks", str(args.racks), "--hold", str(args.hold),
             "--ramp", str(args.ramp), *(["--no-ams"] if args.submit_only else []), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})

    def ask(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.read()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        if not text:
            raise SystemExit(f"the fleet exited ({self.proc.poll()}); see {self.log.name}")
        reply: dict[str, Any] = json.loads(text)
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---------------------------------------------------------------- profiling


def start_profile(pid: int, path: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the RM (100 Hz, stacks by function) until stop_profile; collapsed stacks into `path`."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("--profile needs py-spy: pip install py-spy (into .venv)")
    proc = subprocess.Popen([spy, "record", "-p", str(pid), "-f", "raw", "-F", "--nonblocking", "-o", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)            # attached before what is measured starts
    return proc


def stop_profile(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)     # py-spy writes its file and exits
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def profile_summary(path: Path, top: int = 25) -> list[tuple[str, float, float]]:
    """(function, % of samples on the stack, % of samples at the top) from py-spy's collapsed stacks, the
    functions most on the stack first: where the RM's time goes."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [re.sub(r" \(([^)]*?)(?::\d+)?\)$", r" (\1)", f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + count
        own[frames[-1]] = own.get(frames[-1], 0) + count
    # The frames that only wrap a whole thread (main(), Thread.run, ...) say nothing: left out.
    ranked = sorted(((f, n) for f, n in inclusive.items() if own.get(f, 0) or n < 0.4 * total),
                    key=lambda kv: -kv[1])[:top]
    return [(f, 100 * n / total, 100 * own.get(f, 0) / total) for f, n in ranked] if total else []


# ---------------------------------------------------------------- submitting


async def submit_all(address: str, jobs: int, clients: int, sizes: list[int], queues: int
                     ) -> tuple[list[str], list[float], float]:
    """Submit `jobs` jobs from `clients` concurrent callers; (acknowledged ids, latencies, seconds)."""
    ids: list[str] = []
    lat: list[float] = []
    counter = iter(range(jobs))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pbg.ClientStub(channel)

        async def one() -> None:
            for i in counter:
                spec = pb.JobSpec(name=f"scale-{i}", gpus=sizes[i % len(sizes)], command=["/bin/true"],
                                  workdir="/tmp", queue=f"team{i % queues}")
                t = time.perf_counter()
                reply = await stub.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                             metadata=((USER_KEY, USER),), timeout=60)
                lat.append(time.perf_counter() - t)
                ids.append(reply.job_id)
                if len(ids) % 500 == 0:
                    note(f"submitted {len(ids)}/{jobs}")

        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        return ids, lat, time.perf_counter() - began


async def probe(address: str, jobs: int, rate: float, sizes: list[int]) -> list[str]:
    """Submit `jobs` jobs one at a time, `rate` a second, on an otherwise idle cluster: their submit-to-granted
    latency is the pipeline's, not time spent queued behind a burst."""
    ids = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pbg.ClientStub(channel)
        for i in range(jobs):
            began = time.perf_counter()
            spec = pb.JobSpec(name=f"probe-{i}", gpus=sizes[i % len(sizes)], command=["/bin/true"], workdir="/tmp",
                              queue="team0")
            reply = await stub.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                         metadata=((USER_KEY, USER),), timeout=60)
            ids.append(reply.job_id)
            await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - began)))
    return ids


def wait_granted(fleets: list[FleetProc], jobs: int, timeout: float) -> dict[str, Any]:
    began = time.perf_counter()
    while True:
        stats = fleet_stats(fleets)
        if stats["granted"] >= jobs or time.perf_counter() - began > timeout:
            return stats
        time.sleep(0.5)


def wait_drained(fleets: list[FleetProc], timeout: float) -> None:
    """Until every AM the fleet started has finished (the burst's backlog is through)."""
    began = time.perf_counter()
    while time.perf_counter() - began < timeout:
        stats = fleet_stats(fleets)
        if stats["am_finished"] + stats["am_errors"] >= stats["am_started"]:
            return
        time.sleep(1)


async def missing_jobs(address: str, ids: list[str]) -> int:
    """How many acknowledged jobs the RM does not know (after a restart: lost acknowledged writes)."""
    missing = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pbg.ClientStub(channel)
        sem = asyncio.Semaphore(16)

        async def check(job_id: str) -> None:
            nonlocal missing
            async with sem:
                try:
                    await stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=30)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is grpc.StatusCode.NOT_FOUND:
                        missing += 1
                    else:
                        raise

        await asyncio.gather(*(check(j) for j in ids))
    return missing


# ---------------------------------------------------------------- the run


def fleet_stats(fleets: list[FleetProc]) -> dict[str, Any]:
    """The processes' stats together: counts summed, p99s their worst, a p50 from the process with the most
    samples of it (each process's own lag is reported as the worst of them)."""
    parts = [f.ask("stats") for f in fleets]
    out = dict(parts[0])
    for prefix, count in (("beat", "beats"), ("allocate", "allocates"), ("granted", "granted"),
                          ("register", "registrations")):
        out[f"{prefix}_p50_ms"] = max(parts, key=lambda p, c=count: p[c])[f"{prefix}_p50_ms"]  # type: ignore[misc]
    for key in ("fleet_lag_p50_ms", "fleet_lag_p99_ms"):
        out[key] = max(p[key] for p in parts)
    out["am_process_lag_p99_ms"] = max((p["fleet_lag_p99_ms"] for p in parts if p["nodes"] == 0), default=0.0)
    for key in ("nodes", "up", "beats", "allocates", "granted", "registrations", "reregister_asked",
                "stream_breaks", "watchdog_breaks", "silent_writing", "silent_unanswered", "am_started",
                "am_finished", "am_errors", "live_containers"):
        out[key] = sum(p[key] for p in parts)
    for key in ("beat_p99_ms", "beat_max_ms", "allocate_p99_ms", "granted_p99_ms", "register_p99_ms",
                "interval_max_s"):
        out[key] = max(p[key] for p in parts)
    out["interval_min_s"] = min((p["interval_min_s"] for p in parts if p["nodes"]), default=0.0)
    return out


def wait_up(fleets: list[FleetProc], nodes: int, timeout: float) -> float:
    began = time.perf_counter()
    while time.perf_counter() - began < timeout:
        up = sum(f.ask("up")["up"] for f in fleets)
        if up >= nodes:
            return time.perf_counter() - began
        time.sleep(0.2)
    return float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gpurm-rm-scale-"))
    result: dict[str, Any] = {"nodes": args.nodes, "gpus_per_node": args.gpus, "heartbeat_s": args.interval,
                              "jobs": args.jobs, "clients": args.clients, "workdir": str(work),
                              "forecast": args.forecast, "forecast_interval": args.forecast_interval}
    with contextlib.ExitStack() as stack:
        store_url = ""
        if args.store == "postgresql":
            # A PostgreSQL server of its own, fsync on (docs/operations.md): the RM's store and the raw limit's.
            work.chmod(0o711)       # the server runs as `postgres` when we are root: it must reach its dir
            server = stack.enter_context(run_postgres(work / "postgres", durable=True))
            store_url = server.create_database()
            result["store"] = "postgresql"
        note(f"raw limits (gRPC echo with {args.clients} callers, {args.store} commits) ...")
        result["raw_echo_per_s"] = asyncio.run(echo_rate(args.clients, 3.0))
        result["raw_commit_per_s"] = commit_rate(work, 2.0, server.create_database() if store_url else "")
        return _run(args, work, result, store_url)


def _run(args: argparse.Namespace, work: Path, result: dict[str, Any], store_url: str) -> dict[str, Any]:
    with run_broker(work / "broker") as broker:
        queues = work / "queues.yaml"         # teams: jobs go round them (each queue acquires 16 at a time)
        queues.write_text(yaml.safe_dump({"queues": {f"team{q}": {"weight": 1} for q in range(args.queues)}}))
        rm = RMProcess(work, broker, heartbeat=f"{args.interval}s", missed_beats=args.missed_beats,
                       heartbeat_more={k: v for k, v in (("max_rate", args.max_rate),
                                                          ("max_interval", args.max_interval)) if v is not None},
                       am={"allocate_interval": "500ms"}, queues=str(queues),
                       # every agent holds a heartbeat stream, one concurrent RPC each: room for them and the rest
                       limits={"max_concurrent_rpcs": args.nodes + 10_000},
                       # start-time forecasts (rm/forecast/): on by default in the RM; `--forecast off` for the
                       # allocate figures without them, `--forecast-interval 1s` to replay as often as the budget lets
                       forecast={"enabled": args.forecast == "on", "interval": args.forecast_interval},
                       **({"store": {"url": store_url}} if store_url else {}))
        fleets: list[FleetProc] = []
        try:
            per = -(-args.nodes // args.fleets)
            note(f"starting {args.nodes} simulated nodes ({args.fleets} process(es)"
                 f"{', their AMs in another' if args.separate_ams else ''}) ...")
            began = time.perf_counter()
            ranges = [(f * per, min(per, args.nodes - f * per), work / f"fleet{f}.sock") for f in range(args.fleets)]
            node_extra: tuple[str, ...] = ()
            if args.separate_ams:
                # The AMs in a process of their own: the nodes' heartbeats do not delay their calls (what the
                # allocate figures measure), as on a real cluster, where AMs and agents are separate processes.
                ams = FleetProc(rm, args, 0, 0, work / "ams.log",
                                tuple(x for first, n, sock in ranges for x in ("--relay", f"{sock}:{first}:{n}")))
                node_extra = ("--cm-port", str(ams.read()["cm_port"]))
                fleets.append(ams)
            for first, count, sock in ranges:
                fleets.append(FleetProc(rm, args, first, count, work / f"fleet{first // per}.log",
                                        (*node_extra, "--reports", str(sock)) if node_extra else ()))
            for f in fleets[1 if args.separate_ams else 0:]:
                f.read()
            result["register_all_s"] = time.perf_counter() - began
            note(f"all {args.nodes} nodes registered in {result['register_all_s']:.1f}s; {args.duration:g}s of "
                 "heartbeats alone ...")
            for f in fleets:
                f.ask("reset")
            rss0, cpu0 = proc_usage(rm.proc.pid)   # type: ignore[union-attr]
            fleet_cpu0 = [proc_usage(f.proc.pid)[1] for f in fleets]
            t0 = time.perf_counter()
            time.sleep(args.duration)
            rss1, cpu1 = proc_usage(rm.proc.pid)   # type: ignore[union-attr]
            fleet_cpu = [proc_usage(f.proc.pid)[1] - c for f, c in zip(fleets, fleet_cpu0, strict=True)]
            result["steady"] = fleet_stats(fleets)
            result["fleet_cpu_pct"] = [100 * c / (time.perf_counter() - t0) for c in fleet_cpu]
            result["machine_load"] = os.getloadavg()[0]
            result.update(rm_rss_mib=rss1, rm_cpu_pct=100 * (cpu1 - cpu0) / (time.perf_counter() - t0),
                          rm_rss_start_mib=rss0, beats_per_s=result["steady"]["beats"] / (time.perf_counter() - t0))
            result["lost_before_restart"] = scrape(rm)
            note(f"heartbeat p99 {result['steady']['beat_p99_ms']:.0f} ms; now {args.jobs} submits from "
                 f"{args.clients} clients ...")
            for f in fleets:
                f.ask("reset")
            cpu0 = proc_usage(rm.proc.pid)[1]   # type: ignore[union-attr]
            before = result["lost_before_restart"]
            t0 = time.perf_counter()
            spy = start_profile(rm.proc.pid, args.profile) if args.profile else None   # type: ignore[union-attr]
            ids, lat, secs = asyncio.run(submit_all(rm.address, args.jobs, args.clients, args.sizes, args.queues))
            burst_cpu = proc_usage(rm.proc.pid)[1] - cpu0      # type: ignore[union-attr]
            if spy is not None:
                stop_profile(spy)
                result["profile"] = profile_summary(args.profile)
            result.update(submits=len(ids), submit_s=secs, submits_per_s=len(ids) / secs,
                          rm_cpu_per_submit_ms=1000 * burst_cpu / max(len(ids), 1),
                          submit_p50_ms=pct(lat, .5) * 1000, submit_p99_ms=pct(lat, .99) * 1000)
            note(f"{len(ids)} submits in {secs:.1f}s ({len(ids) / secs:.0f}/s); waiting for their jobs to finish ...")
            if not args.submit_only:
                wait_drained(fleets, 300)
            result["load"] = fleet_stats(fleets)
            result["rm_cpu_load_pct"] = 100 * (proc_usage(rm.proc.pid)[1] - cpu0) / (time.perf_counter() - t0)  # type: ignore[union-attr]
            result["lost_before_restart"] = scrape(rm)
            after = result["lost_before_restart"]
            for name in ("allocate", "schedule_pass", "store_commit"):
                for q in (50, 99):
                    result[f"rm_{name}_p{q}_ms"] = bucket_pct(after[f"{name}_buckets"], before[f"{name}_buckets"],
                                                              q / 100)
            note(f"then {args.probe} jobs at {args.probe_rate:g}/s for submit-to-granted ...")
            for f in fleets:
                f.ask("reset")
            ids += asyncio.run(probe(rm.address, args.probe, args.probe_rate, args.sizes))
            result["probe"] = wait_granted(fleets, args.probe, 5 if args.submit_only else 60)
            if args.restart:
                for f in fleets:
                    f.ask("reset")
                note("SIGKILL the RM and start it again ...")
                rm.kill()
                began = time.perf_counter()
                rm.start(timeout=120)
                result["restart_serving_s"] = time.perf_counter() - began
                result["restart_resync_s"] = wait_up(fleets, args.nodes, 300) + result["restart_serving_s"]
                note(f"serving after {result['restart_serving_s']:.1f}s, every node back after "
                     f"{result['restart_resync_s']:.1f}s; watching for losses for {args.watch:g}s ...")
                time.sleep(args.watch)
                result["lost_after_restart"] = scrape(rm)
                result["after_restart"] = fleet_stats(fleets)
                result["rm_rss_after_restart_mib"] = proc_usage(rm.proc.pid)[0]   # type: ignore[union-attr]
                note("checking every acknowledged job survived ...")
                result["acknowledged"] = len(ids)
                result["acknowledged_jobs_missing"] = asyncio.run(missing_jobs(rm.address, ids))
        finally:
            for f in fleets:
                f.close()
            rm.close()
    return result


def table(r: dict[str, Any]) -> str:
    q = r["steady"]
    s = r["load"]
    lost = r["lost_before_restart"]
    rows = [
        ("nodes x GPUs, heartbeat", f"{r['nodes']} x {r['gpus_per_node']}, every {r['heartbeat_s']:g}s (rm.yaml)"),
        ("interval the RM named", f"{q.get('interval_min_s', 0):g}-{q.get('interval_max_s', 0):g} s (the nodes' "
                                  f"at the end); {r.get('beats_per_s', 0):.0f} beats/s answered, heartbeats alone"),
        ("register all nodes", f"{r['register_all_s']:.1f} s"),
        ("heartbeat RTT p50 / p99 / max", f"{q['beat_p50_ms']:.1f} / {q['beat_p99_ms']:.1f} / "
                                          f"{q['beat_max_ms']:.0f} ms ({q['beats']} beats, heartbeats alone)"),
        ("  ... during the submit burst", f"{s['beat_p50_ms']:.1f} / {s['beat_p99_ms']:.1f} / "
                                          f"{s['beat_max_ms']:.0f} ms"),
        ("nodes / containers marked LOST", f"{lost.get('gpurm_nodes_lost_total', 0):.0f} / "
                                           f"{lost.get('gpurm_containers_lost_total', 0):.0f}"),
        ("acknowledged submits/s", f"{r['submits_per_s']:.0f} ({r['submits']} jobs, {r['clients']} clients; "
                                   f"p50 {r['submit_p50_ms']:.1f} ms, p99 {r['submit_p99_ms']:.1f} ms)"),
        ("RM CPU per acknowledged submit", f"{r['rm_cpu_per_submit_ms']:.2f} ms (the RM's CPU during the burst, "
                                           "its heartbeats and AM launches included, / submits)"),
        ("submit to granted p50 / p99", f"{r['probe']['granted_p50_ms']:.0f} / {r['probe']['granted_p99_ms']:.0f} "
                                        f"ms ({r['probe']['granted']} jobs submitted one by one)"),
        ("allocate p50 / p99, AMs' side", f"{s['allocate_p50_ms']:.1f} / {s['allocate_p99_ms']:.1f} ms "
                                          f"({s['allocates']} calls; includes the fleet's own lag)"),
        ("allocate p50 / p99, RM's side", f"<= {r['rm_allocate_p50_ms']:g} / <= {r['rm_allocate_p99_ms']:g} ms "
                                          "(gpurm_allocate_seconds buckets, the burst and its jobs)"),
        ("  ... its pass / commit p50 / p99", f"<= {r['rm_schedule_pass_p50_ms']:g} / "
                                              f"<= {r['rm_schedule_pass_p99_ms']:g} ms scheduling pass, "
                                              f"<= {r['rm_store_commit_p50_ms']:g} / "
                                              f"<= {r['rm_store_commit_p99_ms']:g} ms store commit"),
        ("RM RSS / CPU", f"{r['rm_rss_mib']:.0f} MiB / {r['rm_cpu_pct']:.0f}% of a core (heartbeats alone), "
                         f"{r['rm_cpu_load_pct']:.0f}% (submits and their jobs)"),
        ("RM event loop lag p50 / p99", f"<= {lost.get('loop_lag_p50_ms', 0):g} / <= {lost.get('loop_lag_p99_ms', 0):g}"
                                        f" ms (histogram buckets, since start)"),
        ("simulated fleet CPU, heartbeats alone", ", ".join(f"{c:.0f}%" for c in r.get("fleet_cpu_pct", []))
                                                  + f" of a core per process (the AMs' first); machine load "
                                                    f"{r.get('machine_load', 0):.1f} (2 cores)"),
        ("simulated fleet loop lag p50 / p99", f"{q['fleet_lag_p50_ms']:.0f} / {q['fleet_lag_p99_ms']:.0f} ms, "
                                               f"{s['fleet_lag_p99_ms']:.0f} ms p99 in the burst (RTTs include it)"
                                               + (f"; the AMs' process {s['am_process_lag_p99_ms']:.0f} ms"
                                                  if s["am_process_lag_p99_ms"] else "")),
        ("AMs started / finished / errors", f"{s['am_started']} / {s['am_finished']} / {s['am_errors']}"),
    ]
    if "restart_serving_s" in r:
        a = r["after_restart"]
        la = r["lost_after_restart"]
        rows += [
            ("restart: serving again", f"{r['restart_serving_s']:.1f} s"),
            ("restart: every node re-registered", f"{r['restart_resync_s']:.1f} s"),
            ("restart: nodes / containers LOST", f"{la.get('gpurm_nodes_lost_total', 0):.0f} / "
                                                 f"{la.get('gpurm_containers_lost_total', 0):.0f}"),
            ("restart: acknowledged jobs missing", f"{r['acknowledged_jobs_missing']} of {r['acknowledged']}"),
            ("restart: heartbeat p99, register p99", f"{a['beat_p99_ms']:.0f} ms, {a['register_p99_ms']:.0f} ms"),
            ("restart: RM RSS", f"{r['rm_rss_after_restart_mib']:.0f} MiB"),
        ]
    rows += [("raw: bare gRPC echo", f"{r['raw_echo_per_s']:.0f} calls/s ({r['clients']} callers)"),
             (f"raw: durable {'PostgreSQL' if r.get('store') else 'SQLite'} commits",
              f"{r['raw_commit_per_s']:.0f} commits/s")]
    width = max(len(k) for k, _ in rows)
    out = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    if r.get("profile"):
        out += ("\n\nthe RM during the submits (py-spy samples of every thread): % on the stack, % at its top "
                "(Runner.run: gRPC and uvloop's own C work; SqliteStore.write: the writer thread's commits)\n"
                ) + "\n".join(
            f"{inc:5.1f}% {own:5.1f}%  {name[:110]}" for name, inc, own in r["profile"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description="A real RM against N simulated agents and K submitting clients.",
        epilog="example: scripts/bench/rm_scale --nodes 10000 --jobs 2000 --restart")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    ap.add_argument("--racks", type=int, default=0, help="racks (default: nodes / 40)")
    ap.add_argument("--interval", type=float, default=3.0, help="heartbeat interval, seconds")
    ap.add_argument("--missed-beats", type=int, default=10, help="a node is LOST after this many missed beats")
    ap.add_argument("--max-rate", type=float, help="rm.yaml heartbeat.max_rate: the fleet's beats a second, at "
                                                    "most (the RM lengthens the interval; 0: never; default: the "
                                                    "RM's)")
    ap.add_argument("--max-interval", help="rm.yaml heartbeat.max_interval (default: the RM's)")
    ap.add_argument("--jobs", type=int, default=2000, help="jobs to submit")
    ap.add_argument("--clients", type=int, default=16, help="concurrent submitting clients")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16],
                    help="job sizes in GPUs, used in turn")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of heartbeats alone, before the submits")
    ap.add_argument("--queues", type=int, default=8, help="leaf queues (teams) the jobs go round")
    ap.add_argument("--probe", type=int, default=50, help="jobs submitted one by one for submit-to-granted")
    ap.add_argument("--probe-rate", type=float, default=10.0, help="their rate, jobs/s")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds a job holds its GPUs once granted")
    ap.add_argument("--ramp", type=float, default=0.0, help="seconds over which nodes first register (0: nodes/500)")
    ap.add_argument("--fleets", type=int, default=1, help="processes the simulated nodes are spread over")
    ap.add_argument("--separate-ams", action=argparse.BooleanOptionalAction, default=True,
                    help="run the simulated AMs in a process of their own (default), not beside the nodes")
    ap.add_argument("--submit-only", action="store_true",
                    help="AMs start but never register: jobs queue behind the AM slots (submitting into a full "
                         "cluster), and the RM serves submits and heartbeats alone")
    ap.add_argument("--restart", action="store_true", help="then SIGKILL the RM, restart it, count losses")
    ap.add_argument("--watch", type=float, default=0.0, help="after a restart, watch this long for losses "
                                                             "(default: 2 node expiries)")
    ap.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite",
                    help="the RM's store: SQLite in its state dir (default), or a PostgreSQL server the benchmark "
                         "starts (initdb, fsync on) on a free port")
    ap.add_argument("--profile", type=Path, help="sample the RM with py-spy during the submit burst; its "
                                                  "collapsed stacks go to this file, the top functions into the "
                                                  "output (needs py-spy in .venv)")
    ap.add_argument("--forecast", choices=["on", "off"], default="on",
                    help="the RM's start-time forecasts (rm.yaml forecast.enabled; default on, as the RM's)")
    ap.add_argument("--forecast-interval", default="30s", help="rm.yaml forecast.interval (default the RM's, 30s)")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    args.racks = args.racks or max(1, args.nodes // 40)
    args.ramp = args.ramp or args.nodes / 500
    args.watch = args.watch or 2 * args.interval * args.missed_beats
    result = run(args)
    print(json.dumps(result, indent=1) if args.output == "json" else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
