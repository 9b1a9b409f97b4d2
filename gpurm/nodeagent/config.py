"""agent.yaml: the node agent's configuration, validated with `queues.fields.Reader`.

Every problem in the document is reported at once (`ConfigError.problems`), each naming its field; an unknown
key is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpurm.common.fields import ConfigError, Problems, Reader, parse_address
from gpurm.common.limits import ServerLimits, read_limits
from gpurm.common.retry import AGENT_POLICY, RetryPolicy
from gpurm.common.rmlist import parse_rm_list
from gpurm.common.tls import TLSConfig, load_tls, read_tls_section
from gpurm.common.tokens import TokenKey, parse_node_secret
from gpurm.nodeagent.engine import EngineConfig, read_engine_config
from gpurm.nodeagent.identity import (
    DEFAULT_BANNED_USERS,
    DEFAULT_MIN_UID,
    RunAsMode,
    RunAsPolicy,
    UserRules,
    agent_user,
)
from gpurm.nodeagent.sweep import DEFAULT_KEEP_S, NEVER

__all__ = [
    "DEFAULT_ENV_PASSTHROUGH",
    "AgentConfig",
    "ConfigError",
    "ContainerConfig",
    "GpuConfig",
    "HealthConfig",
    "TelemetryConfig",
    "detect_cpus",
    "detect_memory_mib",
    "load_agent_config",
]

DEFAULT_ENV_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME")
DEFAULT_LOG_MAX_SIZE = 100 * 1024 * 1024
DEFAULT_GPU_MODEL = "H100-80GB"
DEFAULT_GPU_MEMORY_MIB = 81559
DEFAULT_METRICS_LISTEN = "127.0.0.1:0"   # loopback, any free port: the RM learns it at registration
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?$")
NO_PROVIDER = "no GPU provider configured: set gpus.fake: N (N fake GPUs) or gpus.nvml: true"


@dataclass(frozen=True)
class GpuConfig:
    fake: int | None              # N fake GPUs; None when the fake provider is not used
    nvml: bool
    model: str
    memory_mib: int
    nvlink_islands: int
    fail_gpus: tuple[int, ...] = ()   # fake only: GPUs unhealthy from the start
    fault_file: Path | None = None    # fake only: faults injected at run time (see fakegpu.py)


@dataclass(frozen=True)
class HealthConfig:
    gpu_interval_s: float = 5.0       # XID events, ECC state, lost GPUs
    script: Path | None = None        # admin health script (YARN NodeManager style)
    interval_s: float = 60.0
    timeout_s: float = 30.0


@dataclass(frozen=True)
class TelemetryConfig:
    interval_s: float = 5.0           # 0 = no telemetry
    container_interval_s: float = 15.0  # per-container CPU / memory / GPU series (nodeagent/series.py); 0 = off
    metrics_listen: str = DEFAULT_METRICS_LISTEN  # HOST:PORT of the Prometheus exporter (port 0 = any); "" = off


@dataclass(frozen=True)
class ContainerConfig:
    stop_grace_s: float
    keep_on_shutdown: bool
    env_passthrough: tuple[str, ...]
    log_poll_s: float
    log_max_size: int = DEFAULT_LOG_MAX_SIZE  # bytes; output.log is rotated past this (0 = never)
    log_keep: int = 3                          # rotated files kept: output.log.1 ... output.log.<keep>
    run_as: RunAsMode = RunAsMode.USER         # user: see identity.py (the job's user with mTLS, else local_user)
    cgroup_root: str = "auto"                  # auto (where cgroup v2 is mounted) | off | a cgroup v2 directory
    # Who containers may run as (identity.py): never uid 0, a uid below min_uid or a banned user.
    min_uid: int = DEFAULT_MIN_UID
    banned_users: tuple[str, ...] = DEFAULT_BANNED_USERS
    local_user: str = ""                       # insecure mode's user when the agent is root ('' = nobody)
    keep_finished_s: float = DEFAULT_KEEP_S    # dirs of containers ended longer ago are removed (NEVER: kept)
    engine: EngineConfig = field(default_factory=EngineConfig)  # image jobs' OCI engine (engine.py)


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    host: str                     # the address the RM and AMs reach this agent at
    listen: str                   # HOST:PORT the ContainerManager server binds (port 0 = any)
    rm: str                       # HOST:PORT of the RM, or HOST:PORT,HOST:PORT... of an active/standby set
    rack: str
    ib_domain: str
    state_dir: Path
    gpus: GpuConfig
    containers: ContainerConfig
    cpus: int
    memory_mib: int
    health: HealthConfig = HealthConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    tls: TLSConfig | None = None  # mTLS for the RM stream, the ContainerManager server and this node's AMs
    node_secret: TokenKey | None = None  # this node's key (`gpurm admin node-secret`): proves it without mTLS
    limits: ServerLimits = field(default_factory=ServerLimits)
    am_tls: TLSConfig | None = None  # the client certificate handed to AM containers (CA: tls.ca); see _am_tls
    rm_retry: RetryPolicy = AGENT_POLICY  # riding out an unreachable RM (rm_retry: base, max, give_up_after)
    # mqtt.advertise: the broker URL this node (its agent and the AMs it starts) dials, when the RM's own view of
    # the broker's address (rm.yaml mqtt.url, or its embedded broker's address) does not work from here.
    mqtt_advertise: str = ""

    def run_as_policy(self) -> RunAsPolicy:
        c = self.containers
        return RunAsPolicy(mode=c.run_as, secure=self.tls is not None, local_user=c.local_user,
                           rules=UserRules(min_uid=c.min_uid, banned_users=frozenset(c.banned_users)))

    @property
    def rm_list(self) -> tuple[str, ...]:
        """The RMs to dial, in order (the agent follows the leader among them; gpurm.common.rmlist)."""
        return parse_rm_list(self.rm)

    @property
    def listen_port(self) -> int:
        return parse_address(self.listen)[1]


def detect_cpus() -> int:
    return os.cpu_count() or 1


def detect_memory_mib(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemTotal of this machine in MiB; 0 when it cannot be read (the config must then set it)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def _read_file(path: Path, problems: Problems) -> object:
    try:
        text = path.read_text()
    except OSError as exc:
        problems.add(str(path), f"cannot read agent config: {exc.strerror or exc}")
        return {}
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problems.add(str(path), f"not valid YAML: {str(exc).splitlines()[0]}")
        return {}


def load_agent_config(path: Path | None, overrides: Mapping[str, object] | None = None, *,
                      environ: Mapping[str, str] | None = None, euid: int | None = None) -> AgentConfig:
    """Read agent.yaml (None = all defaults), apply `overrides` to top-level keys, validate everything.

    Overrides whose value is None are ignored, so a CLI can pass every flag it has. `euid`: the user the agent
    will run as (default: this process's), for the checks of containers.local_user and am_tls. Raises ConfigError
    listing every problem.
    """
    env = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    problems = Problems()
    data: object = _read_file(path, problems) if path is not None else {}
    if data is None:
        data = {}
    if isinstance(data, Mapping):
        merged: dict[str, Any] = dict(data)
        merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
        data = merged
    r = Reader(data, "", problems)

    node_id = r.text("node_id", _short_hostname())
    if node_id and not _ID.match(node_id):
        r.error("node_id", f"must be letters, digits, '.', '_' or '-', got {node_id!r}")
    host = r.text("host", "127.0.0.1")
    if not host:
        r.error("host", "must not be empty")
    listen = _address(r, "listen", "0.0.0.0:7071")
    rm = _rm_list(r, env.get("GPURM_RM") or "127.0.0.1:7070")
    rack = r.text("rack", "rack-0")
    ib_domain = r.text("ib_domain", rack)
    state_dir = Path(r.text("state_dir", "/var/lib/gpurm/agent") or "/var/lib/gpurm/agent").expanduser()
    cpus = r.integer("cpus", detect_cpus(), minimum=1)
    detected_mib = detect_memory_mib()
    memory_mib = r.integer("memory_mib", detected_mib or None, minimum=1)
    if not r.has("memory_mib") and not detected_mib:
        r.error("memory_mib", "cannot be read from /proc/meminfo here: set it")

    gpus = _gpus(r.section("gpus"), present=r.has("gpus"))
    containers = _containers(r.section("containers"), euid)
    health = _health(r.section("health"))
    telemetry = _telemetry(r.section("telemetry"))
    tls = read_tls_section(r, "tls", path.parent if path is not None else None)
    node_secret = _node_secret(r, node_id, path.parent if path is not None else None)
    limits = read_limits(r)
    am_tls = _am_tls(r, tls, containers, euid, path.parent if path is not None else None)
    rm_retry = _rm_retry(r.section("rm_retry"))
    mqtt_advertise = _mqtt(r.section("mqtt"))
    r.reject_unknown()
    problems.raise_if_any()
    return AgentConfig(node_id=node_id, host=host, listen=listen, rm=rm, rack=rack, ib_domain=ib_domain,
                       state_dir=state_dir, gpus=gpus, containers=containers, cpus=cpus,
                       memory_mib=memory_mib, health=health, telemetry=telemetry, tls=tls,
                       node_secret=node_secret, limits=limits, am_tls=am_tls, rm_retry=rm_retry,
                       mqtt_advertise=mqtt_advertise)


def _rm_retry(s: Reader) -> RetryPolicy:
    d = AGENT_POLICY
    policy = RetryPolicy(base_s=s.duration("base", d.base_s), max_s=s.duration("max", d.max_s),
                         give_up_s=s.duration("give_up_after", d.give_up_s))
    s.reject_unknown()
    for problem in policy.problems():
        key, _, why = problem.partition(": ")
        s.error(key, why)
    return policy if not policy.problems() else d


def _mqtt(m: Reader) -> str:
    """mqtt.advertise: mqtt://HOST:PORT (the port required), or empty for the RM's own broker URL."""
    url = m.text("advertise", "")
    m.reject_unknown()
    if url:
        rest = url.removeprefix("mqtt://")
        try:
            if rest == url:
                raise ValueError("must start with mqtt://")
            host, port = parse_address(rest, default_host="")
            if not host or port == 0:
                raise ValueError("a host and a port above 0 are required")
        except ValueError as exc:
            m.error("advertise", f"must look like mqtt://HOST:PORT, got {url!r} ({exc})")
            return ""
    return url


NO_CREDENTIAL = ("agent.yaml: the agent has no credential: set tls (mTLS, the node's certificate CN node:<node_id>) or "
                 "node_secret_file (the file `gpurm admin node-secret NODE` writes on the RM host; "
                 "docs/security.md)")


def _node_secret(r: Reader, node_id: str, base: Path | None) -> TokenKey | None:
    """The node secret from `node_secret_file` (preferred: a 0600 file) or `node_secret` (inline hex)."""
    file_text = r.text("node_secret_file", "")
    inline = r.text("node_secret", "")
    if file_text and inline:
        r.error("node_secret", "set only one of node_secret and node_secret_file")
        return None
    text, key = inline, "node_secret"
    if file_text:
        key = "node_secret_file"
        path = Path(file_text).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            if path.stat().st_mode & 0o077:
                r.error(key, f"{path} is readable by others: chmod 600 it (it lets its holder act as {node_id})")
                return None
            text = path.read_text()[:1024]
        except OSError as exc:
            r.error(key, f"cannot read {path}: {exc.strerror}")
            return None
    if not text:
        return None
    try:
        return parse_node_secret(text)
    except ValueError as exc:
        r.error(key, str(exc))
        return None


def _address(r: Reader, key: str, default: str) -> str:
    value = r.text(key, default)
    try:
        parse_address(value)
    except ValueError as exc:
        r.error(key, str(exc))
    return value


def _rm_list(r: Reader, default: str) -> str:
    """rm: HOST:PORT, a comma-separated list, or a YAML list (an active/standby RM set) → 'a:7070,b:7070'."""
    value = r.raw("rm")
    source = "" if value is not None else " (from GPURM_RM)"
    value = default if value is None else value
    if not isinstance(value, str | list):
        r.error("rm", f"expected HOST:PORT or a list of them, got {value!r}")
        return "127.0.0.1:7070"
    try:
        return ",".join(parse_rm_list(value))
    except ValueError as exc:
        r.error("rm", f"{exc}{source}")
        return "127.0.0.1:7070"


def _gpus(g: Reader, *, present: bool) -> GpuConfig:
    fake = g.optional_int("fake", minimum=0)
    nvml = g.flag("nvml", False)
    model = g.text("model", DEFAULT_GPU_MODEL)
    memory_mib = g.integer("memory_mib", DEFAULT_GPU_MEMORY_MIB, minimum=1)
    islands = g.integer("nvlink_islands", 1, minimum=1)
    fail_gpus = _fail_gpus(g, fake)
    fault_text = g.text("fault_file", "")
    fault_file = Path(fault_text).expanduser() if fault_text else None
    g.reject_unknown()
    if nvml:
        if fake is not None:
            g.error("fake", "set only one of gpus.fake and gpus.nvml")
        for key in ("fail_gpus", "fault_file"):
            if g.has(key):
                g.error(key, "only the fake provider (gpus.fake) injects faults")
    elif fake is None:
        g.problems.add("gpus", NO_PROVIDER if not present or not g.data else
                       f"{NO_PROVIDER} (found only {', '.join(sorted(map(str, g.data)))})")
    elif fake and islands > fake:
        g.error("nvlink_islands", f"must be at most gpus.fake ({fake}), got {islands}")
    elif fake and fake % islands:
        g.error("nvlink_islands", f"must divide gpus.fake ({fake}) into equal islands, got {islands}")
    return GpuConfig(fake=fake, nvml=nvml, model=model, memory_mib=memory_mib, nvlink_islands=islands,
                     fail_gpus=fail_gpus, fault_file=fault_file)


def _fail_gpus(g: Reader, fake: int | None) -> tuple[int, ...]:
    value = g.raw("fail_gpus", [])
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        g.error("fail_gpus", f"must be a list of GPU indices, got {value!r}")
        return ()
    bad = [v for v in value if v < 0 or (fake is not None and v >= fake)]
    if bad:
        g.error("fail_gpus", f"indices {bad} are not GPUs of this node (0-{(fake or 1) - 1})")
    return tuple(v for v in value if v not in bad)


def _health(h: Reader) -> HealthConfig:
    gpu_interval = h.duration("gpu_interval", 5.0)
    script_text = h.text("script", "")
    interval = h.duration("interval", 60.0)
    timeout = h.duration("timeout", 30.0)
    h.reject_unknown()
    for key, value in (("gpu_interval", gpu_interval), ("interval", interval), ("timeout", timeout)):
        if h.has(key) and value <= 0:
            h.error(key, "must be more than 0")
    script = Path(script_text).expanduser() if script_text else None
    if script is not None:
        if not script.is_file():
            h.error("script", f"{script} does not exist or is not a file")
        elif not os.access(script, os.X_OK):
            h.error("script", f"{script} is not executable (chmod +x)")
    elif h.has("interval") or h.has("timeout"):
        h.error("script", "is required with health.interval or health.timeout")
    return HealthConfig(gpu_interval_s=gpu_interval if gpu_interval > 0 else 5.0, script=script,
                        interval_s=interval if interval > 0 else 60.0, timeout_s=timeout if timeout > 0 else 30.0)


def _telemetry(t: Reader) -> TelemetryConfig:
    interval = t.duration("interval", 5.0)
    container_interval = t.duration("container_interval", 15.0, maximum=86400.0)
    metrics = t.text("metrics_listen", DEFAULT_METRICS_LISTEN)
    if metrics.lower() == "off":
        metrics = ""
    if metrics:
        try:
            parse_address(metrics)
        except ValueError as exc:
            t.error("metrics_listen", f"{exc} (or off)")
    t.reject_unknown()
    if interval < 0:
        t.error("interval", "must be 0 (off) or more")
        interval = 5.0
    if container_interval < 0 or 0 < container_interval < 0.05:
        t.error("container_interval", "must be 0 (off) or at least 0.05s")
        container_interval = 15.0
    return TelemetryConfig(interval_s=interval, container_interval_s=container_interval, metrics_listen=metrics)


def _containers(c: Reader, euid: int) -> ContainerConfig:
    grace = c.duration("stop_grace", 10.0)
    keep = c.flag("keep_on_shutdown", False)
    passthrough = c.strings("env_passthrough", list(DEFAULT_ENV_PASSTHROUGH))
    for name in passthrough:
        if not _ENV_NAME.match(name):
            c.error("env_passthrough", f"{name!r} is not an environment variable name")
    poll = c.duration("log_poll", 0.25)
    if c.has("log_poll") and poll <= 0:
        c.error("log_poll", "must be more than 0")
        poll = 0.25
    log_max_size = _size(c, "log_max_size", DEFAULT_LOG_MAX_SIZE)
    log_keep = c.integer("log_keep", 3, minimum=0)
    run_as_text = c.text("run_as", RunAsMode.USER.value, choices=[m.value for m in RunAsMode])
    run_as = RunAsMode(run_as_text) if run_as_text in {m.value for m in RunAsMode} else RunAsMode.USER
    cgroup_root = c.text("cgroup_root", "auto") or "auto"
    if cgroup_root not in ("auto", "off") and not cgroup_root.startswith("/"):
        c.error("cgroup_root", f"must be auto, off or an absolute path, got {cgroup_root!r}")
    min_uid, banned, local = _identity(c, run_as, euid)
    raw_keep = c.raw("keep_finished")
    if isinstance(raw_keep, str) and raw_keep.strip().lower() in ("never", "forever"):
        keep_finished = NEVER
    else:
        keep_finished = c.duration("keep_finished", DEFAULT_KEEP_S)
        if keep_finished < 3600:
            c.error("keep_finished", f"at least 1h (logs of recent jobs stay readable), or never; got "
                                     f"{keep_finished:g}s")
            keep_finished = DEFAULT_KEEP_S
    engine = read_engine_config(c)
    c.reject_unknown()
    return ContainerConfig(stop_grace_s=grace, keep_on_shutdown=keep, env_passthrough=tuple(passthrough),
                           log_poll_s=poll, log_max_size=log_max_size, log_keep=log_keep, run_as=run_as,
                           cgroup_root=cgroup_root, min_uid=min_uid, banned_users=banned, local_user=local,
                           keep_finished_s=keep_finished, engine=engine)


def _identity(c: Reader, run_as: RunAsMode, euid: int) -> tuple[int, tuple[str, ...], str]:
    """containers.min_uid, banned_users, local_user (see identity.py)."""
    min_uid = c.integer("min_uid", DEFAULT_MIN_UID, minimum=1)   # uid 0 is refused whatever min_uid says
    banned = c.strings("banned_users", list(DEFAULT_BANNED_USERS))
    for name in banned:
        if not name or not _USER.match(name):
            c.error("banned_users", f"{name!r} is not a user name")
    local = c.text("local_user", "")
    if local and not _USER.match(local):
        c.error("local_user", f"{local!r} is not a user name")
    elif local and euid != 0 and local != agent_user(euid):
        c.error("local_user", f"the agent runs as {agent_user(euid)}, not root, and can only run containers as "
                              f"itself, not as {local!r}: remove local_user or run the agent as root")
    elif local and run_as is RunAsMode.AGENT:
        c.error("local_user", "cannot be used with run_as: agent (remove run_as: containers then run as "
                              "local_user in insecure mode)")
    return min_uid, tuple(banned), local


def _am_tls(r: Reader, tls: TLSConfig | None, containers: ContainerConfig, euid: int,
            base: Path | None) -> TLSConfig | None:
    """`am_tls: {cert, key}`: the client certificate (CN am:<name>, signed by tls.ca) the agent hands to the AM
    containers it starts, as files private to the AM's user. Required with tls when AMs run as another user
    than the agent's (the agent is root): they cannot read the node's own key, and must not."""
    if r.raw("am_tls") is None:
        if tls is not None and euid == 0 and containers.run_as is RunAsMode.USER:
            r.error("am_tls", "is required with tls when the agent runs as root (AMs run as their job's user, "
                              "who must not read the node's key): set am_tls: {cert: am.pem, key: am-key.pem}, "
                              "a certificate with CN am:<name> signed by tls.ca")
        return None
    before = len(r.problems.items)
    a = r.section("am_tls")
    values = {"cert": a.text("cert", ""), "key": a.text("key", "")}
    a.reject_unknown()
    if tls is None:
        a.problems.add("am_tls", "is only used with tls (mTLS): add a tls section or remove am_tls")
    if len(r.problems.items) > before or tls is None:
        return None
    try:
        return load_tls({"ca": str(tls.ca), **values}, base=base, where="am_tls")
    except ConfigError as exc:
        r.problems.items.extend(exc.problems)
        return None


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(value: object) -> int:
    """Bytes from an int or '100MiB', '1.5GB', '64KiB', '500B'; ValueError naming the problem."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"must be 0 or more, got {value}")
        return value
    m = _SIZE.match(str(value)) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"expected a size such as 100MiB, 1GB or 65536, got {value!r}")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])


def _size(c: Reader, key: str, default: int) -> int:
    if not c.has(key):
        return default
    try:
        return parse_size(c.raw(key))
    except ValueError as exc:
        c.error(key, str(exc))
        return default
