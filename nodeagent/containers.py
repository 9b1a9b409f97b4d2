"""ContainerSupervisor: the live containers of this node, their exits, stops, logs and records.

The agent owns process state (one authority per fact): a container is live from its spawn until its whole
process group is gone; then it is terminal and stays known until the RM acknowledges it (`forget`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpurm.nodeagent.config import DEFAULT_ENV_PASSTHROUGH
from gpurm.nodeagent.launch import container_argv, container_env, describe_exec_error, spawn, wait_for_exit
from gpurm.nodeagent.procgroup import group_members, kill_group, signal_group, wait_group_gone
from gpurm.nodeagent.records import (
    LOG_FILE,
    RECORD_FILE,
    ContainerRecord,
    read_record,
    safe_container_id,
    write_json_atomic,
)
from gpurm.proto import gpurm_pb2 as pb

log = logging.getLogger(__name__)

ChangeListener = Callable[[ContainerRecord], None]


class ContainerError(Exception):
    """A container request that cannot be carried out; the message is one line for the caller."""


class UnknownContainerError(ContainerError):
    pass


class GpuBusyError(ContainerError):
    def __init__(self, gpu: int, holder: str) -> None:
        self.gpu = gpu
        self.holder = holder
        super().__init__(f"GPU {gpu} is held by live container {holder}")


class ContainerExistsError(ContainerError):
    """The id already ran on this node (its record is on disk): a container id is never launched twice."""


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    next_offset: int
    size: int
    done: bool                    # the container has ended: the file will not grow any more


def now_ms() -> int:
    return int(time.time() * 1000)


class ContainerSupervisor:
    def __init__(self, node_id: str, state_dir: Path, *,
                 env_passthrough: Sequence[str] = DEFAULT_ENV_PASSTHROUGH, stop_grace_s: float = 10.0,
                 agent_env: Mapping[str, str] | None = None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self.node_id = node_id
        self.containers_dir = state_dir / "containers"
        self.env_passthrough = tuple(env_passthrough)
        self.stop_grace_s = stop_grace_s
        self._agent_env = dict(os.environ if agent_env is None else agent_env)
        self._clock_ms = clock_ms
        self._records: dict[str, ContainerRecord] = {}
        # Held until exit: a Popen dropped while its process runs lands in subprocess._active, whose reaping
        # on the next Popen would steal the exit status from our watcher.
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ended: dict[str, asyncio.Event] = {}
        self._stops: dict[str, asyncio.Task[None]] = {}
        self._kill_at: dict[str, float] = {}  # loop time when a stopping container's group gets SIGKILL
        self._tasks: set[asyncio.Task[None]] = set()
        self._listeners: list[ChangeListener] = []
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ queries

    def add_listener(self, listener: ChangeListener) -> None:
        """`listener(record)` runs on every state change (in the event loop; it must not block)."""
        self._listeners.append(listener)

    def container_dir(self, container_id: str) -> Path:
        if not safe_container_id(container_id):
            raise UnknownContainerError(f"invalid container id {container_id!r}")
        return self.containers_dir / container_id

    def log_path(self, container_id: str) -> Path:
        return self.container_dir(container_id) / LOG_FILE

    def record(self, container_id: str) -> ContainerRecord | None:
        return self._records.get(container_id)

    def records(self) -> list[ContainerRecord]:
        """Live containers and ended ones not yet forgotten (read-only views)."""
        return list(self._records.values())

    def statuses(self) -> list[pb.ContainerStatus]:
        return [r.to_proto() for r in self._records.values()]

    def status(self, container_id: str) -> pb.ContainerStatus | None:
        """The status of a known container, or of a forgotten one from its record on disk."""
        rec = self._records.get(container_id) or self._load_ended(container_id)
        return rec.to_proto() if rec else None

    def gpus_in_use(self) -> dict[int, str]:
        """GPU index → the live container holding it."""
        return {g: r.container_id for r in self._records.values() if r.live for g in r.gpu_indices}

    def _load_ended(self, container_id: str) -> ContainerRecord | None:
        if not safe_container_id(container_id):
            return None
        rec = read_record(self.containers_dir / container_id)
        if rec is not None and rec.live:
            # Launched by an earlier agent process and not adopted (adoption is a later issue).
            rec.state = pb.CONTAINER_LOST
            rec.diagnostics = "the agent restarted and did not adopt this container"
        return rec

    # ------------------------------------------------------------------ start

    async def start(self, container_id: str, job_id: str, kind: pb.ContainerKind, argv: Sequence[str],
                    env: Mapping[str, str], workdir: str, gpu_indices: Sequence[int], attempt: int = 0,
                    user: str = "", *, cpus: int = 0, memory_mib: int = 0) -> ContainerRecord:
        """Launch a container, or return the existing record when this id is already known (idempotent).

        Raises GpuBusyError when a GPU is held by another live container, ContainerExistsError when the id
        ran here before and was forgotten. An exec failure is not raised: the record is FAILED_TO_START.
        """
        async with self._lock:
            existing = self._records.get(container_id)
            if existing is not None:
                return existing
            cdir = self.container_dir(container_id)
            if (cdir / RECORD_FILE).exists():
                raise ContainerExistsError(f"container {container_id} already ran on this node")
            in_use = self.gpus_in_use()
            for g in gpu_indices:
                if g in in_use:
                    raise GpuBusyError(g, in_use[g])
            cdir.mkdir(parents=True, exist_ok=True)
            full_argv = container_argv(kind, argv)
            rec = ContainerRecord(
                container_id=container_id, job_id=job_id, kind=kind, state=pb.CONTAINER_STARTING,
                gpu_indices=list(gpu_indices), node_id=self.node_id, attempt=attempt, user=user,
                argv=full_argv, workdir=workdir or str(cdir), start_ms=self._clock_ms(), cpus=cpus,
                memory_mib=memory_mib,
            )
            self._records[container_id] = rec
            self._ended[container_id] = asyncio.Event()
            cwd = Path(rec.workdir)
            proc: subprocess.Popen[bytes] | None = None
            if not full_argv:
                problem = "cannot start: the command is empty"
            elif not cwd.is_dir():
                why = "is not a directory" if cwd.exists() else "does not exist"
                problem = f"cannot start: workdir {cwd} {why}"
            else:
                env_all = container_env(
                    passthrough=self.env_passthrough, agent_env=self._agent_env, launch_env=env,
                    container_id=container_id, node_id=self.node_id, kind=kind, gpu_indices=gpu_indices)
                try:
                    proc = spawn(full_argv, env_all, cwd, cdir / LOG_FILE)
                    problem = ""
                except OSError as exc:
                    problem = describe_exec_error(exc, full_argv[0])
            if proc is None:
                self._fail_to_start(rec, cdir, problem)
                return rec
            rec.pid = rec.pgid = proc.pid  # a session leader's group id is its pid
            rec.state = pb.CONTAINER_RUNNING
            self._procs[container_id] = proc
            log.info("container %s (job %s) started: pid %d, GPUs %s", container_id, job_id, proc.pid,
                     rec.gpu_indices or "none")
            self._changed(rec)
            self._spawn_task(self._watch(rec, proc))
            return rec

    def _fail_to_start(self, rec: ContainerRecord, cdir: Path, problem: str) -> None:
        rec.state = pb.CONTAINER_FAILED_TO_START
        rec.diagnostics = problem
        rec.end_ms = self._clock_ms()
        # Also in the log, so `gpurm logs` shows why nothing ran.
        try:
            with (cdir / LOG_FILE).open("ab") as f:
                f.write(f"gpurm: {problem}\n".encode())
        except OSError:
            pass
        log.warning("container %s (job %s) failed to start: %s", rec.container_id, rec.job_id, problem)
        self._changed(rec)
        self._ended[rec.container_id].set()

    # ------------------------------------------------------------------ exit and stop

    async def _watch(self, rec: ContainerRecord, proc: subprocess.Popen[bytes]) -> None:
        try:
            rc = await wait_for_exit(proc)
        except OSError as exc:  # the pidfd route failed: fall back to a thread blocked in waitpid
            log.warning("container %s: watching its exit through a thread (%s)", rec.container_id, exc)
            rc = await asyncio.to_thread(proc.wait)
        # The group can outlive its leader (a forked child): the container ends when the whole group is gone.
        if group_members(rec.pgid):
            loop = asyncio.get_running_loop()
            kill_at = self._kill_at.get(rec.container_id)
            if kill_at is None:
                signal_group(rec.pgid, signal.SIGTERM)
                kill_at = loop.time() + self.stop_grace_s
            if not await wait_group_gone(rec.pgid, max(0.0, kill_at - loop.time())):
                log.warning("container %s: killing what is left of its process group", rec.container_id)
                if not await kill_group(rec.pgid):
                    log.error("container %s: process group %d survives SIGKILL", rec.container_id, rec.pgid)
        rec.state = pb.CONTAINER_EXITED
        rec.end_ms = self._clock_ms()
        if rc < 0:
            rec.signal = -rc
            rec.exit_code = 0
            what = f"killed by signal {-rc} ({_signame(-rc)})"
        else:
            rec.exit_code = rc
            what = f"exited with code {rc}"
        rec.diagnostics = f"{what} after stop: {rec.stop_reason}" if rec.stopped and rec.stop_reason else what
        self._procs.pop(rec.container_id, None)
        self._kill_at.pop(rec.container_id, None)
        log.info("container %s (job %s) %s", rec.container_id, rec.job_id, rec.diagnostics)
        self._changed(rec)
        self._ended[rec.container_id].set()

    async def stop(self, container_id: str, grace_s: float | None = None,
                   reason: str = "") -> ContainerRecord:
        """SIGTERM the container's process group, SIGKILL it after `grace_s`; returns once it is all gone.

        Idempotent: a second call (or one on an ended container) waits for / returns the same end.
        """
        rec = self._records.get(container_id)
        if rec is None:
            raise UnknownContainerError(f"unknown container {container_id}")
        if rec.terminal:
            return rec
        task = self._stops.get(container_id)
        if task is None:
            grace = self.stop_grace_s if grace_s is None else max(0.0, grace_s)
            rec.stopped = True
            rec.stop_reason = reason or "stop requested"
            self._kill_at[container_id] = asyncio.get_running_loop().time() + grace
            self._persist(rec)
            log.info("container %s: stopping (%s), grace %.1fs", container_id, rec.stop_reason, grace)
            task = asyncio.create_task(self._stop(rec, grace))
            self._stops[container_id] = task
            task.add_done_callback(lambda _t: self._stops.pop(container_id, None))
        await asyncio.shield(task)
        return rec

    async def _stop(self, rec: ContainerRecord, grace_s: float) -> None:
        ended = self._ended[rec.container_id]
        signal_group(rec.pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(ended.wait(), grace_s)
            return
        except TimeoutError:
            pass
        log.info("container %s: grace over, SIGKILL to process group %d", rec.container_id, rec.pgid)
        await kill_group(rec.pgid)
        await ended.wait()

    async def stop_all(self, grace_s: float | None = None,
                       reason: str = "agent shutdown") -> list[ContainerRecord]:
        live = [r.container_id for r in self._records.values() if r.live]
        return list(await asyncio.gather(*(self.stop(cid, grace_s, reason) for cid in live)))

    async def wait_ended(self, container_id: str) -> ContainerRecord:
        """Wait until the container is terminal."""
        rec = self._records.get(container_id)
        if rec is None:
            raise UnknownContainerError(f"unknown container {container_id}")
        await self._ended[container_id].wait()
        return rec

    def forget(self, container_id: str) -> bool:
        """Drop an ended container the RM has acknowledged (its files stay); False if live or unknown."""
        rec = self._records.get(container_id)
        if rec is None or rec.live:
            return False
        del self._records[container_id]
        self._ended.pop(container_id, None)
        return True

    async def close(self) -> None:
        """Stop watching; the processes keep running (keep_on_shutdown)."""
        tasks = list(self._tasks) + list(self._stops.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ logs

    def read_log(self, container_id: str, offset: int, max_bytes: int) -> LogChunk:
        """Up to max_bytes of the output from offset (negative: that many bytes before the end)."""
        cdir = self.container_dir(container_id)
        rec = self._records.get(container_id)
        if rec is None and not (cdir / RECORD_FILE).exists():
            raise UnknownContainerError(f"unknown container {container_id}")
        done = rec is None or rec.terminal  # decided before reading, so done=True means nothing follows
        try:
            with (cdir / LOG_FILE).open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                start = max(0, size + offset) if offset < 0 else min(offset, size)
                f.seek(start)
                data = f.read(max(0, min(max_bytes, size - start)))
        except FileNotFoundError:
            size, start, data = 0, 0, b""
        return LogChunk(data=data, next_offset=start + len(data), size=size, done=done)

    # ------------------------------------------------------------------ internals

    def _changed(self, rec: ContainerRecord) -> None:
        rec.version += 1
        self._persist(rec)
        for listener in list(self._listeners):
            try:
                listener(rec)
            except Exception:
                log.exception("container change listener failed")

    def _persist(self, rec: ContainerRecord) -> None:
        try:
            write_json_atomic(self.containers_dir / rec.container_id / RECORD_FILE, rec.to_json())
        except OSError as exc:
            log.error("cannot write the record of container %s: %s", rec.container_id, exc)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("container watcher failed", exc_info=task.exception())


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
