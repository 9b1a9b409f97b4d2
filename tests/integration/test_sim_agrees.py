"""The daemon and the simulator agree (issue 15): a scripted scenario, run on a real dev cluster (the RM, fake-GPU
agents, one AM process per job, the broker) and replayed from a jsonl trace through `gpurm.sim` (the `ideal`
run-time model: the dev cluster's learners run for their wall time), must make the same decisions. Every decision
is forced (one room fits, or the rooms are alike up to renaming servers of the same shape), and the daemon is driven
step by step on what it shows (a job running, a waiting reason), not on sleeps.

`fair-share`: 2 racks x 3 servers x 4 GPUs; queues `a` and `b` (weight 1 each, fifo), fair-share preemption after
3 s with a 1 s grace.
1. A1 (a, 12 GPUs) packs on a whole rack;          2. A2 (a, 2) goes to a server of the other rack;
3. A3 (a, 3) to an empty server there (best fit: the one with 2 free cannot take it)
                                                    -> free in that rack: 2, 1 and 4 GPUs on its three servers.
4. R (a, 7, 3 s per level) cannot be packed on its fewest servers (2: at most 4 + 2 free): it times out at
   `packed` and relaxes to `rack` (all three servers). (A job that fits on one server would not relax: under
   `prefer` it is never split across servers, am/master.py.)
5. B1 (b, 12, `--start-level node`) skips `node` (no server has 12 GPUs) and waits at `packed` for a whole rack;
   queue b is below its share: after 3 s fair share preempts the cheapest room, A1's rack (one job, 12 GPUs;
   the other rack's room would take three jobs). B1 runs 3 s there; A1, requeued, then gets its rack back.

`borrowing-las`: 1 rack x 3 servers x 4 GPUs; queues `a`, `b`, `c` (weight 1, fifo) under `borrowing: las`, no
fair-share preemption, a 1 s grace, a 2 s minimum run and one las threshold at 8 GPU-seconds.
1. A1 (a, 4) and A2 (a, 4) take two servers: A2 borrows (a's steady share is 4);  2. B0 (b, 4) the third;
3. B1 (b, 4, 3 s), once A2 has run 3 s (level 1), would borrow too and, fresh (level 0), outranks A2: A2 is preempted
   (A1, as good and submitted first, keeps a's share; B0 is inside b's). B1 runs on A2's server; A2 resumes there.
The GPUs a preempted borrower frees are held for the waiting job's queue, in the daemon and the simulator alike, so
the victim's AM, asking again first, does not win them back. (An in-queue (`las`) scenario is not here: see
docs/sim.md, "Checked against the daemon".)

Compared: the order attempts started running in; each attempt's level, servers, and whether it was preempted; the
levels skipped. Times are not compared (the daemon has real latency). The planner breaks ties between equally good
servers with a per-AM random salt, so servers are compared up to a renaming that keeps racks (servers of one shape
are interchangeable): the test looks for one renaming under which every attempt matches. A mismatch prints both
sides side by side.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpurm.am.master import Master
from gpurm.am.placement import ServerView, View
from gpurm.common.jobspec import JobSpec, LocalityLevel
from gpurm.common.model import ContainerKind, FailureKind
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.run import SimRequest, load_inputs
from gpurm.sim.runtime import RuntimeModel
from gpurm.sim.trace import TraceJob
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster

LONG = 600.0          # a job that holds its GPUs for the rest of the scenario
SKIPPED = re.compile(r"skipped (.*?): the cluster's shape can never give them")


@dataclass(frozen=True)
class ScriptJob:
    name: str
    queue: str
    gpus: int
    submit_s: float                  # the simulator's submission time; the daemon submits when the step before is done
    duration_s: float
    locality: dict[str, str]         # the job file's `locality`, and the trace's (the same keys)
    see: str = ""                    # the daemon must show this in its waiting reason (regex) before it runs
    after_s: float = 0.0             # the daemon waits this long after the step before (what has run must have run
                                     # at least this long: a las level, a minimum run), the simulator's times allow it


@dataclass(frozen=True)
class Scenario:
    name: str
    racks: int
    servers_per_rack: int
    gpus: int                        # per server
    queues: str                      # the queue config, for the RM and the simulator alike
    script: tuple[ScriptJob, ...]    # submission times leave each step (in the simulator) well done before the next
    starts: tuple[tuple[str, int], ...]   # the attempts, in the order they start (the simulator is checked first)
    preempted: tuple[tuple[str, int], ...]
    rm_options: tuple[str, ...] = ()          # rm.yaml settings for the daemon (`--rm-option`), and below as the
    min_run_s: float = 300.0                  # simulator takes them: preemption.in_queue_min_run,
    las_thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S    # preemption.las_thresholds

    def job(self, name: str) -> ScriptJob:
        return next(j for j in self.script if j.name == name)


FAIR_SHARE = Scenario(
    "fair-share", racks=2, servers_per_rack=3, gpus=4,
    queues="""
defaults:
  fair_share_preemption_timeout: 3s
  min_share_preemption_timeout: off
  preemption_grace: 1s
queues:
  a: {}
  b: {}
""",
    script=(
        ScriptJob("A1", "a", 12, 0, LONG, {"timeout": "10m"}),
        ScriptJob("A2", "a", 2, 10, LONG, {"timeout": "10m"}),
        ScriptJob("A3", "a", 3, 20, LONG, {"timeout": "10m"}),
        ScriptJob("R", "a", 7, 30, LONG, {"timeout": "3s", "backoff_base": "200ms", "backoff_max": "200ms"},
                  see="level packed"),
        ScriptJob("B1", "b", 12, 40, 3, {"start_level": "node", "timeout": "10m"}, see=SKIPPED.pattern),
    ),
    starts=(("A1", 1), ("A2", 1), ("A3", 1), ("R", 1), ("B1", 1), ("A1", 2)),
    preempted=(("A1", 1),))

BORROWING = Scenario(
    "borrowing-las", racks=1, servers_per_rack=3, gpus=4,
    queues="""
borrowing: las
defaults:
  fair_share_preemption_timeout: off
  min_share_preemption_timeout: off
  preemption_grace: 1s
queues:
  a: {}
  b: {}
  c: {}
""",
    script=(
        ScriptJob("A1", "a", 4, 0, LONG, {"timeout": "10m"}),
        ScriptJob("A2", "a", 4, 10, LONG, {"timeout": "10m"}),
        ScriptJob("B0", "b", 4, 20, LONG, {"timeout": "10m"}),
        ScriptJob("B1", "b", 4, 40, 3, {"timeout": "10m"}, after_s=3),
    ),
    starts=(("A1", 1), ("A2", 1), ("B0", 1), ("B1", 1), ("A2", 2)),
    preempted=(("A2", 1),),
    rm_options=("preemption.in_queue_min_run=2s", "preemption.las_thresholds=[8s]"),
    min_run_s=2.0, las_thresholds=(8.0,))


@dataclass(frozen=True)
class Placed:
    """One attempt that ran: where, at which level, and whether it ended by preemption."""

    level: str
    servers: tuple[str, ...]
    preempted: bool


@dataclass
class Outcome:
    starts: list[tuple[str, int]] = field(default_factory=list)   # (job, attempt) in the order they ran
    attempts: dict[tuple[str, int], Placed] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)          # job -> the levels its AM skipped, and why
    racks: dict[str, str] = field(default_factory=dict)            # server -> rack
    causes: dict[tuple[str, int], str] = field(default_factory=dict)   # why an attempt ended (shown, not compared)


# ------------------------------------------------------------------------------------------------ the daemon


class Watcher:
    """Polls the RM for the script's jobs: the order attempts were first seen running, and every waiting reason."""

    def __init__(self, c: DevCluster) -> None:
        self.c = c
        self.jobs: dict[str, str] = {}          # job id -> script name
        self.starts: list[tuple[str, int]] = []
        self.reasons: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def add(self, job_id: str, name: str) -> None:
        with self.lock:
            self.jobs[job_id] = name

    def _run(self) -> None:
        while not self.stopped.wait(0.1):
            with self.lock:
                jobs = dict(self.jobs)
            for job_id, name in jobs.items():
                self.observe(name, self.c.job(job_id))

    def observe(self, name: str, job: pb.Job) -> None:
        with self.lock:
            for a in job.attempts:
                if a.state == pb.JOB_RUNNING and (name, a.attempt) not in self.starts:
                    self.starts.append((name, a.attempt))
            seen = self.reasons.setdefault(name, [])
            if job.waiting_reason and job.waiting_reason not in seen:
                seen.append(job.waiting_reason)

    def started(self, name: str, attempt: int) -> Callable[[], bool]:
        return lambda: (name, attempt) in self.starts

    def showed(self, name: str, pattern: str) -> Callable[[], bool]:
        return lambda: any(re.search(pattern, r) for r in self.reasons.get(name, []))

    def wait_for(self, what: str, test: Callable[[], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if test():
                    return
            time.sleep(0.1)
        with self.lock:
            raise AssertionError(f"the daemon never got to: {what}; started so far {self.starts}; "
                                 f"waiting reasons {self.reasons}")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)


def job_file(tmp: Path, job: ScriptJob) -> Path:
    path = tmp / f"{job.name}.yaml"
    command = f"sleep {job.duration_s:g}"
    path.write_text(json.dumps({"name": job.name, "queue": job.queue, "gpus": job.gpus, "command": command,
                                "locality": job.locality}))       # JSON is YAML
    return path


def run_daemon(sc: Scenario, c: DevCluster, tmp: Path) -> Outcome:
    watcher = Watcher(c)
    ids: dict[str, str] = {}
    try:
        for job in sc.script:
            if job.after_s:
                time.sleep(job.after_s)
            ids[job.name] = c.submit(str(job_file(tmp, job)))
            watcher.add(ids[job.name], job.name)
            if job.see:
                watcher.wait_for(f"{job.name} showing {job.see!r}", watcher.showed(job.name, job.see))
            watcher.wait_for(f"{job.name} running", watcher.started(job.name, 1))
        last = sc.starts[-1]
        watcher.wait_for(f"{last[0]} attempt {last[1]} running", watcher.started(*last))
        out = Outcome(starts=list(watcher.starts), racks={n.node_id: n.rack for n in c.nodes()})
        for name, job_id in ids.items():
            for a in c.job(job_id).attempts:
                if a.learners:
                    out.attempts[(name, a.attempt)] = Placed(a.level, tuple(sorted(ln.node_id for ln in a.learners)),
                                                             a.failure == pb.FAILURE_PREEMPTED)
                    out.causes[(name, a.attempt)] = _named(a.cause, {v: k for k, v in ids.items()})
            found = [m.group(1) for r in watcher.reasons.get(name, []) if (m := SKIPPED.search(r))]
            out.skipped[name] = found[0] if found else ""
        return out
    finally:
        watcher.stop()
        for job_id in ids.values():
            c.gpurm("kill", job_id, "--no-wait")


def _named(text: str, names: dict[str, str]) -> str:
    """`text` with the RM's job ids replaced by the script's names (the two sides number jobs alike, but say it)."""
    return re.sub(r"job-\d+", lambda m: names.get(m.group(0), m.group(0)), text)


# ---------------------------------------------------------------------------------------------- the simulator


def trace_line(job: ScriptJob) -> str:
    return json.dumps({"id": job.name, "submit": job.submit_s, "gpus": job.gpus, "duration": job.duration_s,
                       "queue": job.queue, "locality": job.locality})


def run_sim(sc: Scenario, tmp: Path, queues: Path) -> Outcome:
    trace_path = tmp / "script.jsonl"
    trace_path.write_text("".join(trace_line(j) + "\n" for j in sc.script))
    request = SimRequest(trace=trace_path, fmt="jsonl", cluster=f"{sc.racks}x{sc.servers_per_rack}x{sc.gpus}",
                         out=tmp / "sim", queues=queues, runtime_model=RuntimeModel.IDEAL)
    trace, servers, tree = load_inputs(request)
    options = SimOptions(runtime=None, inqueue_min_run_s=sc.min_run_s,   # runtime None: the `ideal` model
                         las_thresholds_gpu_s=sc.las_thresholds)
    engine = Engine(trace, servers, tree, options)
    engine.run()
    out = Outcome(racks={s.node_id: s.rack for s in servers})
    launched: list[tuple[float, int, str, int]] = []
    learners = [c for c in engine.core.containers.values() if c.kind is ContainerKind.LEARNER]
    for job in engine.core.jobs.values():
        name = engine.by_trace[job.job_id]
        for a in job.attempts:
            if not a.learners:
                continue
            out.attempts[(name, a.number)] = Placed(a.level, tuple(sorted(ln.node_id for ln in a.learners)),
                                                    a.failure is FailureKind.PREEMPTED)
            out.causes[(name, a.number)] = _named(a.cause, engine.by_trace)
            ran = max(c.started for c in learners if c.job_id == job.job_id and c.attempt == a.number)
            launched.append((ran, job.seq, name, a.number))
    out.starts = [(name, number) for _, _, name, number in sorted(launched)]
    shape = View(ServerView(s.node_id, s.rack, s.gpus, ()) for s in servers)
    for tj in trace.jobs:
        out.skipped[tj.job_id] = skipped_by_shape(tj, engine, shape)
    return out


def skipped_by_shape(tj: TraceJob, engine: Engine, shape: View) -> str:
    """The levels the job's AM skips on entering its first level in this cluster (the real Master, on the
    cluster's shape with nothing free: a skip is decided from the shape alone)."""
    spec = JobSpec(gpus=tj.gpus, command=["sim"], locality=engine.job_locality(tj))
    master = Master(spec, 0.0)
    master.on_view(shape, 0.0)
    m = SKIPPED.search(master.skipped)
    return m.group(1) if m else ""


# ---------------------------------------------------------------------------------------------- the comparison


def renamings(daemon: dict[str, str], sim: dict[str, str]) -> Iterator[dict[str, str]]:
    """Every one-to-one map of the daemon's servers onto the simulator's that keeps servers of a rack together."""
    names = sorted(daemon)
    for image in itertools.permutations(sorted(sim)):
        f = dict(zip(names, image, strict=True))
        if all((daemon[x] == daemon[y]) == (sim[f[x]] == sim[f[y]]) for x in names for y in names):
            yield f


def renamed(out: Outcome, f: dict[str, str]) -> dict[tuple[str, int], Placed]:
    return {k: Placed(p.level, tuple(sorted(f[s] for s in p.servers)), p.preempted) for k, p in out.attempts.items()}


def floor_level(sc: Scenario, job: ScriptJob) -> str:
    """Where the job's AM starts waiting: its start level, past the levels the shape rules out (docs/jobs.md)."""
    level = LocalityLevel.parse(job.locality.get("start_level", "packed"))
    in_rack = job.gpus <= sc.servers_per_rack * sc.gpus
    fits = {LocalityLevel.NODE: job.gpus <= sc.gpus, LocalityLevel.PACKED: in_rack, LocalityLevel.RACK: in_rack,
            LocalityLevel.ANY: True}
    while not fits[level]:
        level = LocalityLevel(level + 1)
    return level.label


def table(sc: Scenario, daemon: Outcome, sim: Outcome, f: dict[str, str]) -> str:
    """Both sides side by side: one row per attempt (daemon servers renamed by `f`, the original in brackets)."""
    keys = list(dict.fromkeys([*daemon.starts, *sim.starts, *daemon.attempts, *sim.attempts]))

    def cell(out: Outcome, key: tuple[str, int], rename: dict[str, str] | None) -> str:
        p = out.attempts.get(key)
        started = f"#{out.starts.index(key) + 1}" if key in out.starts else "#?"
        if p is None:
            return f"{started} (no placement)" if key in out.starts else "-"
        servers = ",".join(sorted(f"{rename[s]}[{s}]" if rename else s for s in p.servers))
        floor = floor_level(sc, sc.job(key[0]))
        relaxed = f" relaxed {floor}->{p.level}" if p.level != floor else ""
        return f"{started} {p.level} {servers}{relaxed}{' PREEMPTED' if p.preempted else ''}"

    rows = [f"scenario {sc.name}; # is the order attempts started in; daemon servers are shown renamed to the "
            "simulator's [daemon's own name]",
            f"{'attempt':<8} {'daemon':<60} {'simulator':<52}"]
    for key in keys:
        d, s = cell(daemon, key, f), cell(sim, key, None)
        mark = "" if _same(daemon, sim, key, f) else "   <-- differs"
        rows.append(f"{key[0] + '#' + str(key[1]):<8} {d:<60} {s:<52}{mark}")
    for job in sc.script:
        d, s = daemon.skipped.get(job.name, ""), sim.skipped.get(job.name, "")
        if d or s:
            rows.append(f"{job.name:<8} {'skipped ' + (d or '-'):<60} {'skipped ' + (s or '-'):<52}"
                        f"{'' if d == s else '   <-- differs'}")
    for key in keys:
        d, s = daemon.causes.get(key, ""), sim.causes.get(key, "")
        if d or s:
            rows.append(f"{key[0] + '#' + str(key[1]):<8} ended: daemon {d or '-'!r}; simulator {s or '-'!r}")
    return "\n".join(rows)


def _same(daemon: Outcome, sim: Outcome, key: tuple[str, int], f: dict[str, str]) -> bool:
    d = renamed(daemon, f).get(key)
    return d is not None and d == sim.attempts.get(key) and (
        key in daemon.starts and key in sim.starts and daemon.starts.index(key) == sim.starts.index(key))


def agree(daemon: Outcome, sim: Outcome) -> tuple[bool, dict[str, str]]:
    """Whether the two runs made the same decisions (for some renaming of same-shaped servers), and the renaming
    (the best one, by attempts matched, when none makes them agree)."""
    options = list(renamings(daemon.racks, sim.racks))
    assert options, f"the clusters differ in shape: daemon {daemon.racks}, simulator {sim.racks}"

    def matched(f: dict[str, str]) -> int:
        d = renamed(daemon, f)
        return sum(1 for k, p in sim.attempts.items() if d.get(k) == p)

    best = max(options, key=matched)
    same = (daemon.starts == sim.starts and renamed(daemon, best) == sim.attempts and daemon.skipped == sim.skipped)
    return same, best


# ------------------------------------------------------------------------------------------------------ test


@pytest.mark.parametrize("sc", [FAIR_SHARE, BORROWING], ids=lambda sc: sc.name)
def test_a_scripted_scenario_decides_the_same_on_the_dev_cluster_and_in_the_simulator(
        tmp_path: Path, broker: TestBroker, sc: Scenario) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(sc.queues)
    sim = run_sim(sc, tmp_path, queues)
    # The scenario is what it claims to be, in the simulator first (cheap, and a failure here is not the daemon's).
    assert sim.starts == list(sc.starts), sim.starts
    assert [k for k, p in sim.attempts.items() if p.preempted] == list(sc.preempted)
    if sc is FAIR_SHARE:
        assert sim.attempts[("R", 1)].level == "rack" and floor_level(sc, sc.job("R")) == "packed"      # relaxed
        assert sim.skipped["B1"].startswith("node") and sim.attempts[("B1", 1)].level == "packed"      # skipped
        assert sim.attempts[("B1", 1)].servers == sim.attempts[("A1", 1)].servers == sim.attempts[("A1", 2)].servers
    if sc is BORROWING:
        # B1 would borrow (B0 holds b's steady share) and, fresh, outranks A2, the borrower of a (A1, as good and
        # submitted first, keeps a's share): A2 makes room, then resumes there once B1 is done.
        assert sim.attempts[("B1", 1)].servers == sim.attempts[("A2", 1)].servers == sim.attempts[("A2", 2)].servers
        assert "outranked by B1 (las) on borrowed GPUs" in sim.causes[("A2", 1)], sim.causes

    options = [x for o in sc.rm_options for x in ("--rm-option", o)]
    c = DevCluster(tmp_path / "c", nodes=sc.racks * sc.servers_per_rack, gpus_per_node=sc.gpus, racks=sc.racks,
                   broker=broker, extra=["--queues", str(queues), *options])
    try:
        daemon = run_daemon(sc, c, tmp_path)
    finally:
        c.stop()
    same, f = agree(daemon, sim)
    assert same, "the daemon and the simulator decided differently:\n" + table(sc, daemon, sim, f)


def test_the_comparison_allows_only_renamings_that_keep_racks_and_shows_a_difference() -> None:
    # No daemon: the comparison itself must be able to fail.
    sim = Outcome(starts=[("A1", 1)], attempts={("A1", 1): Placed("packed", ("r00n00", "r00n01"), False)},
                  racks={"r00n00": "rack-00", "r00n01": "rack-00", "r01n00": "rack-01", "r01n01": "rack-01"},
                  skipped={"A1": ""})
    racks = {"node-1": "rack-1", "node-2": "rack-1", "node-3": "rack-2", "node-4": "rack-2"}
    other_rack = Outcome(starts=[("A1", 1)], attempts={("A1", 1): Placed("packed", ("node-3", "node-4"), False)},
                         racks=racks, skipped={"A1": ""})
    assert agree(other_rack, sim)[0]                          # the same decision, on the other (alike) rack
    split = Outcome(starts=[("A1", 1)], attempts={("A1", 1): Placed("packed", ("node-1", "node-3"), False)},
                    racks=racks, skipped={"A1": ""})
    same, f = agree(split, sim)                               # no renaming may put two racks' servers in one
    assert not same
    assert "<-- differs" in table(FAIR_SHARE, split, sim, f) and "node-1" in table(FAIR_SHARE, split, sim, f)
    relaxed = Outcome(starts=[("A1", 1)], attempts={("A1", 1): Placed("any", ("node-1", "node-2"), False)},
                      racks=racks, skipped={"A1": ""})
    assert not agree(relaxed, sim)[0]
    assert "relaxed packed->any" in table(FAIR_SHARE, relaxed, sim, agree(relaxed, sim)[1])
    skipped = Outcome(starts=other_rack.starts, attempts=other_rack.attempts, racks=racks,
                      skipped={"A1": "node (no server has 8 GPUs)"})
    assert not agree(skipped, sim)[0]
