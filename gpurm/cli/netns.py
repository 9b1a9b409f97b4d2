"""Network namespaces for a dev cluster: one per node, each with its own address on a bridge, and the faults
`scripts/chaos --netns` and the suite inject into them (partitions, packet loss, delay).

Layout of a cluster named C (a short name: its hash names the interfaces, which Linux limits to 15 characters):

    root namespace: bridge gpb-HHHHHH with GATEWAY/24 (the RM and the broker listen there)
    per node N:     namespace gpurm-C-N, veth gpvHHHHHHi (root end, on the bridge) <-> eth0 (in the namespace)
                    with SUBNET.(10+i)/24, a default route via GATEWAY

Faults are iptables rules inside a node's namespace (its INPUT and OUTPUT chains), so they vanish with it: a
partition drops everything to and from the given addresses; loss drops a share of packets at random (`-m
statistic`). Delay needs tc's netem, which not every kernel has: `delay` says so instead of failing.
Every command runs as root (`ip netns` needs it): `root_problem` says what is missing before anything starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

NETNS_DIR = "/run/netns"
OWNERS_DIR = Path("/run/gpurm-netns")   # <cluster>: the pid of the process that made it (a dev cluster)
NODE_IFNAME = "eth0"     # a node's interface inside its namespace
FIRST_HOST = 10          # node i gets SUBNET.(FIRST_HOST + i)
MAX_NODES = 200
SUBNET_POOL = ipaddress.IPv4Network("10.200.0.0/13")   # /24s are taken from here, skipping any in use


class NetnsError(Exception):
    pass


@dataclass(frozen=True)
class NodeNet:
    node_id: str
    namespace: str
    address: str             # the node's address on the bridge
    veth: str                # the root namespace's end of its veth pair


@dataclass
class ClusterNet:
    cluster: str
    bridge: str
    gateway: str             # the bridge's address: the RM (and the broker) listen here
    prefix_len: int
    nodes: dict[str, NodeNet] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"cluster": self.cluster, "bridge": self.bridge, "gateway": self.gateway,
                "prefix_len": self.prefix_len, "nodes": {k: asdict(v) for k, v in self.nodes.items()}}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ClusterNet:
        nodes = data.get("nodes")
        assert isinstance(nodes, dict)
        return cls(str(data["cluster"]), str(data["bridge"]), str(data["gateway"]), int(str(data["prefix_len"])),
                   {k: NodeNet(**v) for k, v in nodes.items()})


def root_problem() -> str:
    """Why network namespaces cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return ("network namespaces need root (ip netns, veth pairs, a bridge): run it as root, e.g. with sudo, "
                "or leave out --netns")
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"network namespaces need the `{tool}` command: install iproute2 and iptables (scripts/system-deps)"
    return ""


def _tag(cluster: str) -> str:
    return hashlib.sha256(cluster.encode()).hexdigest()[:6]


def namespace_name(cluster: str, node_id: str) -> str:
    return f"gpurm-{cluster}-{node_id}"


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done


def _subnets_in_use() -> list[ipaddress.IPv4Network]:
    out = _run(["ip", "-j", "-4", "addr", "show"], check=False).stdout or "[]"
    nets = []
    for link in json.loads(out):
        for a in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}").network)
    return nets


def _free_subnet(cluster: str) -> ipaddress.IPv4Network:
    used = _subnets_in_use()
    candidates: list[ipaddress.IPv4Network] = list(SUBNET_POOL.subnets(new_prefix=24))
    start = int(_tag(cluster), 16) % len(candidates)
    for i in range(len(candidates)):
        net = candidates[(start + i) % len(candidates)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsError(f"no free /24 left in {SUBNET_POOL} for the dev cluster's bridge")


def leftovers(cluster: str) -> list[str]:
    """Namespaces a killed dev cluster named `cluster` left behind."""
    prefix = f"gpurm-{cluster}-"
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def remove(cluster: str) -> list[str]:
    """Remove every namespace, veth and the bridge of `cluster` (a stopped or a killed one); the names removed."""
    gone = []
    for ns in leftovers(cluster):
        _run(["ip", "netns", "del", ns], check=False)   # its end of each veth goes with it, and so the pair
        gone.append(ns)
    bridge = f"gpb-{_tag(cluster)}"
    if _run(["ip", "link", "show", bridge], check=False).returncode == 0:
        _run(["ip", "link", "del", bridge], check=False)
        gone.append(bridge)
    return gone


def create(cluster: str, node_ids: Iterable[str]) -> ClusterNet:
    """A bridge and a namespace per node, wired and up; leftovers of an earlier run of `cluster` removed first."""
    why = root_problem()
    if why:
        raise NetnsError(why)
    stale = remove(cluster)
    if stale:
        log.warning("removed what an earlier dev cluster %s left: %s", cluster, ", ".join(stale))
    ids = list(node_ids)
    if len(ids) > MAX_NODES:
        raise NetnsError(f"at most {MAX_NODES} nodes in namespaces, got {len(ids)}")
    tag = _tag(cluster)
    subnet = _free_subnet(cluster)
    hosts = list(subnet.hosts())
    net = ClusterNet(cluster, f"gpb-{tag}", str(hosts[0]), subnet.prefixlen)
    try:
        _run(["ip", "link", "add", net.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{net.gateway}/{net.prefix_len}", "dev", net.bridge])
        _run(["ip", "link", "set", net.bridge, "up"])
        for i, node_id in enumerate(ids):
            node = NodeNet(node_id, namespace_name(cluster, node_id), str(hosts[FIRST_HOST - 1 + i]),
                           f"gpv{tag}{i}")
            _add_node(net, node)
            net.nodes[node_id] = node
    except BaseException:
        remove(cluster)
        raise
    return net


def _add_node(net: ClusterNet, node: NodeNet) -> None:
    ns = node.namespace
    _run(["ip", "netns", "add", ns])
    _run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", NODE_IFNAME, "netns", ns])
    _run(["ip", "link", "set", node.veth, "master", net.bridge])
    _run(["ip", "link", "set", node.veth, "up"])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", ns, "addr", "add", f"{node.address}/{net.prefix_len}", "dev", NODE_IFNAME])
    _run(["ip", "-n", ns, "link", "set", NODE_IFNAME, "up"])
    _run(["ip", "-n", ns, "route", "add", "default", "via", net.gateway])


def claim(cluster: str, pid: int) -> None:
    """Record that process `pid` owns the namespaces of `cluster`: once it is dead they are leftovers."""
    OWNERS_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    (OWNERS_DIR / cluster).write_text(f"{pid}\n")


def release(cluster: str) -> list[str]:
    """Remove `cluster`'s network and its owner record; the names removed."""
    gone = remove(cluster)
    with contextlib.suppress(OSError):
        (OWNERS_DIR / cluster).unlink()
    return gone


def remove_abandoned() -> list[str]:
    """Remove the networks of every cluster whose owner died without cleaning up (a SIGKILLed dev cluster)."""
    gone: list[str] = []
    try:
        owners = sorted(OWNERS_DIR.iterdir())
    except FileNotFoundError:
        return gone
    for owner in owners:
        try:
            pid = int(owner.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid > 0 and _alive(pid):
            continue
        gone += release(owner.name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_namespace(namespace: str, argv: Sequence[str]) -> list[str]:
    """`argv` run inside `namespace`."""
    return ["ip", "netns", "exec", namespace, *argv]


# ---------------------------------------------------------------------- faults


def partition(namespace: str, peers: Iterable[str], port: int = 0) -> None:
    """Drop every packet between the namespace and each peer address (both ways), as a cut cable would; with
    `port`, only TCP to and from that port of the peers (one service of a host: its database)."""
    only = ["-p", "tcp"] if port else []
    for peer in peers:
        _iptables(namespace, "-I", "INPUT", "-s", peer, *only, *(["--sport", str(port)] if port else []),
                  "-j", "DROP")
        _iptables(namespace, "-I", "OUTPUT", "-d", peer, *only, *(["--dport", str(port)] if port else []),
                  "-j", "DROP")


def heal(namespace: str) -> None:
    """Remove every fault rule of the namespace (partitions and loss)."""
    for chain in ("INPUT", "OUTPUT"):
        _iptables(namespace, "-F", chain)


def loss(namespace: str, share: float) -> None:
    """Drop `share` (0..1) of the packets the namespace receives, at random."""
    if not 0 < share < 1:
        raise NetnsError(f"loss: the share must be between 0 and 1, got {share}")
    _iptables(namespace, "-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability", f"{share:.4f}",
              "-j", "DROP")


def delay(namespace: str, ms: int) -> str:
    """Delay every packet leaving the namespace by `ms`; '' when done, else why it could not (no netem here)."""
    done = _run(["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", NODE_IFNAME, "root", "netem",
                 "delay", f"{ms}ms"], check=False)
    if done.returncode != 0:
        return f"delay skipped: tc netem is not available in this kernel ({done.stderr.strip()})"
    return ""


def _iptables(namespace: str, *args: str) -> None:
    _run(["ip", "netns", "exec", namespace, "iptables", "-w", *args])
