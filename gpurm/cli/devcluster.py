"""`gpurm dev-cluster`: an RM and N agents with fake GPUs on loopback, as real separate processes.

Layout of the state dir:
    cluster.json            pids, addresses; "ready": true once every agent has registered
    rm/rm.yaml rm/rm.log    the RM's config, log, store and key
    rm-K/                   with --rms N: the standby RMs' (the same cluster key; one PostgreSQL store for all)
    agents/node-K/          each agent's config, log and container state (learner logs under containers/)
Ctrl-C or SIGTERM stops the agents (which stop their containers), then the RM; anything left is killed.

With --netns (root) each agent and its containers run in a network namespace of their own, `gpurm-<cluster>-<node>`,
with an address on a bridge where the RM and its broker listen (gpurm/cli/netns.py); cluster.json lists each
node's namespace and address. They are removed when the cluster stops, and those of a killed one at the next start.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from gpurm.cli import netns
from gpurm.cli.basics import CliError
from gpurm.cli.client import current_user
from gpurm.common import tls
from gpurm.common.callers import AM_PREFIX
from gpurm.common.fields import parse_duration
from gpurm.common.tls import NODE_PREFIX, TLSConfig, load_tls
from gpurm.common.tokens import ClusterKeys, write_secret_file
from gpurm.nodeagent.config import DEFAULT_ENV_PASSTHROUGH
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.security import pki
from gpurm.rm.server import paging

READY_TIMEOUT_S = 60.0
NETNS_ENV = {"GLOO_SOCKET_IFNAME": netns.NODE_IFNAME, "NCCL_SOCKET_IFNAME": netns.NODE_IFNAME}
MAX_RMS = 5
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the dev cluster itself dies, so nothing is orphaned."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Daemon:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509 (single-threaded)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        data = data.setdefault(k, {})
    data[keys[-1]] = value


class DevPki:
    """`--tls`: a CA and every certificate the cluster needs, made on the fly under <state>/pki."""

    def __init__(self, directory: Path, nodes: list[str], user: str, net: netns.ClusterNet | None = None) -> None:
        self.dir = directory
        ca = directory / "ca"
        pki.init_ca(ca, name="gpurm dev-cluster CA", days=30)
        hosts = ["127.0.0.1", "localhost"]
        self.rm = pki.issue(ca, "rm", directory / "rm", hosts + ([net.gateway] if net else []), days=30)
        self.nodes = {n: pki.issue(ca, f"{NODE_PREFIX}{n}", directory / n,
                                   hosts + ([net.nodes[n].address] if net else []), days=30) for n in nodes}
        # The AMs an agent starts dial the RM with this one (they prove their job with an AM token); the agent
        # copies it into each AM's container dir for the job's user.
        self.am = pki.issue(ca, f"{AM_PREFIX}dev-cluster", directory / "am", days=30)
        self.user = pki.issue(ca, user, directory / "user", days=30)

    def client_tls(self) -> TLSConfig:
        return load_tls(self.user.tls_section())


class DevCluster:
    def __init__(self, args: argparse.Namespace, state_dir: Path) -> None:
        self.args = args
        self.state_dir = state_dir
        # --netns: the nodes' namespaces and the bridge, made in start(); the RMs listen on the bridge.
        self.net: netns.ClusterNet | None = None
        self.net_name = f"d{hashlib.sha256(str(state_dir).encode()).hexdigest()[:6]}" if getattr(
            args, "netns", False) else ""
        self.rm_host = "127.0.0.1"
        self.address = f"{self.rm_host}:{args.port}"
        # With --rms N, RM K (K > 1) listens on a free port and keeps its own state dir, rm-K; clients and agents
        # get every address and follow the leader.
        self.addresses = [self.address] + [f"127.0.0.1:{_free_port()}" for _ in range(getattr(args, "rms", 1) - 1)]
        # Their web UIs, on ports that stay theirs across restarts: a standby's sends browsers to the leader's
        # (rm/http/standby.py).
        http_port = getattr(args, "http_port", 0)
        first = http_port if http_port or len(self.addresses) == 1 else _free_port()
        self.http_listens = [f"127.0.0.1:{first}"] + [f"127.0.0.1:{_free_port()}" for _ in self.addresses[1:]]
        self.rm: Daemon | None = None
        self.rms: list[Daemon] = []
        self.agents: list[Daemon] = []
        self.pki: DevPki | None = None
        self.client_tls: TLSConfig | None = None
        self.http_url = ""          # the RM's web UI, once it serves

    def env(self) -> dict[str, str]:
        """What a shell needs to use this cluster with the CLI."""
        return {"GPURM_RM": ",".join(self.addresses), **(self.pki.user.env() if self.pki else {})}

    def _python(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpurm.cli.main", *args]

    def rm_dir(self, k: int) -> Path:
        return self.state_dir / ("rm" if k == 0 else f"rm-{k + 1}")

    def write_configs(self) -> tuple[list[Path], list[Path]]:
        a = self.args
        rm_dir = self.rm_dir(0)
        rm_dir.mkdir(parents=True, exist_ok=True)
        rm_cfg: dict[str, Any] = {
            "listen": self.address, "state_dir": str(rm_dir),
            "mqtt": {"url": a.mqtt_url} if a.mqtt_url else {"listen": f"{self.rm_host}:0"},
            "heartbeat": {"interval": a.heartbeat, **({"missed_beats": a.missed_beats} if a.missed_beats else {})},
            "http": {"listen": self.http_listens[0]},
            "admins": sorted({current_user(), "root"}),
        }
        if getattr(a, "store", ""):
            rm_cfg["store"] = {"url": a.store}
        if len(self.addresses) > 1:
            rm_cfg["ha"] = {"enabled": True}
        if a.queues:
            rm_cfg["queues"] = str(Path(a.queues).resolve())
        for item in a.rm_option:
            key, sep, value = item.partition("=")
            if not sep:
                raise CliError(f"--rm-option: expected KEY=VALUE, got {item!r}")
            _set_dotted(rm_cfg, key, yaml.safe_load(value))
        nodes = [f"node-{i}" for i in range(1, a.nodes + 1)]
        if getattr(a, "tls", False):
            self.pki = DevPki(self.state_dir / "pki", nodes, current_user(), self.net)
            self.client_tls = self.pki.client_tls()
            rm_cfg["tls"] = self.pki.rm.tls_section()
        rm_path = rm_dir / "rm.yaml"
        rm_path.write_text(yaml.safe_dump(rm_cfg, sort_keys=False))
        # The cluster secret is made here rather than by the RM so each agent's node secret can be written
        # before anything starts (a real cluster: `gpurm admin node-secret NODE` on the RM host).
        keys = ClusterKeys.load(rm_dir / "token.key")
        rm_paths = [rm_path]
        for k, address in enumerate(self.addresses[1:], start=1):
            # Every RM of the set signs and checks with the same cluster key (docs/operations.md, "HA").
            other = self.rm_dir(k)
            other.mkdir(parents=True, exist_ok=True)
            write_secret_file(other / "token.key", (rm_dir / "token.key").read_text())
            path = other / "rm.yaml"
            path.write_text(yaml.safe_dump({**rm_cfg, "listen": address, "state_dir": str(other),
                                            "http": {"listen": self.http_listens[k]}}, sort_keys=False))
            rm_paths.append(path)
        agent_paths = []
        for i in range(1, a.nodes + 1):
            node = f"node-{i}"
            rack = f"rack-{(i - 1) * a.racks // a.nodes + 1}"
            adir = self.state_dir / "agents" / node
            adir.mkdir(parents=True, exist_ok=True)
            secret = write_secret_file(adir / "node.secret", keys.node_key(node).secret.hex())
            host = self.net.nodes[node].address if self.net else "127.0.0.1"
            cfg: dict[str, Any] = {
                "node_id": node, "host": host, "listen": f"{host}:0", "rm": ",".join(self.addresses),
                "rack": rack,
                "state_dir": str(adir), "node_secret_file": str(secret),
                "gpus": {"fake": a.gpus_per_node, "model": "H100-80GB", "memory_mib": 81559,
                         "nvlink_islands": a.nvlink_islands},
                # Insecure mode: every job runs as one local user, never as the user a client claims: nobody
                # when the dev cluster runs as root (containers.local_user's default), else whoever started it.
                "containers": {"stop_grace": "5s"},
            }
            if self.net is not None:
                # Every namespace shares this machine's hostname, which resolves to loopback: gloo and NCCL would
                # announce 127.0.0.1 to their peers. Name the interface that carries the node's address instead.
                cfg["containers"]["env_passthrough"] = [*DEFAULT_ENV_PASSTHROUGH, *NETNS_ENV]
            for item in getattr(a, "agent_option", []):
                key, sep, value = item.partition("=")
                if not sep:
                    raise CliError(f"--agent-option: expected KEY=VALUE, got {item!r}")
                _set_dotted(cfg, key, yaml.safe_load(value))
            if self.pki is not None:
                cfg["tls"] = self.pki.nodes[node].tls_section()
                cfg["am_tls"] = {"cert": str(self.pki.am.cert), "key": str(self.pki.am.key)}
                if os.geteuid() == 0:
                    # mTLS honours the certificate's user, but this one machine has one person: their jobs run as
                    # nobody, as in insecure mode (a root certificate would be refused, rightly).
                    cfg["containers"]["local_user"] = "nobody"
            path = adir / "agent.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            agent_paths.append(path)
        return rm_paths, agent_paths

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / "cluster.json").unlink()   # an earlier run's (ready: true) would mislead a reader
        if self.net_name:
            self._make_network()
        rm_paths, agent_paths = self.write_configs()
        sys.stderr.write(self.prepare_dirs())
        for k, path in enumerate(rm_paths):
            self.rms.append(Daemon("rm" if k == 0 else f"rm-{k + 1}", self._python("rm", "--config", str(path)),
                                   path.parent / "rm.log", extra={"address": self.addresses[k],
                                                                  "config": str(path),
                                                                  **({"http": self.http_listens[k]}
                                                                     if len(self.addresses) > 1 else {})}))
        self.rm = self.rms[0]
        self.rm.start()
        self._write_state(ready=False)
        self._wait_rm()
        for standby in self.rms[1:]:      # they stand by: the first leads, being up first
            standby.start()
        for path in agent_paths:
            node = path.parent.name
            argv = self._python("agent", "--config", str(path))
            extra: dict[str, Any] = {"config": str(path), "state_dir": str(path.parent)}
            if self.net is not None:
                argv = netns.in_namespace(self.net.nodes[node].namespace,
                                          ["env", *(f"{k}={v}" for k, v in NETNS_ENV.items()), *argv])
                extra.update(namespace=self.net.nodes[node].namespace, address=self.net.nodes[node].address)
            d = Daemon(node, argv, path.parent / "agent.log", extra=extra)
            d.start()
            self.agents.append(d)
        self._write_state(ready=False)
        self._wait_agents()
        self._write_state(ready=True)

    def _make_network(self) -> None:
        """The bridge and a namespace per node; the RMs move onto the bridge's address."""
        abandoned = netns.remove_abandoned()
        if abandoned:
            sys.stderr.write(f"dev-cluster: removed the network a killed dev cluster left: {', '.join(abandoned)}\n")
        netns.claim(self.net_name, os.getpid())
        try:
            self.net = netns.create(self.net_name, [f"node-{i}" for i in range(1, self.args.nodes + 1)])
        except netns.NetnsError as exc:
            netns.release(self.net_name)
            raise CliError(f"--netns: {exc}", code=1) from None
        self.rm_host = self.net.gateway
        self.addresses = [f"{self.rm_host}:{a.rpartition(':')[2]}" for a in self.addresses]
        self.address = self.addresses[0]

    def _wait_rm(self) -> None:
        assert self.rm is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        channel = tls.channel(self.address, self.client_tls)
        stub = pbg.ClientStub(channel)
        try:
            while time.monotonic() < deadline:
                if not self.rm.alive:
                    tail = _tail(self.rm.log)
                    code = self.rm.proc.returncode if self.rm.proc else "?"
                    raise CliError(f"the RM exited during start-up (code {code}); its log {self.rm.log} ends:\n"
                                   f"{tail}", code=1)
                try:
                    self.http_url = stub.GetClusterInfo(pb.ClusterInfoRequest(), timeout=1).http_url
                    return
                except grpc.RpcError:
                    time.sleep(0.1)
            raise CliError(f"the RM did not come up within {READY_TIMEOUT_S:.0f}s; see {self.rm.log}", code=1)
        finally:
            channel.close()

    def _wait_agents(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        channel = tls.channel(self.address, self.client_tls)
        stub = pbg.ClientStub(channel)
        want = len(self.agents)
        try:
            while time.monotonic() < deadline:
                dead = [d for d in self.agents if not d.alive]
                if dead:
                    raise CliError(f"agent {dead[0].name} exited during start-up; its log {dead[0].log} ends:\n"
                                   f"{_tail(dead[0].log)}", code=1)
                nodes = paging.fetch_all(lambda r: stub.ListNodes(r, timeout=2), pb.ListNodesRequest(page_size=5000),
                                         "nodes")
                up = sum(1 for n in nodes if n.state == pb.NODE_RUNNING and n.node_id in
                         {d.name for d in self.agents})
                sys.stderr.write(f"\rwaiting for agents: {up}/{want} registered")
                sys.stderr.flush()
                if up == want:
                    sys.stderr.write("\n")
                    return
                time.sleep(0.2)
            raise CliError(f"only some agents registered within {READY_TIMEOUT_S:.0f}s; see agents/*/agent.log "
                           f"under {self.state_dir}", code=1)
        finally:
            channel.close()

    def prepare_dirs(self) -> str:
        """The state dir and agents/ traversable (0711) so that a job's user reaches its own container dir;
        returns a warning line when a folder above the state dir stops it ('' when none does)."""
        for d in (self.state_dir, self.state_dir / "agents"):
            d.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                os.chmod(d, 0o711)
        if os.geteuid() != 0:
            return ""
        for parent in self.state_dir.parents:
            if not os.stat(parent).st_mode & 0o001:
                return (f"warning: {parent} is not traversable by other users (o+x): jobs, which run as "
                        f"{job_user()}, cannot reach their container dirs below it; use another --state-dir\n")
        return ""

    def _write_state(self, ready: bool) -> None:
        if ready:
            env_sh = self.state_dir / "env.sh"
            env_sh.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env().items()))
        state = {
            "env": self.env(), "tls": self.pki is not None,
            "pid": os.getpid(), "ready": ready, "rm_address": self.address, "state_dir": str(self.state_dir),
            "http_url": self.http_url,
            "netns": self.net.to_json() if self.net else None,
            "rm": {"pid": self.rm.proc.pid if self.rm and self.rm.proc else 0,
                   "config": str(self.state_dir / "rm" / "rm.yaml"), "log": str(self.rm.log) if self.rm else ""},
            "rms": [{"name": d.name, "pid": d.proc.pid if d.proc else 0, **d.extra, "log": str(d.log)}
                    for d in self.rms],
            "agents": [{"node_id": d.name, "pid": d.proc.pid if d.proc else 0, **d.extra, "log": str(d.log)}
                       for d in self.agents],
        }
        path = self.state_dir / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, path)

    def check_children(self, reported: set[str]) -> None:
        for d in [*self.agents, *self.rms]:
            if not d.alive and d.name not in reported and d.proc is not None:
                if len(self.rms) > 1 and d in self.rms:
                    # An HA set's supervisor: an RM that exits (killed, or deposed: exit 3) comes back, standing by.
                    sys.stderr.write(f"dev-cluster: {d.name} exited with code {d.proc.returncode}; starting it "
                                     f"again (see {d.log})\n")
                    d.start()
                    self._write_state(ready=True)
                    continue
                reported.add(d.name)
                sys.stderr.write(f"dev-cluster: {d.name} exited with code {d.proc.returncode} (see {d.log})\n")

    def stop(self) -> None:
        sys.stderr.write("dev-cluster: stopping agents and their containers ...\n")
        _terminate([d for d in self.agents if d.alive], timeout=20)
        _terminate([d for d in self.rms if d.alive], timeout=10)
        killed = sweep_orphans(self.state_dir)
        if killed:
            sys.stderr.write(f"dev-cluster: killed {killed} leftover container process group(s)\n")
        if self.net_name:
            netns.release(self.net_name)
        sys.stderr.write("dev-cluster: stopped\n")


def _terminate(daemons: list[Daemon], timeout: float) -> None:
    for d in daemons:
        with contextlib.suppress(ProcessLookupError):
            assert d.proc is not None
            d.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for d in daemons:
        assert d.proc is not None
        try:
            d.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.proc.pid, signal.SIGKILL)
            d.proc.wait(5)


def sweep_orphans(state_dir: Path) -> int:
    """Kill what is left of containers an agent recorded as live (an agent that was SIGKILLed leaves them
    behind). A process group is killed only if one of its members still carries that container's id in its
    environment, so a recycled process group id is never hit."""
    killed = 0
    for record in state_dir.glob("agents/*/containers/*/record.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if data.get("state") not in ("CONTAINER_RUNNING", "CONTAINER_STARTING"):
            continue
        pgid = int(data.get("pgid") or 0)
        if pgid > 1 and _group_runs_container(pgid, str(data.get("container_id", ""))):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
    return killed


def _group_runs_container(pgid: int, container_id: str) -> bool:
    needle = f"GPURM_CONTAINER_ID={container_id}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and needle in (proc / "environ").read_bytes().split(b"\0"):
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def job_user() -> str:
    """Whom the dev cluster's agents (insecure mode) run every job as: nobody when they run as root."""
    return "nobody" if os.geteuid() == 0 else current_user()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


DEFAULT_RACKS = 2    # main.py's --racks default


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad flags with one line; fit --racks to --nodes."""
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise CliError("--nodes and --gpus-per-node must be at least 1")
    if args.racks < 1:
        raise CliError(f"--racks: must be at least 1, got {args.racks}")
    if args.racks > args.nodes:
        # The default (2 racks) with --nodes 1 used to be refused: a rack per node is as far as racks can go.
        if args.racks != DEFAULT_RACKS:
            sys.stderr.write(f"gpurm dev-cluster: --racks {args.racks} is more than --nodes {args.nodes}: "
                             f"using {args.nodes}, one per node\n")
        args.racks = args.nodes
    if not 0 < args.port < 65536:
        raise CliError(f"--port: {args.port} is not a port")
    if not 0 <= args.http_port < 65536:
        raise CliError(f"--http-port: {args.http_port} is not a port (0 picks a free one)")
    if args.nvlink_islands < 1 or args.gpus_per_node % args.nvlink_islands:
        raise CliError("--nvlink-islands: must divide --gpus-per-node")
    try:
        parse_duration(args.heartbeat)
    except ValueError as exc:
        raise CliError(f"--heartbeat: {exc}") from None
    if args.queues and not Path(args.queues).is_file():
        raise CliError(f"--queues: {args.queues} does not exist")
    if getattr(args, "netns", False):
        why = netns.root_problem()
        if why:
            raise CliError(f"--netns: {why}")
    rms, store = getattr(args, "rms", 1), getattr(args, "store", "")
    if not 1 <= rms <= MAX_RMS:
        raise CliError(f"--rms: 1 to {MAX_RMS}, got {rms}")
    if store and not store.startswith(("sqlite://", "postgresql://", "postgres://")):
        raise CliError("--store: expected sqlite:///PATH or postgresql://USER@HOST:PORT/DB")
    if rms > 1 and not store.startswith(("postgresql://", "postgres://")):
        raise CliError(f"--rms {rms}: several RMs share one PostgreSQL store; give --store postgresql://USER@HOST:PORT/DB")


def cmd_dev_cluster(args: argparse.Namespace) -> int:
    check_args(args)
    state_dir = Path(args.state_dir).resolve() if args.state_dir else Path(tempfile.mkdtemp(prefix="gpurm-dev-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    cluster = DevCluster(args, state_dir)
    stop = {"signal": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start()
        total = args.nodes * args.gpus_per_node
        sys.stderr.write(
            f"dev cluster up: {args.nodes} node{'s' if args.nodes > 1 else ''} x {args.gpus_per_node} GPUs ({total}) "
            f"in {args.racks} rack{'s' if args.racks > 1 else ''}\n"
            f"  RM:    {','.join(cluster.addresses)}{' with mTLS' if cluster.pki else ''}"
            f"{' (the first leads, the others stand by)' if len(cluster.addresses) > 1 else ''}   "
            f"(. {state_dir / 'env.sh'}  sets GPURM_RM{' and GPURM_TLS_*' if cluster.pki else ''})\n"
            f"  web:   {cluster.http_url or 'off'}  (web UI; REST API under /api/v1)\n"
            f"  state: {state_dir}  (logs: rm/rm.log, agents/*/agent.log)\n"
            f"  jobs run as: {job_user()} (insecure mode: never as the claimed user; docs/install-agent.md)\n"
            f"  try:   gpurm submit --gpus 8 -- nvidia-smi-or-your-command; gpurm jobs; gpurm nodes\n"
            f"Ctrl-C stops the cluster.\n")
        sys.stderr.flush()
        reported: set[str] = set()
        while not stop["signal"]:
            cluster.check_children(reported)
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()
    return 0
