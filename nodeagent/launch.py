"""How one container process is launched: its argv, its environment, the spawn, and waiting for its exit.

The agent keeps no pipe to a container: output goes straight to a file, and the exit is watched through a
pidfd, so an agent restart cannot SIGPIPE a learner. (User switching and cgroups, later issues, hook in here:
`subprocess.Popen(user=..., group=...)` and a cgroup the child joins.)
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpurm.proto import gpurm_pb2 as pb


def container_argv(kind: pb.ContainerKind, argv: Sequence[str]) -> list[str]:
    """An AM container runs gpurm's own AM with the agent's interpreter; a learner runs its argv as is."""
    if kind == pb.CONTAINER_AM:
        return [sys.executable, "-m", "gpurm.am", *argv]
    return list(argv)


def container_env(*, passthrough: Sequence[str], agent_env: Mapping[str, str], launch_env: Mapping[str, str],
                  container_id: str, node_id: str, kind: pb.ContainerKind,
                  gpu_indices: Sequence[int]) -> dict[str, str]:
    """Passthrough vars of the agent, then the launch env, then what the agent decides (it wins: a job must
    not widen its own CUDA_VISIBLE_DEVICES)."""
    env = {name: agent_env[name] for name in passthrough if name in agent_env}
    env.update(launch_env)
    gpus = "" if kind == pb.CONTAINER_AM else ",".join(str(i) for i in gpu_indices)
    env.update({
        "CUDA_VISIBLE_DEVICES": gpus,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # so CUDA's indices are NVML's (= the ones the RM granted)
        "GPURM_CONTAINER_ID": container_id,
        "GPURM_NODE_ID": node_id,
        "GPURM_GPUS": gpus,
    })
    return env


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start the process as a session (and process group) leader, stdout and stderr appended to log_path.

    Raises OSError when exec fails (command not found, permission denied ...).
    """
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    finally:
        os.close(fd)


def describe_exec_error(exc: OSError, program: str) -> str:
    """One line saying why `program` could not be started."""
    if exc.errno == errno.ENOENT:
        return f"cannot start {program!r}: command not found"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"cannot start {program!r}: permission denied"
    if exc.errno == errno.ENOEXEC:
        return f"cannot start {program!r}: not an executable format"
    return f"cannot start {program!r}: {exc.strerror or exc}"


async def wait_for_exit(proc: subprocess.Popen[bytes]) -> int:
    """The process's return code (negative = killed by that signal), awaited without a thread when pidfds
    exist (Linux >= 5.3); a thread blocked in waitpid otherwise."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return await asyncio.to_thread(proc.wait)
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(pidfd, readable.set)
    try:
        while (rc := proc.poll()) is None:
            await readable.wait()
            readable.clear()
        return rc
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
