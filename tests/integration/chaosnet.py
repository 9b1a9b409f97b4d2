"""`scripts/chaos --netns`: the chaos run's network. Each agent (and its AMs and learners) runs in a network namespace
of its own with an address on a bridge, the RM and the broker listen on the bridge (gpurm/cli/netns.py), and on
top of the process kills the run cuts and degrades the network:

- RM <-> agent: one server cut off from the RM for longer than the node expiry, so its agent's fence stops its
  learners and the RM declares it LOST and restarts its jobs elsewhere; then the cut heals and it registers again;
- agent <-> agent: two servers cut from each other (the learners of a job spread over both are split; an AM on one
  cannot start learners on the other), the RM still reachable from both;
- packet loss on one server (iptables statistic), and delay where tc netem exists (a line says when it does not).

The checks it adds: no two attempts of a job ever ran at the same moment, from the agents' records (every pair of
learner containers of different attempts, start to end) and from the processes (sampled while the run goes on).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from gpurm.cli import netns
from tests.integration.harness import alive

CUT_PEERS_S = 8.0
LOSS_S = 10.0
LOSS_SHARE = 0.1
DELAY_MS = 50


class ChaosNet:
    def __init__(self, node_ids: list[str], rms: Sequence[str] = ()) -> None:
        """`node_ids`: the agents' namespaces; `rms` (with --ha): a namespace for each RM as well, so that one can
        be cut from the store alone."""
        self.name = f"c{uuid.uuid4().hex[:6]}"
        self.agents = list(node_ids)
        self.rms = list(rms)
        self.net = netns.create(self.name, [*node_ids, *rms])

    @property
    def rm_hosts(self) -> list[str]:
        """Where the RMs listen: their own namespaces' addresses (--ha), else the bridge's."""
        return [self.address(r) for r in self.rms] or [self.gateway]

    def namespace_at(self, host: str) -> str:
        return next(n.namespace for n in self.net.nodes.values() if n.address == host)

    @property
    def gateway(self) -> str:
        return self.net.gateway

    def wrap(self, node_id: str) -> list[str]:
        return netns.in_namespace(self.net.nodes[node_id].namespace, [])

    def address(self, node_id: str) -> str:
        return self.net.nodes[node_id].address

    def close(self) -> None:
        netns.remove(self.name)

    # ------------------------------------------------------------ the faults

    def cut_from_rm(self, rng_choice: Callable[[list[str]], str], say: Callable[[str], None], cut_s: float) -> str:
        """Cut one server off the RM for `cut_s` (past the node expiry: its fence stops its containers, the RM
        declares it LOST), then heal; the event, as a line."""
        victim = rng_choice(self.agents)
        ns = self.net.nodes[victim].namespace
        netns.partition(ns, self.rm_hosts)
        line = f"{victim} cut off from the RM for {cut_s:g}s"
        say(line)
        time.sleep(cut_s)
        netns.heal(ns)
        return line

    def degrade(self, rng_choice: Callable[[list[str]], str], say: Callable[[str], None]) -> list[str]:
        """Two servers cut from each other, then packet loss (and delay, where tc netem exists) on one; each
        healed before the next; the events, as lines."""
        nodes = self.agents
        events: list[str] = []

        def event(text: str) -> None:
            events.append(text)
            say(text)

        a = rng_choice(nodes)
        b = rng_choice([n for n in nodes if n != a])
        netns.partition(self.net.nodes[a].namespace, [self.address(b)])
        event(f"{a} and {b} cut from each other for {CUT_PEERS_S:g}s")
        time.sleep(CUT_PEERS_S)
        netns.heal(self.net.nodes[a].namespace)
        lossy = rng_choice(nodes)
        netns.loss(self.net.nodes[lossy].namespace, LOSS_SHARE)
        why = netns.delay(self.net.nodes[lossy].namespace, DELAY_MS)
        event(f"{lossy} drops {LOSS_SHARE:.0%} of its packets for {LOSS_S:g}s"
              + (f", {DELAY_MS} ms delay" if not why else f"; {why}"))
        time.sleep(LOSS_S)
        netns.heal(self.net.nodes[lossy].namespace)
        return events


class AttemptWatch:
    """Samples, every `period_s`, which attempts of each job have a live learner process (from the agents' records
    of running containers and their pids); notes any job seen with two at once."""

    def __init__(self, records: Callable[[], list[dict[str, object]]], period_s: float = 0.2) -> None:
        self.records = records
        self.period_s = period_s
        self.overlaps: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attempt-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            live: dict[str, set[int]] = {}
            for r in self.records():
                pid = int(str(r.get("pid") or 0))
                if r.get("kind") == "CONTAINER_LEARNER" and r.get("state") == "CONTAINER_RUNNING" and pid \
                        and alive(pid):
                    live.setdefault(str(r["job_id"]), set()).add(int(str(r.get("attempt") or 0)))
            self.samples += 1
            for job, attempts in live.items():
                if len(attempts) > 1 and len(self.overlaps) < 20:
                    self.overlaps.append(f"{job}: attempts {sorted(attempts)} had live learners at once "
                                         f"({time.strftime('%H:%M:%S')})")


def attempts_overlap(records: list[dict[str, object]]) -> list[str]:
    """Learner containers of different attempts of one job whose lives (start_ms..end_ms) overlap."""
    by_job: dict[str, list[tuple[int, int, int, str]]] = {}
    now_ms = int(time.time() * 1000)
    for r in records:
        start = int(str(r.get("start_ms") or 0))
        if r.get("kind") != "CONTAINER_LEARNER" or not start:
            continue
        end = int(str(r.get("end_ms") or 0)) or now_ms
        by_job.setdefault(str(r["job_id"]), []).append((start, end, int(str(r.get("attempt") or 0)),
                                                         str(r["container_id"])))
    problems = []
    for job, lives in sorted(by_job.items()):
        for (s1, e1, a1, c1), (s2, e2, a2, c2) in itertools.combinations(lives, 2):
            if a1 != a2 and s1 < e2 and s2 < e1:
                problems.append(f"{job}: attempt {a1} ({c1}) and attempt {a2} ({c2}) ran at the same moment")
    return problems
