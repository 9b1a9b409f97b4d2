"""Job specs: the YAML a user submits, its validation, and its wire form.

The CLI validates a file before sending it (exit 2, nothing created); the RM validates again what arrives over
gRPC, since anything may call it.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpurm.common.fields import ConfigError, Problems, Reader
from gpurm.proto import gpurm_pb2 as pb

DEFAULT_MAX_RETRIES = 3
MAX_GPUS_PER_JOB = 4096
MAX_GPU_SHARE = 100             # gpu_share: N -- at most this many jobs on one GPU (a share of at least 0.01)
MAX_COMMAND_ARGS = 65536
MAX_COMMAND_BYTES = 1 << 20     # the kernel takes about 2 MiB of argv and environment together
MAX_ENV_VARS = 1024
MAX_ENV_BYTES = 1 << 20
MAX_WORKDIR = 4096              # PATH_MAX
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "GPURM_")
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MAX_IMAGE = 512
MAX_MOUNTS = 32
MAX_SHM_MIB = 1 << 20           # 1 TiB
# An image reference as the engines take it: [registry[:port]/]name[:tag][@digest]
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
# Where a mount may not go: the container's own system trees, and gpurm's work dir
FORBIDDEN_TARGETS = ("/", "/proc", "/sys", "/dev", "/etc", "/gpurm")


class LocalityLevel(enum.IntEnum):
    """How tightly a job's GPUs are packed, strictest first. The AM relaxes one level at a time."""

    NODE = 0     # every GPU on one server
    PACKED = 1   # fewest servers, all in one rack / IB domain
    RACK = 2     # any number of servers in one rack / IB domain
    ANY = 3      # anywhere

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> LocalityLevel:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"must be one of node, packed, rack, any; got {text!r}") from None


class LocalityMode(enum.Enum):
    """How much a job cares about locality (its sensitivity): how far its AM may relax."""

    STRICT = "strict"   # waits (with back-off) at the best level the cluster's shape allows; never relaxes past it
    PREFER = "prefer"   # waits a while at each level, then relaxes (Philly's policy; the default)
    ANY = "any"         # does not wait for locality: starts at `any`

    @classmethod
    def parse(cls, text: str) -> LocalityMode:
        try:
            return cls(text.lower())
        except ValueError:
            raise ValueError(f"must be one of strict, prefer, any; got {text!r}") from None


class Placement(enum.Enum):
    """How a job's GPUs are laid out: packed on as few servers as possible (the default), or spread one container
    per server over as many servers (and racks) as possible, for replicated services (parameter servers, data
    loaders, inference replicas). See docs/jobs.md for how `locality` applies to a spread job."""

    PACK = "pack"
    SPREAD = "spread"

    @classmethod
    def parse(cls, text: str) -> Placement:
        try:
            return cls(text.lower())
        except ValueError:
            raise ValueError(f"must be one of pack, spread; got {_clip(text)}") from None


@dataclass
class Locality:
    timeout_s: float = 60.0
    backoff_base_s: float = 10.0
    backoff_max_s: float = 600.0
    start_level: LocalityLevel = LocalityLevel.PACKED
    mode: LocalityMode = LocalityMode.PREFER


@dataclass(frozen=True)
class Mount:
    """A host path a job's container sees: `source` (on the server, allowed by its containers.mounts_allowed) at
    `target`, read-only unless `writable`."""

    source: str
    target: str
    writable: bool = False

    @property
    def text(self) -> str:
        return f"{self.source}:{self.target}:{'rw' if self.writable else 'ro'}"


def parse_mount(text: str) -> Mount:
    """`SRC[:DST][:ro|rw]` (DST defaults to SRC, read-only by default); ValueError saying the form."""
    parts = text.split(":")
    mode = "ro"
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        mode = parts.pop()
    if len(parts) not in (1, 2) or not parts[0]:
        raise ValueError(f"must be SRC[:DST][:ro|rw] like /data:/data:ro; got {_clip(text)}")
    return Mount(parts[0], parts[1] if len(parts) == 2 else parts[0], mode == "rw")


@dataclass
class JobSpec:
    gpus: int
    command: list[str]
    name: str = ""
    queue: str = ""
    workdir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    max_retries: int = DEFAULT_MAX_RETRIES
    locality: Locality = field(default_factory=Locality)
    placement: Placement = Placement.PACK
    max_gpus: int = 0            # elastic: may grow up to this many GPUs; 0 = rigid (exactly `gpus`)
    gpu_share_milli: int = 0     # shared GPU: this job's thousandths of one GPU (gpus: 0.5 -> 500); 0 = whole GPUs
    image: str = ""              # OCI image the learners run in ("" = host processes, as before)
    mounts: list[Mount] = field(default_factory=list)   # host paths in the container (image jobs only)
    shm_size_mib: int = 0        # the container's /dev/shm (0 = the engine's default)

    @property
    def elastic(self) -> bool:
        return self.max_gpus > self.gpus

    @property
    def shared(self) -> bool:
        """A job below one GPU (`gpus: 0.5` or `gpu_share: N`): it shares one GPU with other such jobs."""
        return self.gpu_share_milli > 0

    @property
    def gpu_amount(self) -> float:
        """What the job counts for in the fair share: its GPUs, or its fraction of one for a shared job."""
        return self.gpu_share_milli / 1000 if self.shared else float(self.gpus)

    @property
    def most_gpus(self) -> int:
        """The most GPUs this job may hold: `max_gpus` when elastic, else `gpus`."""
        return max(self.gpus, self.max_gpus)

    @property
    def gpus_text(self) -> str:
        """`4`, `4:16` for an elastic job, `0.5` for a shared one (the forms `--gpus` takes)."""
        if self.shared:
            return share_text(self.gpu_share_milli)
        return f"{self.gpus}:{self.max_gpus}" if self.elastic else str(self.gpus)

    @property
    def command_text(self) -> str:
        """The command as a user wrote it: the shell string, or the argv joined."""
        if len(self.command) == 3 and self.command[:2] == ["/bin/sh", "-c"]:
            return self.command[2]
        import shlex

        return shlex.join(self.command)


def share_text(milli: int) -> str:
    """Thousandths of a GPU as a user writes them: 500 -> `0.5`, 250 -> `0.25`."""
    return f"{milli / 1000:.3f}".rstrip("0").rstrip(".")


def shell_command(text: str) -> list[str]:
    return ["/bin/sh", "-c", text]


def parse_job_yaml(text: str, source: str = "job file", base_dir: str | None = None) -> JobSpec:
    """A JobSpec from YAML text; ConfigError lists every problem, each naming its field.

    A relative `workdir` is taken relative to `base_dir` (the job file's directory) when given.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{source}: not valid YAML{where}: {problem}"]) from None
    if data is None:
        raise ConfigError([f"{source}: is empty; a job needs at least `gpus` and `command`"])
    return spec_from_mapping(data, source, base_dir)


def spec_from_mapping(data: Any, source: str = "job", base_dir: str | None = None) -> JobSpec:
    problems = Problems()
    r = Reader(data, "", problems)
    if not isinstance(data, dict):
        raise ConfigError(problems.items or [f"{source}: expected a mapping of fields"])
    spec = JobSpec(gpus=0, command=[])
    spec.name = r.text("name", "")
    spec.queue = r.text("queue", "")
    if isinstance(r.raw("gpus"), dict):
        # Elastic: `gpus: {min: 4, max: 16}`.
        g = r.section("gpus")
        spec.gpus = g.integer("min", minimum=1)
        spec.max_gpus = g.integer("max", 0)
        if not spec.max_gpus:
            g.error("max", "is required for an elastic job (gpus: {min: 4, max: 16}); for a fixed size write gpus: 4")
            spec.max_gpus = spec.gpus
        g.reject_unknown()
    elif isinstance(r.raw("gpus"), str | float):
        try:
            spec.gpus, spec.max_gpus, spec.gpu_share_milli = parse_gpus_text(str(r.raw("gpus")))
        except ValueError as exc:
            r.error("gpus", str(exc))
            spec.gpus = 1
    elif r.raw("gpus") is not None or r.raw("gpu_share") is None:
        spec.gpus = r.integer("gpus", minimum=1)
    if r.raw("gpu_share") is not None:
        _read_gpu_share(r, spec)
    raw_cmd = r.raw("command")
    if raw_cmd is None:
        r.error("command", "is required: a string (run with /bin/sh -c) or a list (run as is)")
    elif isinstance(raw_cmd, str):
        spec.command = shell_command(raw_cmd)
    elif isinstance(raw_cmd, list) and raw_cmd and all(isinstance(a, str | int | float) for a in raw_cmd):
        spec.command = [str(a) for a in raw_cmd]
    else:
        r.error("command", "must be a non-empty string or a non-empty list of strings")
    spec.workdir = r.text("workdir", "")
    if spec.workdir and base_dir is not None and not os.path.isabs(spec.workdir):
        spec.workdir = os.path.normpath(os.path.join(base_dir, spec.workdir))
    spec.env = r.mapping("env")
    spec.max_retries = r.integer("max_retries", DEFAULT_MAX_RETRIES, minimum=0)
    if isinstance(r.raw("locality"), str):
        # The shorthand `locality: strict` sets the mode alone.
        spec.locality = Locality(mode=_mode_text(r, "locality", str(r.raw("locality"))))
    else:
        loc = r.section("locality")
        spec.locality = Locality(
            timeout_s=loc.duration("timeout", 60.0),
            backoff_base_s=loc.duration("backoff_base", 10.0),
            backoff_max_s=loc.duration("backoff_max", 600.0),
            start_level=_level(loc, "start_level"),
            mode=_mode_text(loc, "mode", loc.text("mode", "prefer")),
        )
        loc.reject_unknown()
    _read_container(r, spec)
    raw_placement = r.raw("placement")
    if raw_placement is not None:
        if isinstance(raw_placement, str):
            try:
                spec.placement = Placement.parse(raw_placement)
            except ValueError as exc:
                r.error("placement", str(exc))
        else:
            r.error("placement", f"must be one of pack, spread; got {_clip(str(raw_placement))}")
    r.reject_unknown()
    for p in validate_spec(spec):
        if p not in problems.items:
            problems.items.append(p)
    if problems.items:
        raise ConfigError([f"{source}: {p}" for p in problems.items])
    return spec


def parse_gpus(text: str) -> tuple[int, int]:
    """`4` -> (4, 0); `4:16` -> (4, 16), an elastic job of 4 to 16 GPUs. ValueError saying the form."""
    gpus, most, milli = parse_gpus_text(text)
    if milli:
        raise ValueError(f"must be a whole number of GPUs here; got {_clip(text)}")
    return gpus, most


def parse_gpus_text(text: str) -> tuple[int, int, int]:
    """(gpus, max_gpus, gpu_share_milli): `4` -> (4, 0, 0); `4:16` -> (4, 16, 0), an elastic job of 4 to 16 GPUs;
    `0.5` -> (1, 0, 500), half of one shared GPU. ValueError saying the forms."""
    lo, sep, hi = text.strip().partition(":")
    if not sep and "." in lo:
        return 1, 0, share_milli(lo)
    try:
        low = int(lo)
        high = int(hi) if sep else 0
    except ValueError:
        raise ValueError(f"must be an integer like 4, min:max like 4:16 for an elastic job, or a fraction like 0.5 "
                         f"of one shared GPU; got {_clip(text)}") from None
    return low, high, 0


def share_milli(text: str) -> int:
    """A fraction of one GPU (`0.5`) in thousandths (500); ValueError when it is not a fraction between 0 and 1
    with at most three decimals."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a fraction of one GPU like 0.5; got {_clip(text)}") from None
    milli = round(value * 1000)
    if not 0 < value < 1:
        raise ValueError(f"a fraction of a GPU must be between 0 and 1 (e.g. 0.5); for one GPU or more ask for whole "
                         f"GPUs (gpus: 2); got {_clip(text)}")
    if abs(value * 1000 - milli) > 1e-6 or milli < 1:
        raise ValueError(f"a fraction of a GPU has at most three decimals (e.g. 0.25); got {_clip(text)}")
    return milli


def _read_gpu_share(r: Reader, spec: JobSpec) -> None:
    """`gpu_share: N`: one of N jobs sharing one GPU (a 1/N share); `gpus` may then be left out or be 1."""
    n = r.integer("gpu_share", minimum=2)
    if n > MAX_GPU_SHARE:
        r.error("gpu_share", f"at most {MAX_GPU_SHARE} jobs share one GPU, got {n}")
        return
    if spec.gpu_share_milli or spec.elastic or (r.raw("gpus") is not None and spec.gpus != 1):
        r.error("gpu_share", "goes with one GPU only: leave gpus out (or write gpus: 1), or write gpus: 0.5 alone")
        return
    spec.gpus, spec.gpu_share_milli = 1, 1000 // n


def _read_container(r: Reader, spec: JobSpec) -> None:
    """`image`, `mounts` (a list of SRC[:DST][:ro|rw] or {source, target, writable}) and `shm_size`."""
    spec.image = r.text("image", "")
    raw = r.raw("mounts")
    if raw is not None:
        if not isinstance(raw, list):
            r.error("mounts", "must be a list like [/data:/data:ro] or [{source: /data, target: /data}]")
        else:
            for i, item in enumerate(raw[:MAX_MOUNTS + 1]):
                try:
                    if isinstance(item, str):
                        spec.mounts.append(parse_mount(item))
                    elif isinstance(item, dict) and isinstance(item.get("source"), str) and \
                            set(item) <= {"source", "target", "writable"}:
                        writable = item.get("writable", False)
                        if not isinstance(writable, bool):
                            raise ValueError("writable: must be true or false")
                        spec.mounts.append(Mount(item["source"], str(item.get("target") or item["source"]),
                                                 writable))
                    else:
                        raise ValueError("must be SRC[:DST][:ro|rw] or {source, target, writable}")
                except ValueError as exc:
                    r.error(f"mounts[{i}]", str(exc))
    if r.has("shm_size"):
        raw_shm = r.raw("shm_size")
        try:
            spec.shm_size_mib = parse_mib(raw_shm)
        except ValueError as exc:
            r.error("shm_size", str(exc))


def image_key(ref: str) -> str:
    """An image reference as engines resolve it, so a job's `image` and a server's list compare: a tag (`latest`)
    when none, `docker.io/` (and `library/`) before a name without a registry. `torch:2.3` ->
    `docker.io/library/torch:2.3`; `localhost/x` -> `localhost/x:latest`."""
    name, at, digest = ref.partition("@")
    first, slash, _ = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}" if slash else f"docker.io/library/{name}"
    if not at and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return f"{name}{at}{digest}"


def parse_mib(value: object) -> int:
    """A size in MiB from `512m`, `2g`, `2GiB` or a plain number of MiB; ValueError saying the form."""
    text = str(value).strip().lower().removesuffix("ib").removesuffix("b")
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}
    factor = units.get(text[-1:], 0)
    number = text[:-1] if factor else text
    try:
        mib = float(number) * (factor or 1)
    except ValueError:
        raise ValueError(f"must be a size like 512m, 2g or a number of MiB; got {_clip(str(value))}") from None
    if not mib >= 1:  # also NaN
        raise ValueError(f"must be at least 1 MiB; got {_clip(str(value))}")
    return int(mib)


def container_problems(spec: JobSpec) -> list[str]:
    """Problems with the container fields (image, mounts, shm_size)."""
    out: list[str] = []
    if spec.image and (len(spec.image) > MAX_IMAGE or not _IMAGE.fullmatch(spec.image)):
        out.append(f"image: {_clip(spec.image)} is not an image reference like registry.example/team/torch:2.3")
    if not spec.image and (spec.mounts or spec.shm_size_mib):
        out.append(f"{'mounts' if spec.mounts else 'shm_size'}: only for jobs with an image (image: ...)")
    if len(spec.mounts) > MAX_MOUNTS:
        out.append(f"mounts: at most {MAX_MOUNTS}, got {len(spec.mounts)}")
    targets: set[str] = set()
    for i, m in enumerate(spec.mounts[:MAX_MOUNTS]):
        for what, path in (("source", m.source), ("target", m.target)):
            if not path.startswith("/") or ".." in path.split("/") or any(c in path for c in ":,\x00\n") or \
                    len(path) > MAX_WORKDIR:
                out.append(f"mounts[{i}].{what}: must be an absolute path without '..', ':' or ','; got {_clip(path)}")
        target = os.path.normpath(m.target) if m.target.startswith("/") else m.target
        if any(target == t or (t != "/" and target.startswith(t + "/")) for t in FORBIDDEN_TARGETS):
            out.append(f"mounts[{i}].target: {_clip(m.target)} is a system path of the container; mount elsewhere "
                       f"(e.g. /data)")
        if target in targets:
            out.append(f"mounts[{i}].target: {_clip(m.target)} is mounted twice")
        targets.add(target)
    if not 0 <= spec.shm_size_mib <= MAX_SHM_MIB:
        out.append(f"shm_size: must be between 1 MiB and 1 TiB, got {spec.shm_size_mib} MiB")
    return out


def _level(r: Reader, key: str) -> LocalityLevel:
    text = r.text(key, "packed")
    try:
        return LocalityLevel.parse(text)
    except ValueError as exc:
        r.error(key, str(exc))
        return LocalityLevel.PACKED


def _mode_text(r: Reader, key: str, text: str) -> LocalityMode:
    try:
        return LocalityMode.parse(text)
    except ValueError as exc:
        r.error(key, str(exc))
        return LocalityMode.PREFER


def _clip(text: str, limit: int = 80) -> str:
    """A user's value quoted in an error, cut short: an error must stay readable (and fit a gRPC status)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def validate_spec(spec: JobSpec) -> list[str]:
    """Problems with a spec however it arrived (YAML, flags or a raw RPC); empty when it is fine."""
    out: list[str] = []
    if spec.gpus < 1:
        out.append(f"gpus: must be at least 1, got {spec.gpus}")
    elif spec.gpus > MAX_GPUS_PER_JOB:
        out.append(f"gpus: at most {MAX_GPUS_PER_JOB} per job, got {spec.gpus}")
    if spec.max_gpus and not spec.gpus <= spec.max_gpus <= MAX_GPUS_PER_JOB:
        out.append(f"gpus.max: must be between gpus.min ({spec.gpus}) and {MAX_GPUS_PER_JOB}, got {spec.max_gpus}")
    if spec.gpu_share_milli:
        if not 0 < spec.gpu_share_milli < 1000:
            out.append(f"gpus: a shared GPU's fraction must be between 0 and 1, got {spec.gpu_share_milli / 1000:g}")
        if spec.gpus != 1 or spec.max_gpus:
            out.append("gpus: a job below one GPU (gpus: 0.5) is one container on one shared GPU: it cannot also "
                       "ask for several GPUs or be elastic")
        if spec.placement is not Placement.PACK:
            out.append("placement: spread needs whole GPUs; a job below one GPU runs on one server")
    if not spec.command or not spec.command[0]:
        out.append("command: is required and must not be empty")
    elif spec.command[:2] == ["/bin/sh", "-c"] and (len(spec.command) < 3 or not spec.command[2].strip()):
        out.append("command: the shell command is empty")
    if any("\x00" in a for a in spec.command):
        out.append("command: must not contain NUL characters")
    if len(spec.command) > MAX_COMMAND_ARGS:
        out.append(f"command: at most {MAX_COMMAND_ARGS} arguments, got {len(spec.command)}")
    elif sum(len(a.encode()) + 1 for a in spec.command) > MAX_COMMAND_BYTES:
        out.append(f"command: at most {MAX_COMMAND_BYTES >> 20} MiB in all")
    if len(spec.name) > 128:
        out.append("name: at most 128 characters")
    if spec.name and not spec.name.isprintable():
        out.append("name: must be printable text")
    if spec.queue and not _QUEUE_NAME.fullmatch(spec.queue):
        out.append(f"queue: {_clip(spec.queue)} is not a queue path like research.nlp")
    if spec.workdir and not spec.workdir.startswith("/"):
        out.append(f"workdir: must be an absolute path, got {_clip(spec.workdir)}")
    elif len(spec.workdir) > MAX_WORKDIR:
        out.append(f"workdir: at most {MAX_WORKDIR} characters, got {len(spec.workdir)}")
    if len(spec.env) > MAX_ENV_VARS:
        out.append(f"env: at most {MAX_ENV_VARS} variables, got {len(spec.env)}")
    elif sum(len(k.encode()) + len(v.encode()) + 2 for k, v in spec.env.items()) > MAX_ENV_BYTES:
        out.append(f"env: at most {MAX_ENV_BYTES >> 20} MiB in all")
    for name, value in list(spec.env.items())[:MAX_ENV_VARS]:
        if not _ENV_NAME.fullmatch(name):
            out.append(f"env.{_clip(name)}: not a valid environment variable name")
        elif name == RESERVED_ENV[0] or name.startswith(RESERVED_ENV[1]):
            out.append(f"env.{name}: is set by gpurm and cannot be overridden")
        if "\x00" in value:
            out.append(f"env.{_clip(name)}: must not contain NUL characters")
    if spec.max_retries < 0 or spec.max_retries > 100:
        out.append(f"max_retries: must be between 0 and 100, got {spec.max_retries}")
    loc = spec.locality
    for label, seconds in (("timeout", loc.timeout_s), ("backoff_base", loc.backoff_base_s),
                           ("backoff_max", loc.backoff_max_s)):
        if not 0 <= seconds <= 7 * 86400:
            out.append(f"locality.{label}: must be between 0s and 7d, got {seconds:g}s")
    # backoff_max below backoff_base is a constant back-off of backoff_max (am/acquire.py: min(base * 2^n, max)).
    out += container_problems(spec)
    return out


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(
        name=spec.name, queue=spec.queue, gpus=spec.gpus, command=spec.command, workdir=spec.workdir,
        env=spec.env, max_retries=spec.max_retries, max_gpus=spec.max_gpus if spec.elastic else 0,
        gpu_share_milli=spec.gpu_share_milli,
        locality=pb.LocalitySpec(
            timeout_ms=round(spec.locality.timeout_s * 1000),
            backoff_base_ms=round(spec.locality.backoff_base_s * 1000),
            backoff_max_ms=round(spec.locality.backoff_max_s * 1000),
            start_level=spec.locality.start_level.label,
            mode=spec.locality.mode.value,
        ),
    )
    if spec.placement is not Placement.PACK:
        msg.placement = spec.placement.value     # "" on the wire is pack, as from a client that predates the field
    msg.image = spec.image
    msg.mounts.extend(mounts_to_proto(spec.mounts))
    msg.shm_size_mib = spec.shm_size_mib
    return msg


def mounts_to_proto(mounts: list[Mount]) -> list[pb.Mount]:
    return [pb.Mount(source=m.source, target=m.target, writable=m.writable) for m in mounts]


def mounts_from_proto(msgs: Any) -> list[Mount]:
    return [Mount(m.source, m.target, m.writable) for m in msgs]


def spec_from_proto(msg: pb.JobSpec) -> JobSpec:
    """A JobSpec from the wire, defaults filled; ConfigError when it is invalid."""
    problems: list[str] = []
    loc = Locality()
    if msg.HasField("locality"):
        lm = msg.locality
        if lm.timeout_ms:
            loc.timeout_s = lm.timeout_ms / 1000
        if lm.backoff_base_ms:
            loc.backoff_base_s = lm.backoff_base_ms / 1000
        if lm.backoff_max_ms:
            loc.backoff_max_s = lm.backoff_max_ms / 1000
        if lm.start_level:
            try:
                loc.start_level = LocalityLevel.parse(lm.start_level)
            except ValueError as exc:
                problems.append(f"locality.start_level: {exc}")
        if lm.mode:
            try:
                loc.mode = LocalityMode.parse(lm.mode)
            except ValueError as exc:
                problems.append(f"locality.mode: {exc}")
        if min(lm.timeout_ms, lm.backoff_base_ms, lm.backoff_max_ms) < 0:
            problems.append("locality: durations must not be negative")
    placement = Placement.PACK
    if msg.placement:
        try:
            placement = Placement.parse(msg.placement)
        except ValueError as exc:
            problems.append(f"placement: {exc}")
    spec = JobSpec(
        gpus=msg.gpus,
        command=list(msg.command),
        name=msg.name,
        queue=msg.queue,
        workdir=msg.workdir,
        env=dict(msg.env),
        max_retries=msg.max_retries if msg.HasField("max_retries") else DEFAULT_MAX_RETRIES,
        locality=loc,
        placement=placement,
        max_gpus=msg.max_gpus,
        gpu_share_milli=msg.gpu_share_milli,
        image=msg.image,
        mounts=mounts_from_proto(msg.mounts),
        shm_size_mib=msg.shm_size_mib,
    )
    problems += validate_spec(spec)
    if problems:
        raise ConfigError(problems)
    return spec
