"""The OCI engine that runs the learners of jobs with an `image`: its agent.yaml settings, its detection at the
agent's start, and the engine commands the supervisor runs (image checks, pulls, `run`, `kill`, `rm`, `ps`).

agent.yaml `containers.engine: auto | podman | docker | none` picks it (auto: podman, else docker, else none);
the agent checks the engine with a real run of a tiny command and logs what it chose. How the engine is called
follows the machine (`containers.engine_runtime`, `engine_cgroup_manager`, `engine_ulimits`, each `auto` by
default): crun refuses some hybrid cgroup layouts, so auto tries the engine's default runtime, then runc; without
systemd as PID 1 the cgroup manager is cgroupfs; and explicit ulimits at the agent's own limits, since an engine's
default raise of them fails where the agent lacks CAP_SYS_RESOURCE.

The learner's `run` command (`run_argv`, pure) is built here; the supervisor (containers.py) has the launcher
(shim.py) run it in the foreground, so the launcher still holds the output and records the exit, and a killed
agent costs the container nothing. Every container carries labels naming the agent and its container id, by
which a restarted agent finds its containers (`list_labelled`) and removes those it does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import re
import resource
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpurm.common.fields import Reader
from gpurm.common.jobspec import Mount

log = logging.getLogger(__name__)

LABEL_AGENT = "gpurm.agent"          # the agent's marker (agent_cgroup_name: node and state dir)
LABEL_CONTAINER = "gpurm.container"  # gpurm's container id
LABEL_JOB = "gpurm.job"
WORK_MOUNT = "/gpurm/work"           # the container dir's work/ inside the container (the default workdir)
CHECK_TIMEOUT_S = 60.0
ENGINE_TIMEOUT_S = 30.0              # image exists, kill, rm, ps
DEFAULT_PULL_TIMEOUT_S = 600.0
# CDI specs the NVIDIA Container Toolkit writes (`nvidia-ctk cdi generate`)
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What the engine client itself needs from the environment: never taken from a container's env by name.
CLIENT_ENV = frozenset({"PATH", "HOME", "TMPDIR", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                        "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF",
                        "DOCKER_HOST", "DOCKER_CONFIG", "LANG", "LC_ALL"})


class EngineKind(enum.Enum):
    AUTO = "auto"
    PODMAN = "podman"
    DOCKER = "docker"
    NONE = "none"


class GpuPassing(enum.Enum):
    """How a server hands a container its GPUs (`gpurm nodes` shows it)."""

    NONE = ""              # no engine: image jobs do not run here
    CDI = "cdi"            # --device nvidia.com/gpu=<uuid> (NVIDIA Container Toolkit's CDI spec)
    DEVICES = "devices"    # the GPUs' /dev/nvidia* nodes and NVIDIA_VISIBLE_DEVICES
    ENV = "env"            # fake GPUs: the environment alone, as for host processes


@dataclass(frozen=True)
class MountRule:
    """containers.mounts_allowed: a host path (and all below it) jobs may mount; read-only unless writable."""

    path: str
    writable: bool = False


@dataclass(frozen=True)
class EngineConfig:
    kind: EngineKind = EngineKind.AUTO
    binary: str = ""                        # "" = found in PATH
    runtime: str = "auto"                   # auto | an OCI runtime name (runc, crun)
    cgroup_manager: str = "auto"            # auto | cgroupfs | systemd
    ulimits: tuple[str, ...] | None = None  # None = auto (nofile and nproc at the agent's own soft limits)
    pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S
    mounts_allowed: tuple[MountRule, ...] = ()
    # More global flags for every engine call, `{state_dir}` and `{node_id}` replaced by the agent's: e.g. a store
    # of its own (`--root {state_dir}/engine --runroot /run/gpurm-{node_id}`: podman wants a runroot of at most 50
    # characters) for several agents on one machine
    args: tuple[str, ...] = ()
    image_refresh_s: float = 30.0     # how often the images held are listed for the RM (image locality)


def read_engine_config(c: Reader) -> EngineConfig:
    """The engine settings of agent.yaml's `containers:` section (problems go to the reader)."""
    kinds = [k.value for k in EngineKind]
    text = c.text("engine", "auto", choices=kinds) or "auto"
    kind = EngineKind(text) if text in kinds else EngineKind.AUTO
    binary = c.text("engine_binary", "")
    extra = tuple(c.strings("engine_args", []))
    runtime = c.text("engine_runtime", "auto") or "auto"
    manager = c.text("engine_cgroup_manager", "auto", choices=["auto", "cgroupfs", "systemd"]) or "auto"
    ulimits: tuple[str, ...] | None = None
    raw = c.raw("engine_ulimits")
    if raw is not None and raw != "auto":
        values = c.strings("engine_ulimits", [])
        for v in values:
            name, _, limits = v.partition("=")
            if not name or not limits or any(not p.lstrip("-").isdigit() for p in limits.split(":")):
                c.error("engine_ulimits", f"expected NAME=SOFT:HARD like nofile=1024:1024, or auto; got {v!r}")
        ulimits = tuple(values)
    refresh = c.duration("image_refresh", 30.0)
    if refresh <= 0:
        c.error("image_refresh", "must be more than 0")
        refresh = 30.0
    pull = c.duration("pull_timeout", DEFAULT_PULL_TIMEOUT_S)
    if pull <= 0:
        c.error("pull_timeout", "must be more than 0")
        pull = DEFAULT_PULL_TIMEOUT_S
    rules: list[MountRule] = []
    raw_rules = c.raw("mounts_allowed")
    if raw_rules is not None:
        if not isinstance(raw_rules, list):
            c.error("mounts_allowed", "must be a list of {path: /data, writable: false} (or of paths)")
        else:
            for i, item in enumerate(raw_rules):
                path, writable = (item, False) if isinstance(item, str) else (
                    (item.get("path"), item.get("writable", False)) if isinstance(item, dict) else (None, False))
                if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
                    c.error(f"mounts_allowed[{i}]", "needs an absolute host path without '..' (path: /data)")
                    continue
                if not isinstance(writable, bool):
                    c.error(f"mounts_allowed[{i}].writable", "must be true or false")
                    continue
                rules.append(MountRule(os.path.normpath(path), writable))
    return EngineConfig(kind=kind, binary=binary, runtime=runtime, cgroup_manager=manager, ulimits=ulimits,
                        pull_timeout_s=pull, mounts_allowed=tuple(rules), args=extra, image_refresh_s=refresh)


@dataclass(frozen=True)
class Engine:
    """A checked engine: how to call it."""

    kind: EngineKind
    binary: str
    global_args: tuple[str, ...] = ()     # before the subcommand: --runtime, --cgroup-manager (podman)
    ulimits: tuple[str, ...] = ()
    gpu_passing: GpuPassing = GpuPassing.ENV
    pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S
    mounts_allowed: tuple[MountRule, ...] = ()

    def cmd(self, *args: str) -> list[str]:
        return [self.binary, *self.global_args, *args]

    def describe(self) -> str:
        flags = " ".join([*self.global_args, *(f"--ulimit {u}" for u in self.ulimits)])
        return (f"{self.kind.value} ({self.binary}{' ' + flags if flags else ''}); GPUs passed by "
                f"{self.gpu_passing.value or 'none'}")


@dataclass
class EngineRun:
    """What one learner container is: everything `run_argv` needs."""

    name: str
    image: str
    argv: Sequence[str]
    labels: Mapping[str, str]
    uid: int
    gid: int
    work_dir: Path                      # the container dir's work/ on the host
    groups: Sequence[int] = ()          # the user's supplementary groups (never 0)
    workdir: str = ""                   # inside the container ("" = WORK_MOUNT)
    env_names: Sequence[str] = ()       # passed by name: the values come from the client's own environment
    env_values: Mapping[str, str] = field(default_factory=dict)   # passed with their values (names in CLIENT_ENV)
    mounts: Sequence[Mount] = ()
    shm_size_mib: int = 0
    cpus: float = 0.0
    memory_mib: int = 0
    gpu_args: Sequence[str] = ()


def run_argv(engine: Engine, run: EngineRun) -> list[str]:
    """The engine's `run` command for one learner, in the foreground: the job's uid:gid (never 0: the caller
    checked), no capabilities, no-new-privileges, the host network (NCCL, gloo), its own filesystem, PID and IPC
    namespaces with an init that passes signals on, the agent's CPU and memory limits."""
    if run.uid == 0:
        raise ValueError("a container never runs as uid 0")
    args = engine.cmd("run", "--rm", "--name", run.name, "--pull", "never", "--init",
                      "--user", f"{run.uid}:{run.gid}", "--cap-drop", "all",
                      "--security-opt", "no-new-privileges", "--network", "host", "--log-driver", "none",
                      "--sig-proxy=true")
    for g in run.groups:
        if g != 0:
            args += ["--group-add", str(g)]
    for key in sorted(run.labels):
        args += ["--label", f"{key}={run.labels[key]}"]
    for u in engine.ulimits:
        args += ["--ulimit", u]
    args += ["-v", f"{run.work_dir}:{WORK_MOUNT}:rw", "--workdir", run.workdir or WORK_MOUNT]
    for m in run.mounts:
        args += ["-v", f"{m.source}:{m.target}:{'rw' if m.writable else 'ro'}"]
    if run.shm_size_mib:
        args += ["--shm-size", f"{run.shm_size_mib}m"]
    if run.cpus > 0:
        args += ["--cpus", f"{run.cpus:g}"]
    if run.memory_mib > 0:
        args += ["--memory", f"{run.memory_mib}m"]
    args += list(run.gpu_args)
    for name in sorted(run.env_names):
        args += ["--env", name]
    for name in sorted(run.env_values):
        args += ["--env", f"{name}={run.env_values[name]}"]
    return [*args, run.image, *run.argv]


def split_env(env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """A container's environment as the engine client takes it: names whose values the client inherits (secrets
    stay off the command line), and the few that the client needs for itself, passed with their values. Only
    plain names pass (a name is an engine argument: nothing like `-x` or `A=B` may become one)."""
    names = [k for k in env if ENV_NAME.fullmatch(k)]
    by_name = [k for k in names if k not in CLIENT_ENV]
    by_value = {k: env[k] for k in names if k in CLIENT_ENV}
    return by_name, by_value


def check_mounts(mounts: Sequence[Mount], rules: Sequence[MountRule]) -> str:
    """'' when every mount is allowed by containers.mounts_allowed, else why not (for the job's diagnostics).
    The host path is resolved first, so a symlink cannot lead out of an allowed tree."""
    for m in mounts:
        real = os.path.realpath(m.source)
        rule = next((r for r in rules if real == r.path or real.startswith(r.path.rstrip("/") + "/")), None)
        if rule is None:
            allowed = ", ".join(r.path for r in rules) or "none (containers.mounts_allowed is empty)"
            return f"mount {m.source}: this server does not allow it (allowed: {allowed})"
        if m.writable and not rule.writable:
            return (f"mount {m.source}: this server allows it read-only: mount it without :rw, or ask its admin to "
                    f"allow writing there (containers.mounts_allowed)")
        if not os.path.exists(real):
            return f"mount {m.source}: does not exist on this server"
    return ""


def gpu_args(passing: GpuPassing, indices: Sequence[int], uuids: Mapping[int, str]) -> tuple[list[str], dict[str, str]]:
    """The engine flags and environment that hand a container exactly its GPUs: CDI device names, else the
    /dev/nvidia* nodes with NVIDIA_VISIBLE_DEVICES; with fake GPUs nothing beyond the usual environment. In
    the first two the container sees its GPUs as 0..n-1, so CUDA_VISIBLE_DEVICES is set to match."""
    if passing is GpuPassing.CDI and indices:
        flags = [a for i in indices for a in ("--device", f"nvidia.com/gpu={uuids.get(i) or i}")]
        return flags, {"CUDA_VISIBLE_DEVICES": ",".join(str(n) for n in range(len(indices)))}
    if passing is GpuPassing.DEVICES and indices:
        nodes = [f"/dev/nvidia{i}" for i in indices]
        nodes += [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if os.path.exists(p)]
        flags = [a for n in nodes for a in ("--device", n)]
        env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids.get(i) or str(i) for i in indices),
               "CUDA_VISIBLE_DEVICES": ",".join(str(n) for n in range(len(indices)))}
        return flags, env
    return [], {}


def gpu_passing_for(fake_gpus: bool) -> GpuPassing:
    if fake_gpus:
        return GpuPassing.ENV
    return GpuPassing.CDI if any(os.path.exists(p) for p in CDI_SPECS) else GpuPassing.DEVICES


AUTO_NPROC_MAX = 32768   # podman's conmon runs with this nproc limit: a container cannot be given more


def auto_ulimits() -> tuple[str, ...]:
    """nofile and nproc at the agent's own soft limits (soft = hard: at or below what it has; nproc at most
    AUTO_NPROC_MAX, which the engine's monitor process holds)."""
    out = []
    for name, which, cap in (("nofile", resource.RLIMIT_NOFILE, 1 << 20),
                             ("nproc", resource.RLIMIT_NPROC, AUTO_NPROC_MAX)):
        soft, hard = resource.getrlimit(which)
        value = min([v for v in (soft, hard) if v != resource.RLIM_INFINITY] + [cap])
        out.append(f"{name}={value}:{value}")
    return tuple(out)


# ---------------------------------------------------------------- running the engine


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str

    @property
    def message(self) -> str:
        """The engine's last words (its `Error:` line first), one line."""
        lines = [ln.strip() for ln in (self.err or self.out).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("Error")]
        return (errors or lines or [f"exit code {self.rc}"])[-1][:500]


async def run_engine(argv: Sequence[str], timeout_s: float = ENGINE_TIMEOUT_S,
                     cancel: asyncio.Event | None = None) -> Result:
    """Run an engine command; rc 124 on timeout or cancel (the process is killed), 127 when it cannot start."""
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        return Result(127, "", f"cannot run {argv[0]}: {exc.strerror or exc}")
    comm = asyncio.ensure_future(proc.communicate())
    waits: set[asyncio.Future[Any]] = {comm}
    stop: asyncio.Future[Any] | None = None
    if cancel is not None:
        stop = asyncio.ensure_future(cancel.wait())
        waits.add(stop)
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if stop is not None:
            stop.cancel()
    if comm not in done:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        out, err = await comm
        why = "cancelled" if cancel is not None and cancel.is_set() else f"timed out after {timeout_s:g}s"
        return Result(124, out.decode(errors="replace"), err.decode(errors="replace") + f"\n{why}")
    out, err = comm.result()
    return Result(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


async def detect(cfg: EngineConfig, *, fake_gpus: bool, state_dir: str = "",
                 node_id: str = "") -> tuple[Engine | None, str]:
    """The engine to use and one line saying what was chosen (or why none): each candidate is checked with a
    real run of `/bin/true` (podman: the host's own root filesystem, overlaid read-only: no image needed)."""
    if cfg.kind is EngineKind.NONE:
        return None, "container engine: none (containers.engine: none): jobs with an image do not run here"
    kinds = [cfg.kind] if cfg.kind is not EngineKind.AUTO else [EngineKind.PODMAN, EngineKind.DOCKER]
    problems = []
    for kind in kinds:
        binary = cfg.binary or shutil.which(kind.value) or ""
        if not binary:
            problems.append(f"{kind.value}: not installed")
            continue
        extra = tuple(a.replace("{state_dir}", state_dir).replace("{node_id}", node_id) for a in cfg.args)
        engine, why = await _check(kind, binary, cfg, fake_gpus, extra)
        if engine is not None:
            return engine, f"container engine: {engine.describe()}"
        problems.append(why)
    return None, "container engine: none usable (" + "; ".join(problems) + "): jobs with an image do not run here"


async def _check(kind: EngineKind, binary: str, cfg: EngineConfig, fake_gpus: bool,
                 extra: tuple[str, ...] = ()) -> tuple[Engine | None, str]:
    ulimits = cfg.ulimits if cfg.ulimits is not None else auto_ulimits()
    common = dict(ulimits=ulimits, gpu_passing=gpu_passing_for(fake_gpus), pull_timeout_s=cfg.pull_timeout_s,
                  mounts_allowed=cfg.mounts_allowed)
    if kind is EngineKind.DOCKER:
        # Docker has no --rootfs: the check is that its daemon answers.
        res = await run_engine([binary, "info", "--format", "{{.ServerVersion}}"], CHECK_TIMEOUT_S)
        if res.rc != 0:
            return None, f"docker: {res.message}"
        return Engine(kind, binary, extra, **common), ""  # type: ignore[arg-type]
    managers = [cfg.cgroup_manager] if cfg.cgroup_manager != "auto" else (
        [] if os.path.isdir("/run/systemd/system") else ["cgroupfs"])
    runtimes = [cfg.runtime] if cfg.runtime != "auto" else ["", *(["runc"] if shutil.which("runc") else [])]
    last = ""
    for runtime in runtimes:
        global_args = tuple([*(["--runtime", runtime] if runtime else []),
                             *(a for m in managers for a in ("--cgroup-manager", m)), *extra])
        engine = Engine(kind, binary, global_args, **common)  # type: ignore[arg-type]
        argv = engine.cmd("run", "--rm", "--network", "host", "--log-driver", "none",
                          *(a for u in ulimits for a in ("--ulimit", u)), "--rootfs", "/:O", "/bin/true")
        res = await run_engine(argv, CHECK_TIMEOUT_S)
        if res.rc == 0:
            return engine, ""
        last = f"podman{' --runtime ' + runtime if runtime else ''}: {res.message}"
        log.info("container engine check failed: %s", last)
    return None, last


async def image_present(engine: Engine, image: str) -> bool | None:
    """Whether the engine holds the image; None when it could not tell (the engine failed)."""
    res = await run_engine(engine.cmd("image", "inspect", "--format", "{{.Id}}", image))
    if res.rc == 0:
        return True
    text = (res.err + res.out).lower()
    return False if any(w in text for w in ("not known", "no such image", "not found")) else None


async def pull(engine: Engine, image: str, cancel: asyncio.Event | None = None) -> Result:
    return await run_engine(engine.cmd("pull", image), engine.pull_timeout_s, cancel)


async def kill(engine: Engine, name: str, signal_name: str = "KILL") -> None:
    await run_engine(engine.cmd("kill", "--signal", signal_name, name))


async def remove(engine: Engine, name: str) -> None:
    await run_engine(engine.cmd("rm", "-f", name))


async def list_labelled(engine: Engine, agent: str) -> dict[str, str]:
    """Engine container name → gpurm container id, of the containers this agent labelled."""
    res = await run_engine(engine.cmd("ps", "-a", "--filter", f"label={LABEL_AGENT}={agent}", "--format",
                                      f'{{{{.Names}}}} {{{{index .Labels "{LABEL_CONTAINER}"}}}}'))
    out: dict[str, str] = {}
    if res.rc != 0:
        log.warning("cannot list the engine's containers: %s", res.message)
        return out
    for line in res.out.splitlines():
        name, _, cid = line.strip().partition(" ")
        if name:
            out[name] = cid.strip()
    return out


async def reap(engine: Engine, agent: str, keep: set[str]) -> list[str]:
    """Remove this agent's engine containers that are not in `keep` (the names of its live containers), as a
    restarted agent does with what it does not know; returns the names removed."""
    gone = [name for name in await list_labelled(engine, agent) if name not in keep]
    for name in gone:
        log.warning("removing engine container %s: no live container of this agent runs in it", name)
        await remove(engine, name)
    return gone


def container_name(marker_prefix: str, container_id: str) -> str:
    """The engine's name for a gpurm container: unique per agent (two agents on one machine in tests)."""
    safe = "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in f"gpurm-{marker_prefix}-{container_id}")
    return safe[:200]


def image_exit(rc: int, stopped: bool) -> tuple[int, str, bool, bool]:
    """A foreground `run`'s exit code read as the container's end: (rc as a record keeps it: negative = that
    signal, a note, user_error, infra_failure). 125: the engine failed; 126 / 127: the command could not be run
    in the image (the job's fault); 128+N after a stop: killed by signal N."""
    if rc == 125:
        return rc, "the container engine failed to run the container (see the job's log)", False, True
    if rc in (126, 127):
        what = "not found in the image" if rc == 127 else "not executable in the image"
        return rc, f"the command was {what}", True, False
    if stopped and 128 < rc < 160:
        return -(rc - 128), "", False, False
    return rc, "", False, False
