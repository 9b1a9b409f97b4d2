"""Job commands: submit, jobs, status, kill, logs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import shlex
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpurm.cli.basics import PAGE_SIZE, CliError
from gpurm.cli.client import RM, connect, page_size_arg
from gpurm.cli.output import (
    JsonArray,
    Progress,
    StreamTable,
    ago,
    clock,
    print_json,
    ranges,
    span,
    table,
)
from gpurm.common import forecasttext
from gpurm.common.fields import ConfigError, format_duration, parse_duration
from gpurm.common.jobspec import (
    JobSpec,
    LocalityLevel,
    LocalityMode,
    Placement,
    parse_gpus_text,
    parse_job_yaml,
    parse_mib,
    parse_mount,
    share_text,
    spec_to_proto,
    validate_spec,
)
from gpurm.common.textsafe import escape_controls
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg

if TYPE_CHECKING:
    from gpurm.common import mqtt

STATE_NAMES = {v: k.removeprefix("JOB_") for k, v in pb.JobState.items()}
TERMINAL = (pb.JOB_SUCCEEDED, pb.JOB_FAILED, pb.JOB_KILLED)
CONTAINER_NAMES = {v: k.removeprefix("CONTAINER_") for k, v in pb.ContainerState.items()}
FAILURE_NAMES = {v: k.removeprefix("FAILURE_").lower() for k, v in pb.FailureKind.items()}


def gpus_text(spec: pb.JobSpec) -> str:
    """`4`, `4:16` for an elastic job, `0.5` for a job below one GPU (the forms `--gpus` takes)."""
    if spec.gpu_share_milli:
        return share_text(spec.gpu_share_milli)
    return f"{spec.gpus}:{spec.max_gpus}" if spec.max_gpus > spec.gpus else str(spec.gpus)


def state_name(state: int) -> str:
    return STATE_NAMES.get(state, "UNKNOWN")


# ---------------------------------------------------------------- submit


def _spec_from_args(args: argparse.Namespace) -> JobSpec:
    if args.file and args.command_argv:
        raise CliError("give a job file or a command after --, not both")
    if args.file:
        path = Path(args.file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise CliError(f"cannot read job file {args.file}: {exc.strerror}") from None
        try:
            spec = parse_job_yaml(text, source=args.file, base_dir=str(path.resolve().parent))
        except ConfigError as exc:
            raise CliError("; ".join(exc.problems)) from None
        if not spec.name:
            spec.name = path.stem
    elif args.command_argv:
        if args.gpus is None:
            raise CliError("--gpus: required with a command after --, e.g. gpurm submit --gpus 1 -- python x.py")
        spec = JobSpec(gpus=1, command=list(args.command_argv))
        spec.name = os.path.basename(args.command_argv[0])
    else:
        raise CliError("nothing to submit: give a job file (gpurm submit job.yaml) or a command "
                       "(gpurm submit --gpus 1 -- python train.py)")
    if args.gpus is not None:
        try:
            spec.gpus, spec.max_gpus, spec.gpu_share_milli = parse_gpus_text(str(args.gpus))
        except ValueError as exc:
            raise CliError(f"--gpus: {exc}") from None
    if args.queue:
        spec.queue = args.queue
    if args.name:
        spec.name = args.name
    if args.max_retries is not None:
        spec.max_retries = args.max_retries
    if args.workdir:
        spec.workdir = args.workdir
    _container_args(args, spec)
    if not spec.image:   # an image job's workdir is a path in its image (default: its own work dir, /gpurm/work)
        spec.workdir = os.path.abspath(spec.workdir or os.getcwd())
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"--env: expected NAME=VALUE, got {item!r}")
        spec.env[name] = value
    for flag, attr in (("locality_timeout", "timeout_s"), ("backoff_base", "backoff_base_s"),
                       ("backoff_max", "backoff_max_s")):
        value = getattr(args, flag)
        if value is not None:
            try:
                setattr(spec.locality, attr, parse_duration(value))
            except ValueError as exc:
                raise CliError(f"--{flag.replace('_', '-')}: {exc}") from None
    if args.start_level:
        spec.locality.start_level = LocalityLevel.parse(args.start_level)
    if getattr(args, "locality", None):
        spec.locality.mode = LocalityMode.parse(args.locality)
    if getattr(args, "placement", None):
        spec.placement = Placement.parse(args.placement)
    problems = validate_spec(spec)
    if problems:
        raise CliError("; ".join(problems))
    return spec


def _container_args(args: argparse.Namespace, spec: JobSpec) -> None:
    """--image, --mount (repeatable), --shm-size: over the file's."""
    if getattr(args, "image", None):
        spec.image = args.image
    for item in getattr(args, "mount", None) or []:
        try:
            spec.mounts.append(parse_mount(item))
        except ValueError as exc:
            raise CliError(f"--mount: {exc}") from None
    if getattr(args, "shm_size", None):
        try:
            spec.shm_size_mib = parse_mib(args.shm_size)
        except ValueError as exc:
            raise CliError(f"--shm-size: {exc}") from None


def cmd_submit(args: argparse.Namespace) -> int:
    spec = _spec_from_args(args)
    rm = connect(args)
    request = pb.SubmitJobRequest(spec=spec_to_proto(spec), submit_id=uuid.uuid4().hex)
    reply = rm.call(rm.client.SubmitJob, request)   # a retry returns the same job: the submit_id
    if args.output == "json":
        print_json({"job_id": reply.job_id, "queue": reply.queue})
    else:
        print(reply.job_id, flush=True)
    if args.wait:
        return wait_for_job(rm, reply.job_id, quiet_json=args.output == "json")
    return 0


def wait_for_job(rm: RM, job_id: str, quiet_json: bool = False) -> int:
    progress = Progress()
    while True:
        job = rm.call(rm.client.GetJob, pb.GetJobRequest(job_id=job_id))
        attempt = job.attempts[-1].attempt if job.attempts else 0
        if job.state in TERMINAL:
            progress.done()
            took = span(job.start_ms or job.submit_ms, job.finish_ms)
            text = f"{job_id} {state_name(job.state)} after {took}"
            if job.state != pb.JOB_SUCCEEDED and job.diagnostics:
                text += f": {job.diagnostics}"
            sys.stderr.write(text + "\n")
            return 0 if job.state == pb.JOB_SUCCEEDED else 1
        detail = job.waiting_reason or ""
        progress.update(f"{job_id} {state_name(job.state)} (attempt {attempt or '-'}, "
                        f"{span(job.submit_ms, 0)} since submit) {detail}")
        time.sleep(0.5)


def cmd_wait(args: argparse.Namespace) -> int:
    """Wait for jobs to end; exit 0 only if every one succeeded."""
    rm = connect(args)
    pending = list(dict.fromkeys(args.jobs))
    done: dict[str, pb.Job] = {}
    progress = Progress()
    deadline = time.monotonic() + args.timeout if args.timeout else None
    while pending:
        states = []
        for job_id in list(pending):
            job = rm.call(rm.client.GetJob, pb.GetJobRequest(job_id=job_id))
            if job.state in TERMINAL:
                done[job_id] = job
                pending.remove(job_id)
            else:
                states.append(f"{job_id} {state_name(job.state)}")
        if not pending:
            break
        if deadline is not None and time.monotonic() > deadline:
            progress.done()
            raise CliError(f"--timeout: still waiting after {args.timeout:g}s for {', '.join(pending)}", code=1)
        progress.update(f"waiting for {len(pending)} of {len(args.jobs)} jobs: " + ", ".join(states[:6]))
        time.sleep(0.5)
    progress.done()
    jobs = [done[j] for j in dict.fromkeys(args.jobs)]
    if args.output == "json":
        print_json([{"job_id": j.job_id, "state": state_name(j.state), "exit_code": j.exit_code,
                     "diagnostics": j.diagnostics} for j in jobs])
    else:
        for j in jobs:
            print(f"{j.job_id} {state_name(j.state)}" + (f": {j.diagnostics}" if j.state != pb.JOB_SUCCEEDED else ""))
    return 0 if all(j.state == pb.JOB_SUCCEEDED for j in jobs) else 1


# ---------------------------------------------------------------- jobs


JOB_HEADERS = ["JOB", "NAME", "USER", "QUEUE", "STATE", "GPUS", "ATT", "TIME", "START", "INFO"]


def cmd_jobs(args: argparse.Namespace) -> int:
    """The newest --limit matching jobs (0: all), oldest first, fetched and printed a page at a time."""
    rm = connect(args)
    if args.limit < 0:
        raise CliError(f"--limit: must be 0 (every job) or more, got {args.limit}")
    size = page_size_arg(args, PAGE_SIZE)
    states = [pb.JobState.Name(pb.JobState.Value(f"JOB_{s}")) for s in args.state]
    limit = args.limit
    request = pb.ListJobsRequest(states=states, queue=args.queue or "", user=args.user or "", limit=limit,
                                 page_size=min(limit, size) if limit else size, name=getattr(args, "name", "") or "",
                                 json=args.output == "json")
    pages = rm.pages(rm.client.ListJobs, request, limit)
    if args.output == "json":
        with JsonArray() as out:
            for reply in pages:
                left = limit - out.count if limit else None
                if reply.json_count:
                    out.extend_text(reply.json_items, reply.json_count, left)     # written by the RM
                else:
                    out.extend(reply.jobs[:left])        # an RM before ListJobsRequest.json
        return 0
    now = time.time()
    shown = 0
    preemptible = False
    rows = StreamTable(JOB_HEADERS, max_last=70)
    for reply in pages:
        jobs = list(reply.jobs[:limit - shown if limit else None])
        rows.add([job_row(j, now) for j in jobs])
        shown += len(jobs)
        preemptible = preemptible or any(j.preemptible for j in jobs)
    if not shown:
        print("no jobs" + (" match" if (states or args.queue or args.user or getattr(args, "name", "")) else " yet: "
                           "submit one with `gpurm submit --gpus 1 -- CMD`"))
        return 0
    if preemptible:
        print("* runs on borrowed GPUs beyond its queue's share: preemptible")
    return 0


_SPREAD = Placement.SPREAD.value


def job_row(j: pb.Job, now: float) -> list[object]:
    attempts = j.attempts
    attempt = attempts[-1].attempt if attempts else 0
    state = j.state
    spec = j.spec
    if state in TERMINAL:
        start_ms = j.start_ms
        elapsed = span(start_ms, j.finish_ms, now) if start_ms else "-"
        info = j.diagnostics
        if state == pb.JOB_FAILED and j.exit_code:
            info = f"exit {j.exit_code}: {info}"
    else:
        elapsed = span(j.start_ms, 0, now) if state == pb.JOB_RUNNING else "wait " + span(j.submit_ms, 0, now)
        info = j.waiting_reason
    gpus = gpus_text(spec) + ("*" if j.preemptible else "") + (" spread" if spec.placement == _SPREAD else "")
    return [j.job_id, spec.name or "-", j.user, j.queue.removeprefix("root."), STATE_NAMES.get(state, "UNKNOWN"),
            gpus, attempt or "-", elapsed, start_column(j, now), info]


def start_column(j: pb.Job, now: float) -> str:
    """A waiting job's forecast start (`~1h20m (40m-3h10m)`), else `-`."""
    if j.state in TERMINAL or j.state == pb.JOB_RUNNING or not j.HasField("forecast"):
        return "-"
    f = j.forecast
    return forecasttext.short(f.earliest_ms, f.likely_ms, f.latest_ms, f.horizon_ms, f.made_ms, now)


# ---------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace) -> int:
    rm = connect(args)
    job = rm.call(rm.client.GetJob, pb.GetJobRequest(job_id=args.job))
    if args.output == "json":
        print_json(job)
        return 0
    print(render_status(job))
    return 0


def describe_locality(loc: pb.LocalitySpec) -> str:
    """The job's locality setting as `gpurm status` shows it: mode, start level, timeout and back-off."""
    mode = loc.mode or "prefer"
    if mode == "any":
        return "any (does not wait for locality)"
    timeout = format_duration(loc.timeout_ms / 1000) if loc.timeout_ms else "1m"
    start = loc.start_level or "packed"
    what = "never relaxes past the best level the cluster allows" if mode == "strict" else "relaxes after"
    return f"{mode} (from {start}; {what} {timeout} per level)" if mode == "prefer" else \
        f"{mode} (from {start}; {what}; {timeout} per try)"


def describe_placement(spec: pb.JobSpec) -> str:
    """The job's placement as `gpurm status` shows it (docs/jobs.md, "Placement")."""
    if spec.placement != Placement.SPREAD.value:
        return "pack (the fewest servers)"
    mode = spec.locality.mode or "prefer"
    if mode == "any":
        return "spread (over as many servers as have a free GPU now, distinct racks first; does not wait)"
    how = "never more than the cluster's shape forces" if mode == "strict" else \
        "one more per server after each locality timeout"
    return f"spread (one GPU per server, distinct racks first; {how})"


def render_status(job: pb.Job, now: float | None = None) -> str:
    now = now or time.time()
    lines: list[str] = []
    spec = job.spec
    cmd = spec.command[2] if list(spec.command[:2]) == ["/bin/sh", "-c"] and len(spec.command) > 2 \
        else shlex.join(spec.command)

    def field(name: str, value: object) -> None:
        lines.append(f"{name + ':':<13}{value}")

    field("job", f"{job.job_id}  {spec.name}")
    field("user", job.user)
    field("queue", job.queue)
    state = state_name(job.state)
    if job.state in TERMINAL:
        state += f" after {span(job.start_ms or job.submit_ms, job.finish_ms, now)}"
        if job.state == pb.JOB_FAILED and job.exit_code:
            state += f" (exit code {job.exit_code})"
    field("state", state)
    held = f", holding {job.gpus_held}" if job.gpus_held else ""
    if spec.gpu_share_milli:
        held = " of one shared GPU" + (" (running on it)" if job.gpus_held else "")
    if spec.max_gpus > spec.gpus:
        target = job.target_gpus or spec.max_gpus
        held += f" (elastic {spec.gpus} to {spec.max_gpus}, target {target}: gpurm scale {job.job_id} N)"
    beyond = "  PREEMPTIBLE (runs beyond its queue's share)" if job.preemptible else ""
    field("gpus", f"{gpus_text(spec)}{held}{beyond}")
    field("command", cmd)
    field("workdir", spec.workdir or ("/gpurm/work (in its image)" if spec.image else "-"))
    if spec.image:
        mounts = ", ".join(f"{m.source}:{m.target}:{'rw' if m.writable else 'ro'}" for m in spec.mounts)
        shm = f"; /dev/shm {spec.shm_size_mib} MiB" if spec.shm_size_mib else ""
        field("image", f"{spec.image}{'; mounts ' + mounts if mounts else ''}{shm}")
    field("locality", describe_locality(spec.locality))
    field("placement", describe_placement(spec))
    field("submitted", f"{clock(job.submit_ms)} ({ago(job.submit_ms, now)} ago)")
    if job.start_ms:
        field("started", clock(job.start_ms))
    if job.finish_ms:
        field("finished", clock(job.finish_ms))
    retries = spec.max_retries if spec.HasField("max_retries") else 3
    field("attempts", f"{len(job.attempts)} ({job.failures} failed of max_retries {retries}; "
                      f"{job.preemptions} preempted)")
    if job.am_attempt:
        field("AM", f"attempt {job.am_attempt} on {job.am_node or '-'}")
    if job.waiting_reason and job.state not in TERMINAL:
        field("waiting", job.waiting_reason)
    if job.HasField("forecast") and job.state not in TERMINAL and job.state != pb.JOB_RUNNING:
        f = job.forecast
        field("starts", forecasttext.sentence(f.earliest_ms, f.likely_ms, f.latest_ms, f.horizon_ms, f.made_ms, now))
    if job.diagnostics:
        field("diagnostics", job.diagnostics)
    for a in reversed(job.attempts):
        outcome = state_name(a.state)
        if a.failure not in (pb.FAILURE_NONE, pb.FAILURE_KIND_UNSPECIFIED):
            outcome += f" ({FAILURE_NAMES[a.failure]}" + (", not counted" if not a.counts_as_failure and
                                                          a.failure == pb.FAILURE_PREEMPTED else "") + ")"
        lines.append("")
        lines.append(f"attempt {a.attempt}: {outcome}" + (f", level {a.level}" if a.level else "") +
                     f", {clock(a.start_ms)}" + (f" for {span(a.start_ms, a.end_ms, now)}" if a.start_ms else ""))
        if a.cause:
            lines.append(f"  cause: {a.cause}")
        if a.learners:
            rows = []
            for ln in a.learners:
                exit_text = "-"
                if ln.state in (pb.CONTAINER_EXITED, pb.CONTAINER_LOST, pb.CONTAINER_FAILED_TO_START):
                    exit_text = f"signal {ln.signal}" if ln.signal else str(ln.exit_code)
                rows.append([ln.rank, ln.node_id, ranges(list(ln.gpu_indices)),
                             CONTAINER_NAMES.get(ln.state, "?"), ln.pid or "-", exit_text,
                             "yes" if ln.preemptible else "no", ln.usage or "-"])
            buf = io.StringIO()
            table(["RANK", "NODE", "GPUS", "STATE", "PID", "EXIT", "PREEMPTIBLE", "GPU USE"], rows, out=buf)
            lines.extend("  " + row for row in buf.getvalue().rstrip("\n").split("\n"))
            # Right-sizing (docs/jobs.md): the phases the agent found in each learner's CPU / memory series.
            lines.extend(f"  rank {ln.rank} phases: {escape_controls(ln.rightsize)}"
                         for ln in a.learners if ln.rightsize)
    return "\n".join(lines)


# ---------------------------------------------------------------- scale


def cmd_scale(args: argparse.Namespace) -> int:
    rm = connect(args)
    job = rm.call(rm.client.ScaleJob, pb.ScaleJobRequest(job_id=args.job, gpus=args.gpus)).job
    if args.output == "json":
        print_json({"job_id": job.job_id, "target_gpus": job.target_gpus, "gpus_held": job.gpus_held,
                    "min_gpus": job.spec.gpus, "max_gpus": job.spec.max_gpus})
    else:
        print(f"{job.job_id}: target {job.target_gpus} GPUs (holding {job.gpus_held}; it grows as GPUs are idle "
              f"and shrinks by stopping its newest learners)")
    return 0


# ---------------------------------------------------------------- kill


LIVE_STATES = (pb.JOB_QUEUED, pb.JOB_ALLOCATING, pb.JOB_RUNNING)
KILL_SELECT_LIMIT = 10_000


def kill_targets(rm: RM, args: argparse.Namespace) -> list[str]:
    """The job ids to kill: those named, or the live jobs the selectors (--user, --queue, --state) pick."""
    selecting = bool(args.user or args.queue or args.state)
    if args.jobs and selecting:
        raise CliError("give job ids or selectors (--user, --queue, --state), not both: e.g. gpurm kill job-3 job-4, "
                       "or gpurm kill --user alice --state QUEUED")
    if args.jobs:
        return list(dict.fromkeys(args.jobs))
    if not selecting:
        raise CliError("nothing to kill: give job ids (gpurm kill job-3 job-4) or selectors "
                       "(gpurm kill --user alice --queue research.nlp --state QUEUED)")
    states = [pb.JobState.Name(pb.JobState.Value(f"JOB_{s}")) for s in args.state] or \
        [pb.JobState.Name(s) for s in LIVE_STATES]
    request = pb.ListJobsRequest(states=states, queue=args.queue or "", user=args.user or "",
                                 limit=KILL_SELECT_LIMIT, page_size=PAGE_SIZE)
    return [j.job_id for reply in rm.pages(rm.client.ListJobs, request, KILL_SELECT_LIMIT) for j in reply.jobs
            ][:KILL_SELECT_LIMIT]


def confirm(question: str, assume_yes: bool) -> bool:
    """Ask on the terminal; without one, only --yes says yes (a script must not kill by accident)."""
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise CliError("refusing to kill jobs picked by selectors without a terminal to confirm on: add --yes")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def cmd_kill(args: argparse.Namespace) -> int:
    rm = connect(args)
    targets = kill_targets(rm, args)
    if not targets:
        if args.output == "json":
            print_json([])
        else:
            print("no live jobs match")
        return 0
    if not args.jobs:
        shown = ", ".join(targets[:10]) + (f" and {len(targets) - 10} more" if len(targets) > 10 else "")
        if not confirm(f"kill {len(targets)} job{'s' if len(targets) > 1 else ''} ({shown})?", args.yes):
            print("nothing killed")
            return 1
    results: list[dict[str, object]] = []
    failed: CliError | None = None
    killed: dict[str, pb.Job] = {}
    for job_id in targets:
        try:
            job = rm.call(rm.client.KillJob, pb.KillJobRequest(job_id=job_id, reason=args.reason)).job
        except CliError as exc:
            failed = failed or exc
            results.append({"job_id": job_id, "state": "", "killed": False, "error": exc.message})
            if args.output != "json":
                what = exc.message if job_id in exc.message else f"{job_id}: {exc.message}"
                print(f"gpurm kill: error: {what}", file=sys.stderr)
            continue
        if job.state != pb.JOB_KILLED:
            results.append({"job_id": job.job_id, "state": state_name(job.state), "killed": False})
            if args.output != "json":
                print(f"{job.job_id} had already ended: {state_name(job.state)}")
            continue
        killed[job.job_id] = job
    if killed and not args.no_wait:
        killed = wait_stopped(rm, killed)
    for job in killed.values():
        results.append({"job_id": job.job_id, "state": "KILLED", "killed": True,
                        "live_containers": job.live_containers})
        if args.output != "json":
            print(f"{job.job_id} killed" + ("" if args.no_wait else "; its processes are gone"))
    if args.output == "json":
        print_json(sorted(results, key=lambda r: targets.index(str(r["job_id"]))))
    if failed is not None:
        return failed.code
    stuck = [j.job_id for j in killed.values() if j.live_containers and not args.no_wait]
    if stuck:
        raise CliError(f"{', '.join(stuck)}: KILLED but some containers have not reported stopping yet; the RM keeps "
                       "stopping them (see `gpurm status`)", code=1)
    return 0


def wait_stopped(rm: RM, jobs: dict[str, pb.Job], timeout_s: float = 90.0) -> dict[str, pb.Job]:
    """Wait until every killed job's containers have stopped (or the timeout); the jobs as last seen."""
    progress = Progress()
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        live = [j for j in jobs.values() if j.live_containers]
        if not live:
            break
        progress.update(f"waiting for the containers of {len(live)} job(s) to stop: "
                        + ", ".join(f"{j.job_id} ({j.live_containers})" for j in live[:5]))
        time.sleep(0.2)
        for j in live:
            jobs[j.job_id] = rm.call(rm.client.GetJob, pb.GetJobRequest(job_id=j.job_id))
    progress.done()
    return jobs


# ---------------------------------------------------------------- logs


@dataclass
class Target:
    """One log being printed: a learner rank (or the AM) of one attempt."""

    label: str
    rank: int
    attempt: int
    am: bool
    offset: int = 0
    done: bool = False
    container_id: str = ""
    partial: bytes = b""


def _targets(job: pb.Job, args: argparse.Namespace) -> list[Target]:
    if args.am:
        return [Target("am", 0, args.attempt or job.am_attempt, True)] if job.am_attempt else []
    if not job.attempts:
        return []
    attempt = job.attempts[args.attempt - 1] if args.attempt else job.attempts[-1]
    ranks = sorted(ln.rank for ln in attempt.learners if ln.container_id)
    if args.rank is not None:
        if ranks and args.rank not in ranks:
            raise CliError(f"--rank: attempt {attempt.attempt} of {job.job_id} has ranks {ranks[0]}-{ranks[-1]}, "
                           f"not {args.rank}")
        ranks = [args.rank] if ranks else []
    return [Target(f"rank {r}", r, attempt.attempt, False) for r in ranks]


def _emit(target: Target, data: bytes, prefix: bool, final: bool = False) -> None:
    out = sys.stdout.buffer
    if not prefix:
        out.write(data)
        out.flush()
        return
    buf = target.partial + data
    lines = buf.split(b"\n")
    target.partial = b"" if final else lines.pop()
    tag = f"[{target.label}] ".encode()
    for line in lines:
        if line or not final:
            out.write(tag + line + b"\n")
    out.flush()


def _pull(rm: RM, job_id: str, t: Target, prefix: bool) -> None:
    """Read a target's log from its current offset to the end."""
    while True:
        reply = rm.call(rm.client.GetLogs, pb.GetLogsRequest(job_id=job_id, rank=t.rank, attempt=t.attempt,
                                                             offset=t.offset, max_bytes=1 << 20, am=t.am))
        t.container_id = reply.container_id
        if reply.data:
            _emit(t, reply.data, prefix)
        t.offset = reply.next_offset
        if t.offset >= reply.size:
            t.done = reply.container_done
            return


def cmd_logs(args: argparse.Namespace) -> int:
    rm = connect(args)
    job = rm.call(rm.client.GetJob, pb.GetJobRequest(job_id=args.job))
    if args.follow:
        return asyncio.run(_follow(rm, args))
    targets = _targets(job, args)
    if not targets:
        raise CliError(f"{job.job_id} has no output yet ({state_name(job.state)}"
                       + (f": {job.waiting_reason}" if job.waiting_reason else "") + "); try `gpurm logs -f`")
    prefix = len(targets) > 1
    for t in targets:
        _pull(rm, job.job_id, t, prefix)
        if prefix and t.partial:
            _emit(t, b"", prefix, final=True)
    return 0


FOLLOW_POLL_S = 0.5   # how often `gpurm logs -f` asks the RM for new output


async def _follow(rm: RM, args: argparse.Namespace) -> int:
    """Print output as it arrives, until the job ends and every log is drained: GetLogs through the RM (which
    authorises the read) every FOLLOW_POLL_S, from each log's offset, so every byte is printed once. The job's
    retained state on gpurm/jobs/<job> (read-only broker login from GetClusterInfo) wakes the loop early when the
    job changes; without a broker it just polls."""
    from gpurm.common.aio import stop_task, wait_set  # here: the other commands need no asyncio helpers
    from gpurm.common.mqtt import Credentials  # nor an MQTT client

    info = rm.call(rm.client.GetClusterInfo, pb.ClusterInfoRequest())
    wake = asyncio.Event()
    listener = None
    if info.mqtt_url and info.mqtt_username:
        listener = asyncio.create_task(_listen(info.mqtt_url, Credentials(info.mqtt_username, info.mqtt_password),
                                               args.job, wake))
    progress = Progress(enabled=sys.stderr.isatty())
    targets: dict[tuple[int, int, bool], Target] = {}
    try:
        while True:
            job = rm.call(rm.client.GetJob, pb.GetJobRequest(job_id=args.job))
            fresh = [t for t in _targets(job, args) if (t.attempt, t.rank, t.am) not in targets]
            if fresh and targets:
                sys.stderr.write(f"--- attempt {fresh[0].attempt} ---\n")
            for t in fresh:
                targets[(t.attempt, t.rank, t.am)] = t
            prefix = len({k[1] for k in targets}) > 1
            if not targets:
                progress.update(f"waiting for {args.job} to start ({state_name(job.state)}: "
                                f"{job.waiting_reason or '...'})")
            else:
                progress.done()
            for t in [t for t in targets.values() if not t.done]:
                with contextlib.suppress(CliError):
                    _pull(rm, job.job_id, t, prefix)
            if job.state in TERMINAL and job.live_containers == 0 and all(t.done for t in targets.values()):
                for t in targets.values():
                    if prefix and t.partial:
                        _emit(t, b"", prefix, final=True)
                progress.done()
                sys.stderr.write(f"{job.job_id} {state_name(job.state)}\n")
                return 0
            wake.clear()
            await wait_set(wake, FOLLOW_POLL_S)
    finally:
        await stop_task(listener)


async def _listen(url: str, credentials: mqtt.Credentials, job_id: str, wake: asyncio.Event) -> None:
    """Set `wake` whenever the job's state changes (its retained message on gpurm/jobs/<job>)."""
    from gpurm.common import mqtt

    with contextlib.suppress(Exception):
        async with mqtt.client(url, credentials) as c:
            await c.subscribe(mqtt.TOPIC_JOB.format(job_id=job_id), qos=1)
            async for _message in c.messages:
                wake.set()


__all__ = ["cmd_jobs", "cmd_kill", "cmd_logs", "cmd_status", "cmd_submit", "format_duration", "pbg"]
