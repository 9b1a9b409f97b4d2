"""The chaos run: a real cluster (RM, 4 agents with fake GPUs, per-job AMs, a real broker) runs N jobs of 1-16
GPUs while the RM is SIGKILLed twice, one agent once and one AM once, each restarted (the AM by the RM).

Used by tests/integration/test_chaos.py (50 jobs) and by `scripts/chaos --jobs N` for longer runs. It checks:
- every job ends in the state its command calls for, with the right cause: `sleep` jobs SUCCEEDED, `exit 3`
  jobs FAILED after 1 + max_retries counted failures (exit code 3, or an infrastructure cause the chaos brought
  about), jobs the driver kills KILLED;
- attempts and retries are counted right: a job's counted failures are exactly its attempts that failed with a
  user or infrastructure cause, and a SUCCEEDED job's earlier attempts all ended by the chaos (infra / AM);
- no two live containers ever shared a GPU, from the agents' own records (start/end per node and GPU index);
- no process is left behind once every job has ended, and none once the agents stop;
- every agent stops on SIGTERM (stopping what still runs) rather than being SIGKILLed after 20 s;
- every job a submission acknowledged is there at the end.
With `net` (scripts/chaos --netns, tests/integration/chaosnet.py) the agents run in network namespaces and the run
also cuts and degrades the network, and checks that no two attempts of a job ever ran at the same moment.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpurm.cli import netns
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.server import paging
from tests.conftest import TestBroker, run_broker
from tests.integration.chaosnet import AttemptWatch, ChaosNet, attempts_overlap
from tests.integration.harness import alive
from tests.integration.rmproc import TERMINAL, WAIT, AgentProcess, RMProcess, kill_group
from tests.integration.test_ha_failover import ask

log = logging.getLogger("chaos")

NODES = 4
GPUS_PER_NODE = 8
HA_LEASE_S = 3.0
# The node expiry: 30 beats of 1 s. The agents' lease (the fence) is then 26.5 s, longer than an RM restart takes on
# a loaded 2-core machine with 20 AMs starting (16-24 s measured): a shorter one stops every job at each RM kill.
MISSED_BEATS = 30
SIZES = (1, 1, 1, 2, 2, 4, 8, 8, 16)


@dataclass
class JobPlan:
    index: int
    kind: str            # ok | fail | kill
    gpus: int
    command: str
    max_retries: int
    job_id: str = ""


@dataclass
class ChaosReport:
    jobs: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    retries: int = 0
    chaos_events: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    containers_checked: int = 0
    wall_s: float = 0.0
    takeovers: list[float] = field(default_factory=list)     # HA: seconds until the standby served

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        states = ", ".join(f"{n} {s}" for s, n in sorted(self.by_state.items()))
        verdict = "PASS" if self.ok else f"FAIL ({len(self.problems)} problems)"
        return (f"chaos {verdict}: {self.jobs} jobs ({states}); {self.attempts} attempts, {self.retries} counted "
                f"failures; {len(self.chaos_events)} faults injected ({'; '.join(self.chaos_events)}); "
                f"{self.containers_checked} container records checked for shared GPUs; {self.wall_s:.0f}s"
                + (f"; HA takeovers {', '.join(f'{t:.1f}s' for t in self.takeovers)}" if self.takeovers else ""))


def plan_jobs(n: int, seed: int, sleep_s: tuple[float, float] = (2.0, 8.0)) -> list[JobPlan]:
    """`sleep_s`: the range an `ok` job sleeps in (drawn from the same random sequence whatever it is)."""
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        gpus = rng.choice(SIZES)
        if i % 10 == 3:
            plans.append(JobPlan(i, "fail", rng.choice((1, 2, 8)), "sleep 0.5; exit 3", max_retries=1))
        elif i % 10 == 7:
            plans.append(JobPlan(i, "kill", gpus, "sleep 600", max_retries=3))
        else:
            plans.append(JobPlan(i, "ok", gpus, f"sleep {rng.uniform(*sleep_s):.1f}", max_retries=3))
    return plans


class Chaos:
    def __init__(self, workdir: Path, broker: TestBroker, jobs: int, seed: int,
                 say: Callable[[str], None] = lambda s: None, sleep_s: tuple[float, float] = (2.0, 8.0),
                 ha_store: str = "", net: ChaosNet | None = None) -> None:
        """`ha_store`: a postgresql:// URL: two RMs share it, one leads and one stands by (rm.yaml ha:), and the
        faults are on the leader (SIGKILL, then SIGSTOP) instead of restarts of a lone RM. `net`: the agents'
        network namespaces (made with node ids chaos-n0..), the RMs and the broker on its bridge."""
        self.net = net
        self.ha_store = ha_store
        hosts = net.rm_hosts if net is not None else ["127.0.0.1"]
        wraps = [net.wrap(r) for r in net.rms] if net is not None and net.rms else [[], []]
        self.workdir = workdir
        self.say = say
        self.plans = plan_jobs(jobs, seed, sleep_s)
        self.rng = random.Random(seed + 1)
        self.report = ChaosReport(jobs=jobs)
        # The default allocate interval: with 50 jobs, AMs calling every 250 ms (the tests' RMProcess default) made
        # the run three times slower on two cores.
        settings: dict[str, object] = {"am": {"liveness_timeout": "15s", "allocate_interval": "500ms"}}
        if ha_store:
            settings.update(store={"url": ha_store}, ha={"enabled": True, "lease": f"{HA_LEASE_S:g}s"})
        self.rm = RMProcess(workdir / "rm-a" if ha_store else workdir, broker, heartbeat="1s",
                            missed_beats=MISSED_BEATS, host=hosts[0], wrap=wraps[0], **settings)
        self.standby: RMProcess | None = None
        rm_list = None
        if ha_store:
            self.standby = RMProcess(workdir / "rm-b", broker, heartbeat="1s", missed_beats=MISSED_BEATS,
                                     key_from=self.rm.state_dir / "token.key", standby=True,
                                     host=hosts[-1], wrap=wraps[-1], **settings)
            rm_list = [self.rm.address, self.standby.address]
        self.agents = [AgentProcess(workdir / f"agent{i}", self.rm, f"chaos-n{i}",
                                    gpus={"fake": GPUS_PER_NODE}, rack=f"rack-{i % 2}", ib_domain=f"ib-{i % 2}",
                                    containers={"stop_grace": "1s"}, rm_list=rm_list,
                                    **({"wrap": net.wrap(f"chaos-n{i}"), "host": net.address(f"chaos-n{i}")}
                                       if net is not None else {}))
                       for i in range(NODES)]
        self.watch = AttemptWatch(self.records) if net is not None else None

    # ------------------------------------------------------------ the run

    def run(self, timeout: float = 240.0) -> ChaosReport:
        t0 = time.monotonic()
        try:
            for a in self.agents:
                a.start()
            self.submit_all()
            if self.watch is not None:
                self.watch.start()
            self.inject_faults()
            self.wait_all(t0 + timeout)
            self.check_jobs()
            self.check_gpus()
            self.check_attempts()
            self.check_leftovers(after_stop=False)
        finally:
            if self.watch is not None:
                self.watch.stop()
            for a in self.agents:
                a.close()
                if a.proc is not None and a.proc.returncode == -signal.SIGKILL:   # close() had to kill it
                    self.report.problems.append(f"agent {a.node_id} did not stop within {WAIT:g}s of SIGTERM "
                                                f"(SIGKILLed): {a.log_text()[-2000:]}")
            self.check_leftovers(after_stop=True)
            self.rm.close()
            if self.standby is not None:
                self.standby.close()
            self.report.wall_s = time.monotonic() - t0
        return self.report

    def submit_all(self) -> None:
        for p in self.plans:
            spec = pb.JobSpec(name=f"chaos-{p.index}-{p.kind}", gpus=p.gpus, max_retries=p.max_retries,
                              command=["/bin/sh", "-c", p.command])
            reply = self.rm.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=f"chaos-{p.index}"),
                                             metadata=self.rm.metadata, timeout=10)
            p.job_id = reply.job_id
        self.say(f"submitted {len(self.plans)} jobs")

    def call(self, what: Callable[[], object]) -> object:
        """An RM call that rides out the RM being down (it is, on purpose, now and then)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return what()
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                        or time.monotonic() > deadline:
                    raise
                if self.standby is not None and "standby" in (exc.details() or ""):
                    self.rm, self.standby = self.standby, self.rm      # the other one leads now
                time.sleep(0.3)

    def jobs(self) -> dict[str, pb.Job]:
        listed = self.call(lambda: paging.fetch_all(lambda r: self.rm.client.ListJobs(r, timeout=10),
                                                     pb.ListJobsRequest(), "jobs"))
        assert isinstance(listed, list)
        return {j.job_id: j for j in listed}

    def wait_running(self, min_running: int, until: float) -> None:
        while time.monotonic() < until:
            if sum(1 for j in self.jobs().values() if j.state == pb.JOB_RUNNING) >= min_running:
                return
            time.sleep(0.3)

    def inject_faults(self) -> None:
        soon = time.monotonic() + 30
        self.wait_running(3, soon)
        # One RM: SIGKILL and restart it, twice. Two RMs: SIGKILL the leader, later pause (SIGSTOP) the new one.
        ha = self.standby is not None
        if ha:
            self.fail_leader(signal.SIGKILL)
        else:
            self.kill_rm()
        self.kill_the_killables()
        self.wait_running(2, time.monotonic() + 20)
        self.kill_agent()
        self.wait_running(2, time.monotonic() + 20)
        self.kill_am()
        time.sleep(2)
        if self.net is not None:
            # Every agent has registered again since the RM came back, so no restart grace covers the node: its
            # fence stops its containers, then the RM declares it LOST.
            self.report.chaos_events.append(
                self.net.cut_from_rm(self.rng.choice, self.say, cut_s=MISSED_BEATS + 3.0))
            self.wait_running(2, time.monotonic() + 20)
        if ha:
            self.fail_leader(signal.SIGSTOP)
        else:
            self.kill_rm()
        if ha and self.net is not None and self.net.rms:
            self.wait_running(2, time.monotonic() + 20)
            self.cut_leader_from_store()
        if self.net is not None:
            self.wait_running(2, time.monotonic() + 20)
            self.report.chaos_events += self.net.degrade(self.rng.choice, self.say)

    def fail_leader(self, how: signal.Signals) -> None:
        """SIGKILL or SIGSTOP the leader; time the standby's takeover; bring the old leader back as a standby
        (a SIGSTOPped one is let go, finds itself deposed and exits 3, as its supervisor would see)."""
        leader, standby = self.rm, self.standby
        assert standby is not None and leader.proc is not None
        leader.proc.send_signal(how)
        t = time.monotonic()
        while time.monotonic() - t < 60:
            try:
                standby.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=1)
                break
            except grpc.RpcError:
                time.sleep(0.1)
        took = time.monotonic() - t
        if how is signal.SIGSTOP:
            leader.proc.send_signal(signal.SIGCONT)
            try:
                code: int | None = leader.proc.wait(30)
            except subprocess.TimeoutExpired:
                code = None
            if code != 3:
                self.report.problems.append(f"the paused leader, let go, exited {code} (expected 3: deposed)")
                leader.kill()
        else:
            leader.proc.wait()
        leader.start(standby=True)
        self.rm, self.standby = standby, leader
        self.report.takeovers.append(took)
        self.report.chaos_events.append(f"leader {how.name}, the standby served after {took:.1f}s")
        self.say(self.report.chaos_events[-1])

    def cut_leader_from_store(self) -> None:
        """Cut the leader from PostgreSQL alone (iptables in its namespace, the database's port): it must stop
        answering as leader before the standby serves, and exit 3 (deposed); then heal and bring it back standing
        by."""
        assert self.net is not None and self.standby is not None
        leader, standby = self.rm, self.standby
        pg_port = int(self.ha_store.rsplit(":", 1)[1].split("/", 1)[0])
        ns = self.net.namespace_at(leader.address.rsplit(":", 1)[0])
        netns.partition(ns, [self.net.gateway], port=pg_port)
        t0 = time.monotonic()
        last_old = first_new = -1.0
        while first_new < 0 or (leader.proc is not None and leader.proc.poll() is None):
            now = time.monotonic() - t0
            if now > 60:
                self.report.problems.append(f"60 s after the leader was cut from the store: it last answered as "
                                            f"leader at {last_old:.1f}s, the standby served from {first_new:.1f}s")
                break
            if leader.proc is not None and leader.proc.poll() is None and ask(leader.address)[0] == "leader":
                last_old = now
            if first_new < 0 and ask(standby.address)[0] == "leader":
                first_new = now
            time.sleep(0.05)
        netns.heal(ns)
        if last_old >= first_new >= 0:
            self.report.problems.append(f"two leaders: the cut-off leader answered as leader at {last_old:.2f}s, "
                                        f"after the standby served (from {first_new:.2f}s)")
        code = leader.proc.wait(30) if leader.proc is not None else None
        if code != 3:
            self.report.problems.append(f"the leader cut from its store exited {code} (expected 3: deposed)")
        leader.start(standby=True)
        self.rm, self.standby = standby, leader
        self.report.takeovers.append(first_new)
        self.report.chaos_events.append(f"leader cut from PostgreSQL: it last answered as leader at {last_old:.1f}s, "
                                        f"exited {code}; the standby served from {first_new:.1f}s")
        self.say(self.report.chaos_events[-1])

    def kill_rm(self) -> None:
        self.rm.kill()
        time.sleep(self.rng.uniform(0.5, 2.0))
        t = time.monotonic()
        self.rm.start()
        self.report.chaos_events.append(f"RM SIGKILL, serving again {time.monotonic() - t:.1f}s after restart")
        self.say(self.report.chaos_events[-1])

    def kill_the_killables(self) -> None:
        for p in self.plans:
            if p.kind == "kill":
                self.call(lambda p=p: self.rm.client.KillJob(  # type: ignore[misc]
                    pb.KillJobRequest(job_id=p.job_id, reason="chaos: killed by its owner"),
                    metadata=self.rm.metadata, timeout=10))

    def kill_agent(self) -> None:
        victim = self.rng.choice(self.agents)
        victim.rm = self.rm             # (with two RMs: the one leading now, which it registers with)
        assert victim.proc is not None
        victim.proc.kill()
        victim.proc.wait()
        time.sleep(self.rng.uniform(0.5, 2.0))
        victim.start(timeout=30)
        self.report.chaos_events.append(f"agent {victim.node_id} SIGKILL and restart")
        self.say(self.report.chaos_events[-1])

    def kill_am(self) -> None:
        running = [j for j in self.jobs().values() if j.state in (pb.JOB_RUNNING, pb.JOB_ALLOCATING) and j.am_node]
        for job in self.rng.sample(running, len(running)):
            for record in self.records():
                pid = int(record.get("pid") or 0)
                if record.get("job_id") == job.job_id and record.get("kind") == "CONTAINER_AM" \
                        and record.get("state") == "CONTAINER_RUNNING" and pid and alive(pid):
                    os.kill(pid, signal.SIGKILL)        # the AM process itself, as a crash would
                    self.report.chaos_events.append(f"AM of {job.job_id} SIGKILL")
                    self.say(self.report.chaos_events[-1])
                    return
        self.report.problems.append("found no running AM to kill")

    def wait_all(self, deadline: float) -> None:
        last = ""
        while True:
            jobs = self.jobs()
            ours = [jobs[p.job_id] for p in self.plans]
            left = [j for j in ours if j.state not in TERMINAL]
            line = f"{len(ours) - len(left)}/{len(ours)} jobs ended"
            if line != last:
                self.say(line)
                last = line
            if not left:
                return
            if time.monotonic() > deadline:
                for j in left:
                    self.report.problems.append(f"{j.job_id} still {pb.JobState.Name(j.state)} at the deadline: "
                                                f"{j.waiting_reason or j.diagnostics}")
                return
            time.sleep(0.5)

    # ------------------------------------------------------------ the checks

    def check_jobs(self) -> None:
        jobs = self.jobs()
        for p in self.plans:
            job = jobs.get(p.job_id)
            if job is None:
                self.report.problems.append(f"{p.job_id} ({p.kind}): acknowledged at submission, now unknown")
                continue
            state = pb.JobState.Name(job.state).removeprefix("JOB_")
            self.report.by_state[state] = self.report.by_state.get(state, 0) + 1
            self.report.attempts += len(job.attempts)
            self.report.retries += job.failures
            where = f"{p.job_id} ({p.kind}, {p.gpus} GPUs)"
            counted = sum(1 for a in job.attempts if a.counts_as_failure)
            if counted != job.failures:
                self.report.problems.append(f"{where}: {job.failures} failures reported, {counted} attempts count")
            for a in job.attempts:
                should = a.failure in (pb.FAILURE_USER, pb.FAILURE_INFRA)
                if a.state == pb.JOB_FAILED and a.counts_as_failure != should:
                    self.report.problems.append(f"{where}: attempt {a.attempt} ({pb.FailureKind.Name(a.failure)}: "
                                                f"{a.cause}) counts_as_failure={a.counts_as_failure}")
            if p.kind == "ok":
                if job.state != pb.JOB_SUCCEEDED:
                    self.report.problems.append(f"{where}: {state}, expected SUCCEEDED: {job.diagnostics}")
                for a in job.attempts[:-1]:
                    if a.failure == pb.FAILURE_USER:
                        self.report.problems.append(f"{where}: attempt {a.attempt} failed as a user error: {a.cause}")
            elif p.kind == "fail":
                # Every attempt exits with 3 unless the chaos ended it first (an infrastructure cause, which also
                # counts); the job fails when the counted failures pass max_retries.
                user = [a for a in job.attempts if a.failure == pb.FAILURE_USER]
                others = [a for a in job.attempts if a.counts_as_failure and a.failure != pb.FAILURE_USER]
                if job.state != pb.JOB_FAILED or not user or any(a.exit_code != 3 for a in user) \
                        or any(a.failure != pb.FAILURE_INFRA for a in others) \
                        or job.failures != 1 + p.max_retries:
                    causes = "; ".join(f"{a.attempt}: {pb.FailureKind.Name(a.failure)} {a.cause}"
                                       for a in job.attempts)
                    self.report.problems.append(f"{where}: {state} with attempts [{causes}], expected FAILED after "
                                                f"{1 + p.max_retries} counted failures exiting with 3 "
                                                f"({job.diagnostics})")
            elif job.state != pb.JOB_KILLED or job.failures:
                self.report.problems.append(f"{where}: {state} with {job.failures} failures, expected KILLED")

    def records(self) -> list[dict[str, object]]:
        out = []
        for a in self.agents:
            for path in sorted((a.state / "containers").glob("*/record.json")):
                with contextlib.suppress(OSError, ValueError):
                    out.append(json.loads(path.read_text()))
        return out

    def check_gpus(self) -> None:
        """No two containers' lives overlap on one GPU (records' start_ms..end_ms per node and index)."""
        by_gpu: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
        records = self.records()
        self.report.containers_checked = len(records)
        now_ms = int(time.time() * 1000)
        for r in records:
            start = int(r.get("start_ms") or 0)
            if not start:
                continue
            end = int(r.get("end_ms") or 0) or now_ms
            for g in r.get("gpu_indices") or []:          # type: ignore[union-attr]
                by_gpu.setdefault((str(r["node_id"]), int(g)), []).append((start, end, str(r["container_id"])))
        for (node, gpu), lives in sorted(by_gpu.items()):
            lives.sort()
            for (_, e1, c1), (s2, _, c2) in itertools.pairwise(lives):
                if s2 < e1:
                    self.report.problems.append(f"GPU {gpu} of {node} shared: {c1} ran until {e1}, {c2} started "
                                                f"at {s2}")

    def check_attempts(self) -> None:
        """No two attempts of a job ran at once: from the agents' records, and (with a network) the processes."""
        if self.net is None:
            return
        self.report.problems += attempts_overlap(self.records())
        if self.watch is not None:
            self.report.problems += self.watch.overlaps

    def check_leftovers(self, after_stop: bool) -> None:
        deadline = time.monotonic() + 10
        while True:
            left = {pid for a in self.agents for pid in a.processes()}
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        if left:
            when = "after the agents stopped" if after_stop else "after every job ended"
            self.report.problems.append(f"{len(left)} container processes left {when}: {sorted(left)}")
            for pid in left:
                kill_group(pid)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/chaos", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run N jobs on a local 4-node cluster while killing the RM (twice), an agent and an AM; "
                    "exit 0 only if every check holds. The last line is a one-line summary.",
        epilog="example:\n  scripts/chaos --jobs 200 --seed 3\n  scripts/chaos --jobs 50 --keep /tmp/chaos\n"
               "  scripts/chaos --ha --jobs 50     # a leader and a standby RM on PostgreSQL")
    parser.add_argument("--jobs", type=int, default=50, help="jobs to run (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for job sizes and fault timing")
    parser.add_argument("--timeout", type=float, default=0, help="seconds to wait for every job (default: scales "
                                                                  "with --jobs)")
    parser.add_argument("--keep", metavar="DIR", help="keep state and logs in DIR (default: a temporary dir)")
    parser.add_argument("--netns", action="store_true",
                        help="(root) agents in network namespaces on a bridge; adds partitions RM<->agent and "
                             "agent<->agent, packet loss and delay (tc netem where it exists), and checks that no "
                             "two attempts of a job ran at once")
    parser.add_argument("--ha", action="store_true",
                        help="two RMs on a throwaway PostgreSQL: the leader is SIGKILLed, later SIGSTOPped, instead "
                             "of one RM restarted; prints the takeover times")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs: must be at least 1")
    if args.netns and netns.root_problem():
        parser.error(f"--netns: {netns.root_problem()}")
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpurm-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        # Run as root, the agents start jobs as an unprivileged user (and PostgreSQL runs as `postgres`): they
        # must get through to their own dirs below this one (mkdtemp makes it 0700), as in `gpurm dev-cluster`.
        os.chmod(workdir, 0o711)

    def say(text: str) -> None:
        sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")

    old = signal.getsignal(signal.SIGINT)
    try:
        with contextlib.ExitStack() as stack:
            net = ChaosNet([f"chaos-n{i}" for i in range(NODES)], ["rm-a", "rm-b"] if args.ha else ()) \
                if args.netns else None
            if net is not None:
                stack.callback(net.close)
                say(f"agents in network namespaces on bridge {net.net.bridge} ({net.gateway})")
            broker = stack.enter_context(run_broker(workdir / "broker", host=net.gateway if net else "127.0.0.1"))
            ha_store = ""
            if args.ha:
                from tests.pg import run_postgres

                pg_host = net.gateway if net is not None else "127.0.0.1"
                ha_store = stack.enter_context(run_postgres(workdir / "postgres", host=pg_host)).create_database()
                say("PostgreSQL up; two RMs on it")
            chaos = Chaos(workdir, broker, args.jobs, args.seed, say, ha_store=ha_store, net=net)
            report = chaos.run(timeout=args.timeout or 120 + 4 * args.jobs + (60 if net else 0))
    finally:
        signal.signal(signal.SIGINT, old)
    for problem in report.problems:
        print(f"problem: {problem}")
    print(f"state and logs: {workdir}")
    print(report.line())
    if not args.keep and report.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
