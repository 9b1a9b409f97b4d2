"""How one container process is launched: its argv, its environment, the spawn, and waiting for its exit.

Every container runs under a launcher, `gpurm.nodeagent.shim` (see there): the agent hands it the launch spec
through an unnamed file (never a file in the container dir, which belongs to the job's user), starts it as a
session leader, and reads one handshake line (the command's pid or why exec failed).
The launcher, not the agent, holds the output pipe (rotating output.log) and waits for the command (writing
exit.json), so the agent can be killed or upgraded under running containers and adopt them afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpurm.common.aio import wait_set
from gpurm.nodeagent.identity import RunAs
from gpurm.nodeagent.private import open_append, open_read
from gpurm.nodeagent.procgroup import pid_alive, start_time
from gpurm.nodeagent.shim import EXIT_FILE
from gpurm.proto import gpurm_pb2 as pb

LAUNCHER_LOG = "launcher.log"


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


MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"      # nvidia-cuda-mps-control's pipe directory unless told otherwise


def mps_pipe_dir(agent_env: Mapping[str, str]) -> str:
    """The CUDA MPS control daemon's pipe directory when one runs on this node (its `control` pipe exists), else
    "". The agent's CUDA_MPS_PIPE_DIRECTORY names it where it is not the default."""
    pipe_dir = agent_env.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DEFAULT
    return pipe_dir if os.path.exists(os.path.join(pipe_dir, "control")) else ""


def share_env(share_milli: int, gpu_memory_mib: int, mps_dir: str) -> dict[str, str]:
    """What a container on a shared GPU is told: its share and GPU-memory limit (GPURM_GPU_SHARE,
    GPURM_GPU_MEMORY_MIB: a framework can cap itself, e.g. torch.cuda.set_per_process_memory_fraction), and where
    CUDA MPS runs, the MPS limits MPS enforces: the share of the GPU's SMs and the pinned device memory."""
    env = {"GPURM_GPU_SHARE": f"{share_milli / 1000:g}", "GPURM_GPU_MEMORY_MIB": str(gpu_memory_mib)}
    if mps_dir:
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_dir
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, share_milli // 10))
        if gpu_memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={gpu_memory_mib}M"   # device 0: its only visible GPU
    return env


@dataclass(frozen=True)
class Handshake:
    """The launcher's first word: the command's pid, or why it could not be started."""

    pid: int = 0
    error: str = ""
    cgroup_error: str = ""        # the launcher could not join the container's cgroup (it ran without)
    launcher_failed: bool = False  # the launcher itself died or hung before answering (an agent problem)
    user_error: bool = False       # exec failed for the job's own reason (command not found, no workdir)


def launch_spec(*, argv: Sequence[str], env: Mapping[str, str], cwd: Path, run_as: RunAs,
                cgroup: Path | None, log_max_size: int, log_keep: int, engine_uid: int | None = None) -> bytes:
    """The shim's launch spec (JSON): the command, its env (tokens), its user, its cgroup, log rotation.
    `engine_uid`: the command is an OCI engine's `run` (it stays the agent's user) whose container runs as
    that uid; the shim refuses 0 there as it does for its own user."""
    spec = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "uid": run_as.uid, "gid": run_as.gid,
            "groups": list(run_as.groups) if run_as.groups is not None else None,
            "cgroup": str(cgroup) if cgroup is not None else "", "log_max_size": log_max_size,
            "log_keep": log_keep}
    if engine_uid is not None:
        spec["engine_uid"] = engine_uid
    return json.dumps(spec).encode()


def spawn_shim(cdir: Path, env: Mapping[str, str], spec: bytes) -> tuple[subprocess.Popen[bytes], int]:
    """Start the launcher as a new session (its group is the container's), the spec in an unnamed temp file
    it reads from an inherited fd; returns it and the read end of the handshake pipe. Raises OSError when even
    the launcher cannot be started."""
    with tempfile.TemporaryFile() as spec_file:
        spec_file.write(spec)
        spec_file.flush()
        spec_file.seek(0)
        spec_fd = spec_file.fileno()
        r, w = os.pipe()
        errors = -1
        try:
            errors = open_append(cdir / LAUNCHER_LOG)
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpurm.nodeagent.shim", str(cdir), str(w), str(spec_fd)], env=dict(env),
                cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                pass_fds=(w, spec_fd), start_new_session=True, close_fds=True)
        except OSError:
            os.close(r)
            raise
        finally:
            os.close(w)
            if errors >= 0:
                os.close(errors)
    return proc, r


def read_handshake(fd: int, timeout_s: float) -> Handshake:
    """Blocking (run it in a thread): the launcher's answer line, or launcher_failed on EOF / timeout."""
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return Handshake(error=f"the container's launcher did not answer within {timeout_s:g}s",
                                 launcher_failed=True)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return Handshake(error="the container's launcher died before starting the command",
                                 launcher_failed=True)
            buf += chunk
    finally:
        os.close(fd)
    try:
        data = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return Handshake(error="the container's launcher answered nonsense", launcher_failed=True)
    return Handshake(pid=int(data.get("pid", 0)), error=str(data.get("error", "")),
                     cgroup_error=str(data.get("cgroup_error", "")), user_error=data.get("user_error") is True)


def read_exit(cdir: Path) -> int | None:
    """The command's return code from exit.json (negative = that signal), None when it was not written."""
    try:
        with os.fdopen(open_read(cdir / EXIT_FILE), "rb") as f:
            return int(json.loads(f.read())["returncode"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


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


async def wait_pid_exit(pid: int, started: int, poll_s: float = 0.5) -> None:
    """Wait until `pid` (not our child: an adopted container's launcher) has ended, or is no longer the
    process that started at `started`. A pidfd where the kernel has them, else /proc polling."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = -1
    if pidfd >= 0 and started and start_time(pid) != started:  # the pid was reused before we opened it
        os.close(pidfd)
        return
    if pidfd < 0:
        while pid_alive(pid) and (not started or start_time(pid) in (0, started)):
            await asyncio.sleep(poll_s)
        return
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(pidfd, readable.set)
    try:
        while pid_alive(pid):  # readable = exited (a zombie counts as gone)
            await _wait_or(readable, poll_s * 4)
            readable.clear()
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


async def _wait_or(event: asyncio.Event, timeout_s: float) -> None:
    await wait_set(event, timeout_s)
