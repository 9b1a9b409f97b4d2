"""Simulated agents (and the AMs of the jobs they run) for scripts/bench/rm_scale: one process, N nodes.

Each node speaks the real ResourceTracker protocol to a real RM: RegisterNode with a join proof made from the RM's
own key (as `gpurm admin node-secret` would hand an agent), then one heartbeat stream carrying container deltas,
re-registering with all its containers after any break, after a jittered wait as the real agent does. One gRPC
ContainerManager server stands for every node's agent: the RM starts AMs there, and each AM is a small task that
registers, asks for its job's GPUs, marks its granted learners running on their nodes, holds them a while,
ends them and finishes. Lines on stdin drive it (`stats`, `reset`, `quit`); replies are JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import random
import resource
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpurm.common.callers import AM_TOKEN_KEY
from gpurm.common.tokens import ClusterKeys, join_proof
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg

# The nodes follow the interval the RM names in its heartbeat replies (an RM from before that names none there: the
# same harness measures it too).
FOLLOWS = {"follows_interval": True} if "follows_interval" in pb.RegisterNodeRequest.DESCRIPTOR.fields_by_name else {}


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Stats:
    beat_rtt: list[float] = field(default_factory=list)
    allocate: list[float] = field(default_factory=list)
    granted: list[float] = field(default_factory=list)     # submit (RM clock) to all GPUs granted
    register: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)          # this process's own event loop lag
    registrations: int = 0
    reregister_asked: int = 0                                # the RM answered a beat with REREGISTER
    stream_breaks: int = 0
    watchdog_breaks: int = 0                                 # streams given up for a silent RM (as the real agent)
    silent_writing: int = 0                                  # ... of which the node's last write had not completed
    silent_unanswered: int = 0                               # ... of which the RM had answered no beat on the stream
    am_started: int = 0
    am_finished: int = 0
    am_errors: int = 0
    last_error: str = ""


@dataclass
class SimNode:
    node_id: str
    rack: str
    gpus: int
    session: str = ""
    seq: int = 0
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    sent: dict[int, float] = field(default_factory=dict)
    live: dict[str, pb.ContainerStatus] = field(default_factory=dict)
    pending: dict[str, tuple[pb.ContainerStatus, int]] = field(default_factory=dict)   # status, first seq sent
    up: bool = False
    interval: float = 1.0
    spread: float = 0.0        # how long the RM wants re-registrations spread over after a break
    waiting: asyncio.Future[None] | None = None   # the beat loop's pause, which a container change cuts short
    replied: float = 0.0       # loop time of the RM's last reply on the current stream (or of its start)
    answered: bool = False     # the RM answered a beat on the current stream
    writing: bool = False      # a beat's write is under way
    call: Any = None           # the heartbeat stream

    def report(self, status: pb.ContainerStatus) -> None:
        if status.state in (pb.CONTAINER_STARTING, pb.CONTAINER_RUNNING):
            self.live[status.container_id] = status
        else:
            self.live.pop(status.container_id, None)
        self.pending[status.container_id] = (status, 0)
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(None)       # as the real agent: a change goes out at once, not at the next beat


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def pause(node: SimNode, seconds: float) -> bool:
    """Sleep until the next beat is due or a container change comes (then True, after 20 ms for the changes of a
    gang to share the beat, as the real agent's COALESCE_S). One future and one timer, as asyncio.sleep itself."""
    loop = asyncio.get_running_loop()
    fut = node.waiting = loop.create_future()
    handle = loop.call_later(seconds, _wake, fut)
    try:
        await fut
    finally:
        handle.cancel()
        node.waiting = None
    if node.pending:
        await asyncio.sleep(0.02)
        return True
    return False


class Fleet:
    def __init__(self, args: argparse.Namespace, keys: ClusterKeys) -> None:
        self.args = args
        self.keys = keys
        self.stats = Stats()
        ids = [args.first + i for i in range(args.nodes)]
        self.nodes = {f"n{i:05d}": SimNode(f"n{i:05d}", f"rack{i % args.racks}", args.gpus) for i in ids}
        # Real agents have a connection each; these share connections, at most 100 streams to one (the RM
        # refuses more than limits.max_streams_per_connection, 128 by default).
        channels = max(args.channels, len(self.nodes) // 100 + 1)
        self.channels = [grpc.aio.insecure_channel(args.rm, options=[("grpc.use_local_subchannel_pool", 1)])
                         for _ in range(channels)]
        self.cm_port = args.cm_port
        self.measuring = True
        self.tasks: set[asyncio.Task[Any]] = set()
        self.started: dict[str, pb.ContainerStatus] = {}      # containers this process started, until they end
        # The AMs' process hands container changes to the process whose simulated node runs them (--relay).
        self.relays: list[tuple[int, int, str]] = [(int(a), int(b), path) for path, a, b in
                                                   (r.rsplit(":", 2) for r in args.relay)]
        self.relay_writers: dict[str, asyncio.StreamWriter] = {}
        self.relay_waiting: dict[str, list[bytes]] = {}

    def channel(self, i: int) -> grpc.aio.Channel:
        return self.channels[i % len(self.channels)]

    # ------------------------------------------------------------ one node

    async def run_node(self, i: int, node: SimNode) -> None:
        """As the real agent (nodeagent/tracker.py): after a session breaks, come back at a random point of the
        spread the RM asked for; while the RM does not answer, retry with a jittered exponential back-off."""
        tracker = pbg.ResourceTrackerStub(self.channel(i))
        backoff = 0.2
        while True:
            was_up = False
            try:
                await self.register(tracker, node)
                backoff = 0.2
                was_up = True
                await self.beat(tracker, node)
                continue                                  # asked to register again: at once
            except Exception as exc:        # a stream the watchdog cancelled ends in any of several ways
                self.stats.stream_breaks += was_up
                self.stats.last_error = str(exc)[:200]
            node.up = False
            if was_up:
                await asyncio.sleep(max(random.uniform(0.1, 0.3), random.uniform(0, node.spread)))
            else:
                await asyncio.sleep(random.uniform(backoff / 2, backoff))
                backoff = min(backoff * 2, 5.0)

    async def register(self, tracker: Any, node: SimNode) -> None:
        node.instance = uuid.uuid4().hex
        request = pb.RegisterNodeRequest(
            node_id=node.node_id, host="127.0.0.1", agent_port=self.cm_port, rack=node.rack, cpus=64,
            memory_mib=512 * 1024, healthy=True, agent_version="rm_scale", agent_instance=node.instance,
            **FOLLOWS,
            gpus=[pb.GpuInfo(index=g, uuid=f"GPU-{node.node_id}-{g}", model="sim", memory_mib=81920, healthy=True,
                             numa_node=g // 4) for g in range(node.gpus)],
            containers=[*node.live.values(), *(s for s, _ in node.pending.values() if s.container_id not in node.live)])
        request.join_time_ms = int(time.time() * 1000)
        request.join_proof = join_proof(self.keys.node_key(node.node_id).secret, node.node_id, node.instance,
                                        request.join_time_ms)
        began = time.perf_counter()
        reply = await tracker.RegisterNode(request, timeout=30)
        if self.measuring:
            self.stats.register.append(time.perf_counter() - began)
        self.stats.registrations += 1
        node.pending = {k: v for k, v in node.pending.items() if k in node.live}
        for cid in reply.stop_containers:
            node.live.pop(cid, None)
            node.pending.pop(cid, None)
        node.session = reply.session
        node.interval = reply.heartbeat_interval_ms / 1000 or 1.0
        node.spread = reply.resync_spread_ms / 1000
        node.up = True

    async def beat(self, tracker: Any, node: SimNode) -> float:
        """Beat every interval the RM names until the stream breaks or the RM asks for a new registration. Lean
        on purpose (one timer per beat, one plain read per reply): ten thousand of these share one process, and the
        RM is what is measured. A container change cuts the wait short (as the real agent: it goes out at once)."""
        call = node.call = tracker.Heartbeat()
        reader = asyncio.ensure_future(self.read(call, node))
        node.replied, node.answered, node.writing = asyncio.get_running_loop().time(), False, False
        try:
            await pause(node, random.uniform(0, node.interval))    # nodes beat out of phase, as real ones do
            while not reader.done():
                node.seq += 1
                statuses = []
                for cid, (status, first) in list(node.pending.items()):
                    if not first:
                        node.pending[cid] = (status, node.seq)
                    statuses.append(status)
                node.sent[node.seq] = time.perf_counter()
                node.writing = True
                await call.write(pb.NodeHeartbeat(node_id=node.node_id, session=node.session, seq=node.seq,
                                                  containers=statuses, healthy=True))
                node.writing = False
                await pause(node, node.interval)
            reader.result()
            return node.spread
        finally:
            node.call = None
            call.cancel()
            reader.cancel()

    async def read(self, call: Any, node: SimNode) -> None:
        while True:
            reply = await call.read()
            if reply is grpc.aio.EOF:
                raise ConnectionError("the RM closed the stream")
            node.replied, node.answered = asyncio.get_running_loop().time(), True
            if getattr(reply, "heartbeat_interval_ms", 0):
                node.interval = reply.heartbeat_interval_ms / 1000      # the RM's pacing (rm/state/heartbeats.py)
            sent = node.sent.pop(reply.ack_seq, None)
            if sent is not None and self.measuring:
                self.stats.beat_rtt.append(time.perf_counter() - sent)
            if len(node.sent) > 3:
                for old in [s for s in node.sent if s < reply.ack_seq]:
                    del node.sent[old]
            if reply.ack_seq and node.pending:
                for cid, (_, first) in list(node.pending.items()):
                    if first and first <= reply.ack_seq:
                        del node.pending[cid]
            for order in reply.stop:
                if order.container_id in node.live:
                    status = node.live[order.container_id]
                    node.report(pb.ContainerStatus(container_id=status.container_id, job_id=status.job_id,
                                                   kind=status.kind, state=pb.CONTAINER_EXITED, stopped=True,
                                                   signal=15, node_id=node.node_id,
                                                   gpu_indices=status.gpu_indices, end_ms=int(time.time() * 1000)))
            if reply.action == pb.HEARTBEAT_REREGISTER:
                self.stats.reregister_asked += 1
                return

    async def watchdog(self) -> None:
        """As the real agent's (nodeagent/tracker.py): the RM answers every beat, so three intervals and 5 s of
        silence mean the stream is dead even when TCP has not noticed; the node registers again. Counted, with
        whether its last write was still under way and whether the RM had answered anything on that stream."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            for node in self.nodes.values():
                if node.call is not None and now - node.replied > 3 * node.interval + 5.0:
                    self.stats.watchdog_breaks += 1
                    self.stats.silent_writing += node.writing
                    self.stats.silent_unanswered += not node.answered
                    node.call.cancel()
                    node.call = None

    # ------------------------------------------------------------ containers and AMs

    def start(self, payload: pb.ContainerTokenPayload) -> pb.ContainerStatus:
        status = pb.ContainerStatus(container_id=payload.container_id, job_id=payload.job_id, kind=payload.kind,
                                    state=pb.CONTAINER_RUNNING, pid=4242, node_id=payload.node_id,
                                    gpu_indices=payload.gpu_indices, start_ms=int(time.time() * 1000))
        self.started[payload.container_id] = status
        self.report(status)
        return status

    def end(self, node_id: str, container_id: str) -> None:
        s = self.started.pop(container_id, None)
        if s is None:
            return
        self.report(pb.ContainerStatus(container_id=s.container_id, job_id=s.job_id, kind=s.kind,
                                       state=pb.CONTAINER_EXITED, exit_code=0, node_id=node_id,
                                       gpu_indices=s.gpu_indices, end_ms=int(time.time() * 1000)))

    def report(self, status: pb.ContainerStatus) -> None:
        """A container change, onto its node's next beat: here, or in the process that simulates the node."""
        if not self.relays:
            self.take(status)
            return
        index = int(status.node_id[1:])
        path = next(p for first, count, p in self.relays if first <= index < first + count)
        line = status.node_id.encode() + b" " + base64.b64encode(status.SerializeToString()) + b"\n"
        writer = self.relay_writers.get(path)
        if writer is not None:
            writer.write(line)
        elif path in self.relay_waiting:
            self.relay_waiting[path].append(line)      # in order, behind the connection being made
        else:
            self.relay_waiting[path] = [line]
            task = asyncio.ensure_future(self._connect_relay(path))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _connect_relay(self, path: str) -> None:
        _, writer = await asyncio.open_unix_connection(path)
        for line in self.relay_waiting.pop(path):
            writer.write(line)
        self.relay_writers[path] = writer

    def take(self, status: pb.ContainerStatus) -> None:
        node = self.nodes.get(status.node_id)
        if node is None:
            return
        if status.state == pb.CONTAINER_EXITED and status.container_id not in node.live:
            return          # ended already (a stop order the node carried out)
        node.report(status)

    async def serve_relay(self, path: str) -> asyncio.AbstractServer:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while line := await reader.readline():
                _, data = line.split(b" ", 1)
                self.take(pb.ContainerStatus.FromString(base64.b64decode(data)))

        return await asyncio.start_unix_server(on_connect, path)

    async def am(self, payload: pb.ContainerTokenPayload, env: dict[str, str]) -> None:
        self.stats.am_started += 1
        stub = pbg.ApplicationMasterStub(self.channel(hash(payload.job_id)))
        token = env["GPURM_AM_TOKEN"]
        job_id, attempt = env["GPURM_JOB_ID"], int(env["GPURM_AM_ATTEMPT"])
        try:
            reg = await stub.RegisterApplicationMaster(
                pb.RegisterAMRequest(job_id=job_id, am_attempt=attempt, host="127.0.0.1"),
                metadata=((AM_TOKEN_KEY, token),), timeout=30)
            token = reg.am_token or token
            gpus = reg.job.spec.gpus
            per = min(gpus, self.args.gpus)
            asks = [pb.ResourceAsk(gpus=per, count=gpus // per)]
            interval = max(reg.allocate_interval_ms / 1000, 0.2)
            response_id, got, learners = 0, 0, []
            granted_at = None
            started = int(time.time() * 1000)
            report = pb.AttemptReport(attempt=1, state=pb.JOB_ALLOCATING, start_ms=started,
                                      waiting_reason="acquiring")
            while True:
                began = time.perf_counter()
                reply = await stub.Allocate(pb.AllocateRequest(job_id=job_id, am_attempt=attempt,
                                                               response_id=response_id,
                                                               asks=asks if granted_at is None else [],
                                                               attempts=[report] if report else []),
                                            metadata=((AM_TOKEN_KEY, token),), timeout=30)
                report = None
                if self.measuring:
                    self.stats.allocate.append(time.perf_counter() - began)
                response_id = reply.response_id
                token = reply.am_token or token
                if reply.kill_requested:
                    break
                for g in reply.grants:
                    got += len(g.gpu_indices)
                    learners.append(g)
                    self.start(pb.ContainerTokenPayload.FromString(g.token.payload))
                if granted_at is None and got >= gpus:
                    granted_at = time.time()
                    if self.measuring:
                        self.stats.granted.append(granted_at - reg.job.submit_ms / 1000)
                    asks = []
                    # As the real AM: the gang runs, say so at once (the job leaves the acquiring count).
                    running = [pb.Learner(rank=i, container_id=g.container_id, node_id=g.node_id,
                                          gpu_indices=g.gpu_indices, state=pb.CONTAINER_RUNNING)
                               for i, g in enumerate(learners)]
                    report = pb.AttemptReport(attempt=1, state=pb.JOB_RUNNING, start_ms=started, learners=running)
                    continue
                left = self.args.hold - (time.time() - granted_at) if granted_at is not None else 0.0
                if granted_at is not None and left <= 0:
                    break
                # As the real AM (am/runner.py): every interval while acquiring; once running, 4x less often, or
                # as much less as the RM asks (rm/sched/pacing.py). It wakes to finish when its hold is over.
                steady = max(4 * interval, reply.steady_interval_ms / 1000)
                await asyncio.sleep(interval if granted_at is None else min(steady, left))
            for g in learners:
                self.end(g.node_id, g.container_id)
            done = pb.AttemptReport(attempt=1, state=pb.JOB_SUCCEEDED, start_ms=started,
                                    end_ms=int(time.time() * 1000))
            await stub.FinishApplicationMaster(pb.FinishAMRequest(job_id=job_id, am_attempt=attempt,
                                                                  final_state=pb.JOB_SUCCEEDED, attempts=[done]),
                                               metadata=((AM_TOKEN_KEY, token),), timeout=30)
            self.stats.am_finished += 1
        except grpc.aio.AioRpcError as exc:
            self.stats.am_errors += 1
            self.stats.last_error = f"AM {job_id}: {exc.code().name}: {exc.details()}"[:300]
        finally:
            self.end(payload.node_id, payload.container_id)

    # ------------------------------------------------------------ control

    def snapshot(self) -> dict[str, Any]:
        s = self.stats
        return {"event": "stats", "nodes": len(self.nodes), "up": sum(n.up for n in self.nodes.values()),
                "beats": len(s.beat_rtt), "beat_p50_ms": pct(s.beat_rtt, .5) * 1000,
                "beat_p99_ms": pct(s.beat_rtt, .99) * 1000, "beat_max_ms": max(s.beat_rtt, default=0) * 1000,
                "allocates": len(s.allocate), "allocate_p50_ms": pct(s.allocate, .5) * 1000,
                "allocate_p99_ms": pct(s.allocate, .99) * 1000, "granted": len(s.granted),
                "granted_p50_ms": pct(s.granted, .5) * 1000, "granted_p99_ms": pct(s.granted, .99) * 1000,
                "register_p50_ms": pct(s.register, .5) * 1000, "register_p99_ms": pct(s.register, .99) * 1000,
                "registrations": s.registrations, "reregister_asked": s.reregister_asked,
                "stream_breaks": s.stream_breaks, "watchdog_breaks": s.watchdog_breaks,
                "silent_writing": s.silent_writing, "silent_unanswered": s.silent_unanswered,
                "am_started": s.am_started, "am_finished": s.am_finished,
                "am_errors": s.am_errors, "last_error": s.last_error,
                "live_containers": sum(len(n.live) for n in self.nodes.values()),
                "interval_min_s": min((n.interval for n in self.nodes.values()), default=0.0),
                "interval_max_s": max((n.interval for n in self.nodes.values()), default=0.0),
                "fleet_lag_p50_ms": pct(s.lag, .5) * 1000, "fleet_lag_p99_ms": pct(s.lag, .99) * 1000,
                "fleet_cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2])}

    def reset(self) -> None:
        self.stats = Stats()


class CM(pbg.ContainerManagerServicer):
    """Every simulated node's agent: starts are recorded on the node the token names (tokens are not checked:
    the real agent's checks are not what this benchmark measures)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    async def StartContainer(self, request: pb.StartContainerRequest, context: Any) -> pb.StartContainerResponse:
        payload = pb.ContainerTokenPayload.FromString(request.token.payload)
        status = self.fleet.start(payload)
        if payload.kind == pb.CONTAINER_AM and not self.fleet.args.no_ams:
            task = asyncio.ensure_future(self.fleet.am(payload, dict(request.launch.env)))
            self.fleet.tasks.add(task)
            task.add_done_callback(self.fleet.tasks.discard)
        return pb.StartContainerResponse(status=status)

    async def StopContainer(self, request: pb.StopContainerRequest, context: Any) -> pb.StopContainerResponse:
        payload = pb.ContainerTokenPayload.FromString(request.token.payload)
        self.fleet.end(payload.node_id, request.container_id)
        return pb.StopContainerResponse()


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rm", required=True)
    ap.add_argument("--keys", required=True, type=Path)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--racks", type=int, default=50)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--hold", type=float, default=5.0)
    ap.add_argument("--no-ams", action="store_true", help="AM containers start but never register")
    ap.add_argument("--ramp", type=float, default=10.0, help="seconds over which the nodes first register")
    ap.add_argument("--cm-port", type=int, default=0,
                    help="the agents' ContainerManager is another process's (its AMs run there); 0: this one's")
    ap.add_argument("--reports", help="a unix socket where that process hands over container changes")
    ap.add_argument("--relay", action="append", default=[], metavar="PATH:FIRST:COUNT",
                    help="(the AMs' process) where the changes of nodes FIRST.. go")
    args = ap.parse_args()
    fleet = Fleet(args, ClusterKeys.load(args.keys))
    server = None
    if not args.cm_port:
        server = grpc.aio.server()
        pbg.add_ContainerManagerServicer_to_server(CM(fleet), server)
        fleet.cm_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    relay = await fleet.serve_relay(args.reports) if args.reports else None
    began = time.perf_counter()

    async def staggered(i: int, node: SimNode) -> None:
        await asyncio.sleep(args.ramp * i / max(len(fleet.nodes), 1))
        await fleet.run_node(i, node)

    runners = [asyncio.ensure_future(staggered(i, n)) for i, n in enumerate(fleet.nodes.values())]

    async def lag() -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            await asyncio.sleep(0.1)
            fleet.stats.lag.append(max(0.0, loop.time() - began - 0.1))

    runners.append(asyncio.ensure_future(lag()))
    runners.append(asyncio.ensure_future(fleet.watchdog()))
    while sum(n.up for n in fleet.nodes.values()) < len(fleet.nodes):
        await asyncio.sleep(0.2)
    gc.freeze()                 # the fleet's own heap is not what is measured (see settle_heap in rm/server/startup.py)
    gc.set_threshold(20_000, 20, 100)
    emit({"event": "ready", "seconds": time.perf_counter() - began, "cm_port": fleet.cm_port})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line == "stats":
            emit(fleet.snapshot())
        elif line == "reset":
            fleet.reset()
            emit({"event": "reset"})
        elif line == "up":
            emit({"event": "up", "up": sum(n.up for n in fleet.nodes.values())})
        elif line == "quit":
            break
    for r in runners:
        r.cancel()
    if relay is not None:
        relay.close()
    if server is not None:
        await server.stop(0)


if __name__ == "__main__":
    try:
        import uvloop  # ten thousand streams in one process: the client side must not be what is measured
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
