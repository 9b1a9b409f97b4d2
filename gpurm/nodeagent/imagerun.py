"""What a learner of an image job needs before its launcher starts: the image on this server (pulled when
missing, with a timeout), its mounts allowed, and the engine's `run` command with the client's environment.

The supervisor (containers.py) calls `plan_image_run` where a host process would get its argv and environment;
the launcher then runs the engine client in the foreground as the agent's user (the engine needs it), while the
command inside runs as the job's uid:gid (engine.run_argv's `--user`; uid 0 refused here and by the launcher).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpurm.common.jobspec import Mount
from gpurm.nodeagent.cgroups import CPU_PERIOD_US, MIB, Limits
from gpurm.nodeagent.engine import (
    CLIENT_ENV,
    LABEL_AGENT,
    LABEL_CONTAINER,
    LABEL_JOB,
    Engine,
    EngineRun,
    check_mounts,
    gpu_args,
    image_present,
    pull,
    run_argv,
    split_env,
)
from gpurm.nodeagent.identity import RunAs

NO_ENGINE = ("cannot start: this server has no container engine for jobs with an image (containers.engine in "
             "its agent.yaml); the RM should not have placed it here")


@dataclass(frozen=True)
class ImageSpec:
    """A learner's container as its start asks for it (LaunchContext.image, mounts, shm_size_mib)."""

    image: str
    mounts: Sequence[Mount] = ()
    shm_size_mib: int = 0


@dataclass(frozen=True)
class ImagePlan:
    """The launcher's command and environment, or why the container cannot start."""

    argv: list[str] = field(default_factory=list)
    client_env: dict[str, str] = field(default_factory=dict)
    problem: str = ""
    user_error: bool = False        # the job's fault: no retry anywhere (missing image, mount not allowed)
    infra: bool = False             # the server's fault


@dataclass(frozen=True)
class ImageRequest:
    image: str
    argv: Sequence[str]
    workdir: str
    mounts: Sequence[Mount]
    shm_size_mib: int
    name: str                       # the engine's container name
    agent_marker: str               # labels: which agent, which container, which job
    container_id: str
    job_id: str
    gpu_indices: Sequence[int]


async def plan_image_run(engine: Engine | None, req: ImageRequest, *, who: RunAs, env: Mapping[str, str],
                         work_dir: Path, limits: Limits, gpu_uuids: Mapping[int, str],
                         agent_env: Mapping[str, str], on_pull: Callable[[str], None],
                         cancel: asyncio.Event | None = None) -> ImagePlan:
    if engine is None:
        return ImagePlan(problem=NO_ENGINE, infra=True)
    uid = who.uid if who.uid is not None else os.geteuid()
    gid = who.gid if who.gid is not None else os.getegid()
    if uid == 0:
        return ImagePlan(problem="cannot start: refused: a container never runs as root (uid 0)")
    # Checked and mounted by their real paths: a symlink swapped in after the check leads nowhere new.
    mounts = [Mount(os.path.realpath(m.source), m.target, m.writable) for m in req.mounts]
    refused = check_mounts(mounts, engine.mounts_allowed)
    if refused:
        return ImagePlan(problem=f"cannot start: {refused}", user_error=True)
    present = await image_present(engine, req.image)
    if present is None:
        return ImagePlan(problem=f"cannot start: the container engine could not check image {req.image}",
                         infra=True)
    if not present:
        on_pull(f"pulling image {req.image} (timeout {engine.pull_timeout_s:g}s)")
        res = await pull(engine, req.image, cancel)
        if res.rc != 0:
            return ImagePlan(problem=f"cannot start: image {req.image} is not on this server and could not be "
                                     f"pulled: {res.message}", user_error=True)
        on_pull(f"pulled image {req.image}")
    flags, gpu_env = gpu_args(engine.gpu_passing, req.gpu_indices, gpu_uuids)
    container_env = {**env, **gpu_env}
    by_name, by_value = split_env(container_env)
    cpus = limits.cpu_quota_us / CPU_PERIOD_US if limits.cpu_quota_us else 0.0
    memory_mib = limits.memory_bytes // MIB if limits.memory_bytes else 0
    run = EngineRun(
        name=req.name, image=req.image, argv=req.argv, uid=uid, gid=gid, work_dir=work_dir, workdir=req.workdir,
        labels={LABEL_AGENT: req.agent_marker, LABEL_CONTAINER: req.container_id, LABEL_JOB: req.job_id},
        groups=[g for g in (who.groups or ()) if g != gid], env_names=by_name, env_values=by_value, mounts=mounts,
        shm_size_mib=req.shm_size_mib, cpus=cpus,
        memory_mib=memory_mib, gpu_args=flags)
    client_env = {k: v for k, v in agent_env.items() if k in CLIENT_ENV}
    client_env.update({k: container_env[k] for k in by_name})
    return ImagePlan(argv=run_argv(engine, run), client_env=client_env)
