"""agent.yaml: the node agent's configuration, validated with `queues.fields.Reader`.

Every problem in the document is reported at once (`ConfigError.problems`), each naming its field; an unknown
key is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpurm.queues.fields import ConfigError, Problems, Reader, parse_address

__all__ = [
    "DEFAULT_ENV_PASSTHROUGH",
    "AgentConfig",
    "ConfigError",
    "ContainerConfig",
    "GpuConfig",
    "detect_cpus",
    "detect_memory_mib",
    "load_agent_config",
]

DEFAULT_ENV_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME")
DEFAULT_GPU_MODEL = "H100-80GB"
DEFAULT_GPU_MEMORY_MIB = 81559
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NO_PROVIDER = "no GPU provider configured: set gpus.fake: N (N fake GPUs) or gpus.nvml: true"


@dataclass(frozen=True)
class GpuConfig:
    fake: int | None              # N fake GPUs; None when the fake provider is not used
    nvml: bool
    model: str
    memory_mib: int
    nvlink_islands: int


@dataclass(frozen=True)
class ContainerConfig:
    stop_grace_s: float
    keep_on_shutdown: bool
    env_passthrough: tuple[str, ...]
    log_poll_s: float


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    host: str                     # the address the RM and AMs reach this agent at
    listen: str                   # HOST:PORT the ContainerManager server binds (port 0 = any)
    rm: str                       # HOST:PORT of the RM
    rack: str
    ib_domain: str
    state_dir: Path
    gpus: GpuConfig
    containers: ContainerConfig
    cpus: int
    memory_mib: int

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
                      environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Read agent.yaml (None = all defaults), apply `overrides` to top-level keys, validate everything.

    Overrides whose value is None are ignored, so a CLI can pass every flag it has. Raises ConfigError
    listing every problem.
    """
    env = os.environ if environ is None else environ
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
    rm = _address(r, "rm", env.get("GPURM_RM") or "127.0.0.1:7070")
    rack = r.text("rack", "rack-0")
    ib_domain = r.text("ib_domain", rack)
    state_dir = Path(r.text("state_dir", "/var/lib/gpurm/agent") or "/var/lib/gpurm/agent").expanduser()
    cpus = r.integer("cpus", detect_cpus(), minimum=1)
    detected_mib = detect_memory_mib()
    memory_mib = r.integer("memory_mib", detected_mib or None, minimum=1)
    if not r.has("memory_mib") and not detected_mib:
        r.error("memory_mib", "cannot be read from /proc/meminfo here: set it")

    gpus = _gpus(r.section("gpus"), present=r.has("gpus"))
    containers = _containers(r.section("containers"))
    r.reject_unknown()
    problems.raise_if_any()
    return AgentConfig(node_id=node_id, host=host, listen=listen, rm=rm, rack=rack, ib_domain=ib_domain,
                       state_dir=state_dir, gpus=gpus, containers=containers, cpus=cpus,
                       memory_mib=memory_mib)


def _address(r: Reader, key: str, default: str) -> str:
    value = r.text(key, default)
    try:
        parse_address(value)
    except ValueError as exc:
        r.error(key, str(exc))
    return value


def _gpus(g: Reader, *, present: bool) -> GpuConfig:
    fake = g.optional_int("fake", minimum=0)
    nvml = g.flag("nvml", False)
    model = g.text("model", DEFAULT_GPU_MODEL)
    memory_mib = g.integer("memory_mib", DEFAULT_GPU_MEMORY_MIB, minimum=1)
    islands = g.integer("nvlink_islands", 1, minimum=1)
    g.reject_unknown()
    if nvml:
        # Reserved for the NVML provider (a later issue); refuse rather than pretend.
        g.error("nvml", "NVML discovery is not available yet; use gpus.fake")
        if fake is not None:
            g.error("fake", "set only one of gpus.fake and gpus.nvml")
    elif fake is None:
        g.problems.add("gpus", NO_PROVIDER if not present or not g.data else
                       f"{NO_PROVIDER} (found only {', '.join(sorted(map(str, g.data)))})")
    elif fake and islands > fake:
        g.error("nvlink_islands", f"must be at most gpus.fake ({fake}), got {islands}")
    elif fake and fake % islands:
        g.error("nvlink_islands", f"must divide gpus.fake ({fake}) into equal islands, got {islands}")
    return GpuConfig(fake=fake, nvml=nvml, model=model, memory_mib=memory_mib, nvlink_islands=islands)


def _containers(c: Reader) -> ContainerConfig:
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
    c.reject_unknown()
    return ContainerConfig(stop_grace_s=grace, keep_on_shutdown=keep, env_passthrough=tuple(passthrough),
                           log_poll_s=poll)
