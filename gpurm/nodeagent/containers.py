"""ContainerSupervisor: the live containers of this node, their exits, stops, logs and records.

The agent owns process state (one authority per fact): a container is live from its spawn until every one of
its processes is gone (its launcher, its command, and whatever they forked, even into another session: found
through the container's cgroup, else its process group and environment marker); then it is terminal and stays
known until the RM acknowledges it (`forget`).

Each container runs under a launcher (`shim.py`) that survives the agent: after a restart, `adopt` finds the
live containers of the previous agent process in their records, watches them again (the launcher's pid,
checked against its start time), and reads the exit code of those that ended meanwhile from `exit.json`.

Why it is over 500 lines: a container's start, watch, stop, adoption and forgetting all act on the same live
record and its processes, under one lock; what stands alone is already out: the launcher (launch.py, shim.py),
cgroups (cgroups.py), whom a container runs as (identity.py), log files (logfiles.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpurm.common.aio import stop_tasks, wait_set
from gpurm.common.gpus import WHOLE_MILLI
from gpurm.common.tls import ENV_CA, ENV_CERT, ENV_KEY, TLSConfig
from gpurm.nodeagent import engine as oci
from gpurm.nodeagent.cgroups import CgroupManager, agent_cgroup_name, share_limits, signal_pids
from gpurm.nodeagent.config import DEFAULT_ENV_PASSTHROUGH, AgentConfig
from gpurm.nodeagent.exits import launcher_tail as _tail
from gpurm.nodeagent.exits import shell_user_error as _shell_user_error
from gpurm.nodeagent.exits import signame as _signame
from gpurm.nodeagent.identity import (
    RefusedUserError,
    RunAs,
    RunAsMode,
    RunAsPolicy,
    UnknownUserError,
    resolve_run_as,
    startup_note,
)
from gpurm.nodeagent.imagerun import ImageRequest, ImageSpec, plan_image_run
from gpurm.nodeagent.launch import (
    LAUNCHER_LOG,
    Handshake,
    container_argv,
    container_env,
    launch_spec,
    mps_pipe_dir,
    read_exit,
    read_handshake,
    share_env,
    spawn_shim,
    wait_for_exit,
    wait_pid_exit,
)
from gpurm.nodeagent.logfiles import append_private, read_range
from gpurm.nodeagent.private import PRIVATE_DIR_MODE, give_to, make_dir, state_dir_mode, write_private
from gpurm.nodeagent.procgroup import MARKER_ENV, container_processes, same_process, start_time, wait_gone
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


WORK_DIR = "work"          # a container's default working directory, inside its container dir
TLS_DIR = "tls"            # an AM container's client certificate (am_tls), private to its user
HANDSHAKE_TIMEOUT_S = 30.0
LAUNCHER_LINGER_S = 2.0    # after SIGKILL to the command: how long the launcher may take to record its exit
KILL_POLL_S = 0.05
UNREPORTED_ENDS_MS = 24 * 3600 * 1000   # ends older than this are not reported again after an agent restart


def leader_first(pids: Iterable[int], leader: int) -> list[int]:
    """The command's own process first, then the rest: were a child killed first, a shell waiting on it could
    exit with 128+9 before its own SIGKILL lands, and the container would read "exited with code 137" rather
    than "killed by SIGKILL"."""
    return sorted(pids, key=lambda p: (p != leader, p))


class ContainerSupervisor:
    def __init__(self, node_id: str, state_dir: Path, *,
                 env_passthrough: Sequence[str] = DEFAULT_ENV_PASSTHROUGH, stop_grace_s: float = 10.0,
                 agent_env: Mapping[str, str] | None = None,
                 clock_ms: Callable[[], int] = now_ms,
                 run_as: RunAsPolicy | RunAsMode = RunAsMode.USER, cgroups: CgroupManager | None = None,
                 log_max_size: int = 0, log_keep: int = 3,
                 node_gpus: int = 0, node_cpus: int = 0, node_memory_mib: int = 0) -> None:
        self.node_id = node_id
        self.containers_dir = state_dir / "containers"
        self.env_passthrough = tuple(env_passthrough)
        self.stop_grace_s = stop_grace_s
        self.run_as = run_as if isinstance(run_as, RunAsPolicy) else RunAsPolicy(mode=run_as)
        self.am_tls: TLSConfig | None = None  # handed to AM containers as files of their user (am_tls)
        self.cgroups = cgroups or CgroupManager.disabled()
        self.log_max_size = log_max_size
        self.log_keep = log_keep
        self.node_gpus, self.node_cpus, self.node_memory_mib = node_gpus, node_cpus, node_memory_mib
        # Ties every process of a container to it, even one that left its group: unique per agent state dir,
        # so two agents on one machine (tests, dev clusters) never mistake each other's containers.
        self.marker_prefix = agent_cgroup_name(node_id, state_dir)
        self._agent_env = dict(os.environ if agent_env is None else agent_env)
        self._clock_ms = clock_ms
        self._records: dict[str, ContainerRecord] = {}
        # Held until exit: a Popen dropped while its process runs lands in subprocess._active, whose reaping
        # on the next Popen would steal the exit status from our watcher.
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ended: dict[str, asyncio.Event] = {}
        self._starting: dict[str, asyncio.Future[None]] = {}
        self._stops: dict[str, asyncio.Task[None]] = {}
        self._kill_at: dict[str, float] = {}  # loop time when a stopping container's processes get SIGKILL
        self._tasks: set[asyncio.Task[None]] = set()
        self._listeners: list[ChangeListener] = []
        self._lock = asyncio.Lock()
        self._cgroup_warned = False
        self.cgroup_root = "off"  # where open() sets cgroups up: auto | off | a cgroup v2 directory
        self.engine: oci.Engine | None = None  # the OCI engine of image jobs (the daemon detects it)
        self.gpu_uuids: dict[int, str] = {}    # GPU index -> UUID (CDI device names, NVIDIA_VISIBLE_DEVICES)
        self._images: dict[str, ImageSpec] = {}          # image learners being started
        self._pulling: dict[str, asyncio.Event] = {}     # set once a start waits on a pull: the caller goes on
        self._pull_cancel: dict[str, asyncio.Event] = {}

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

    def marker(self, container_id: str) -> str:
        return f"{self.marker_prefix}/{container_id}"

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
        """GPU index → the live container holding it (one of them for a shared GPU)."""
        return {g: r.container_id for r in self._records.values() if r.live for g in r.gpu_indices}

    def _busy_for(self, gpu_indices: Sequence[int], share_milli: int) -> tuple[int, str] | None:
        """A GPU the new container cannot have, with a container in its way: any held GPU for a whole-GPU
        container; for a share, a GPU held whole, or one whose shares leave less room than it asks."""
        for g in gpu_indices:
            holders = [r for r in self._records.values() if r.live and g in r.gpu_indices]
            if not holders:
                continue
            if not share_milli or any(not r.share_milli for r in holders) or \
                    sum(r.share_milli for r in holders) + share_milli > WHOLE_MILLI:
                return g, holders[0].container_id
        return None

    def processes(self, container_id: str) -> set[int]:
        """Every live process of a container (launcher included); empty when it is unknown or gone."""
        rec = self._records.get(container_id)
        return self._members(rec) if rec is not None else set()

    def _load_ended(self, container_id: str) -> ContainerRecord | None:
        if not safe_container_id(container_id):
            return None
        rec = read_record(self.containers_dir / container_id)
        if rec is not None and rec.live:
            # Live on disk, unknown here: left by an earlier agent process and not adopted (adopt() not run).
            rec.state = pb.CONTAINER_LOST
            rec.diagnostics = "the agent restarted and did not adopt this container"
        return rec

    # ------------------------------------------------------------------ opening, adoption

    def open(self) -> list[ContainerRecord]:
        """The daemon's start (in the event loop): cgroups under `cgroup_root` (one warning when they cannot
        be used), one line on whom containers run as, then `adopt`. Returns the adopted records."""
        if self.cgroup_root == "off":
            self.cgroups = CgroupManager.disabled()
            log.info("cgroups off (containers.cgroup_root: off): no CPU / memory limits")
        else:
            root = None if self.cgroup_root == "auto" else Path(self.cgroup_root)
            self.cgroups = CgroupManager.setup(root, self.marker_prefix)
            if self.cgroups.warning:
                log.warning("%s", self.cgroups.warning)
            else:
                log.info("containers get cgroups under %s (cpu.max, memory.max in proportion to their GPUs)",
                         self.cgroups.base)
        ok, note = startup_note(self.run_as)
        if ok:
            log.info("%s", note)
        else:
            log.error("%s", note)
        make_dir(self.containers_dir, state_dir_mode())  # each job's user reaches its own dir, lists none
        adopted = self.adopt()
        if adopted:
            log.info("adopted %d containers of the previous agent process (%d still running)", len(adopted),
                     sum(1 for r in adopted if r.state == pb.CONTAINER_RUNNING))
        return adopted


    def adopt(self) -> list[ContainerRecord]:
        """Take over the containers an earlier agent process left live on disk (call once, in the event loop,
        before serving): those still running are watched again, those that ended meanwhile get their exit
        code from exit.json (or are LOST without one). Returns the records taken over."""
        try:
            dirs = sorted(d for d in self.containers_dir.iterdir() if d.is_dir())
        except FileNotFoundError:
            return []
        adopted = []
        recent_ms = int(time.time() * 1000) - UNREPORTED_ENDS_MS
        for cdir in dirs:
            rec = read_record(cdir)
            if rec is None or rec.container_id in self._records:
                continue
            if rec.terminal:
                if not rec.reported and rec.end_ms >= recent_ms:
                    # It ended before the previous agent process could tell an RM (the RM was down, or the
                    # agent died first): owed to the RM still, or its grant would wait out a timeout.
                    self._records[rec.container_id] = rec
                    ended = self._ended[rec.container_id] = asyncio.Event()
                    ended.set()
                    log.info("container %s (job %s): ended (%s) before its end was reported; reporting it",
                             rec.container_id, rec.job_id, rec.diagnostics or "no diagnostics")
                    self._changed(rec)
                continue
            self._records[rec.container_id] = rec
            self._ended[rec.container_id] = asyncio.Event()
            running = rec.shim_pid > 0 and same_process(rec.shim_pid, rec.shim_start)
            if running and rec.state == pb.CONTAINER_STARTING and rec.pid:
                rec.state = pb.CONTAINER_RUNNING
            log.info("container %s (job %s): %s", rec.container_id, rec.job_id,
                     f"adopted, launcher pid {rec.shim_pid}, command pid {rec.pid}" if running
                     else "ended while the agent was down")
            adopted.append(rec)
            self._changed(rec)  # owed to the RM: registration reports it, and its end follows
            self._spawn_task(self._watch(rec, None))
        return adopted

    # ------------------------------------------------------------------ start

    async def start(self, container_id: str, job_id: str, kind: pb.ContainerKind, argv: Sequence[str],
                    env: Mapping[str, str], workdir: str, gpu_indices: Sequence[int], attempt: int = 0,
                    user: str = "", *, cpus: int = 0, memory_mib: int = 0,
                    rightsize: bool = False, share_milli: int = 0, gpu_memory_mib: int = 0,
                    image: ImageSpec | None = None) -> ContainerRecord:
        """Launch a container, or return the existing record when this id is already known (idempotent).

        Raises GpuBusyError when a GPU is held by another live container, ContainerExistsError when the id
        ran here before and was forgotten. An exec failure is not raised: the record is FAILED_TO_START
        (with infra_failure when the fault is the node's: an unknown user, a launcher that died).
        With `image`, the command runs in that OCI image (imagerun.py); a start that must pull the image returns
        the STARTING record once the pull begins, and the container's end follows on the heartbeat.
        """
        async with self._lock:
            existing = self._records.get(container_id)
            if existing is not None:
                pending = self._starting.get(container_id)
                if pending is not None:
                    await asyncio.shield(pending)
                return existing
            cdir = self.container_dir(container_id)
            if (cdir / RECORD_FILE).exists():
                raise ContainerExistsError(f"container {container_id} already ran on this node")
            busy = self._busy_for(gpu_indices, share_milli)
            if busy is not None:
                raise GpuBusyError(*busy)
            make_dir(self.containers_dir, state_dir_mode())
            make_dir(cdir, PRIVATE_DIR_MODE)
            full_argv = container_argv(kind, argv)
            rec = ContainerRecord(
                container_id=container_id, job_id=job_id, kind=kind, state=pb.CONTAINER_STARTING,
                gpu_indices=list(gpu_indices), node_id=self.node_id, attempt=attempt, user=user,
                argv=full_argv, workdir=workdir, start_ms=self._clock_ms(), cpus=cpus, memory_mib=memory_mib,
                rightsize=rightsize, share_milli=share_milli,
                gpu_memory_mib=gpu_memory_mib * share_milli // 1000 if share_milli else 0,
                image=image.image if image else "",
                engine_name=oci.container_name(self.marker_prefix, container_id) if image else "",
            )
            if image is not None:
                self._images[container_id] = image
                self._pulling[container_id] = asyncio.Event()
                self._pull_cancel[container_id] = asyncio.Event()
            self._records[container_id] = rec
            self._ended[container_id] = asyncio.Event()
            started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._starting[container_id] = started
        # The launch (a launcher process and its handshake, ~0.1 s) runs outside the lock, so a gang's
        # containers start side by side; a repeated start of this id waits on `started`. It is a task of its
        # own that the caller only waits for: a caller that goes away (its StartContainer call cancelled, the RM
        # or AM killed mid-call) must not abandon a launcher already spawned, unwatched, its record STARTING
        # for good (its end never seen, and a later stop of it waiting forever).
        launch = asyncio.create_task(self._launch_and_settle(rec, cdir, env, started))
        self._tasks.add(launch)
        launch.add_done_callback(self._launch_done)
        pulling = self._pulling.get(container_id)
        if pulling is None:
            await asyncio.shield(launch)
            return rec
        waiter = asyncio.ensure_future(pulling.wait())
        try:
            await asyncio.wait({launch, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if launch.done() and launch.exception() is not None:
            raise launch.exception()  # type: ignore[misc]
        return rec

    async def _launch_and_settle(self, rec: ContainerRecord, cdir: Path, env: Mapping[str, str],
                                 started: asyncio.Future[None]) -> None:
        try:
            await self._launch(rec, cdir, env)
        finally:
            self._starting.pop(rec.container_id, None)
            for book in (self._images, self._pulling, self._pull_cancel):
                book.pop(rec.container_id, None)
            started.set_result(None)

    def _launch_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:   # also raised to the caller, if still there
            log.error("container launch failed", exc_info=task.exception())

    async def _launch(self, rec: ContainerRecord, cdir: Path, env: Mapping[str, str]) -> None:
        try:
            who = resolve_run_as(rec.user, self.run_as)
        except UnknownUserError as exc:
            self._fail_to_start(rec, cdir, f"cannot start: {exc}", infra=True)
            return
        except RefusedUserError as exc:
            # The job's fault (or the node's policy), not a node failure: no AM should retry it elsewhere.
            self._fail_to_start(rec, cdir, f"cannot start: {exc}")
            return
        rec.run_as = who.user
        if not rec.argv:
            self._fail_to_start(rec, cdir, "cannot start: the command is empty", user=True)
            return
        try:
            extra_env = self._prepare_dir(rec, cdir, who)
        except OSError as exc:
            self._fail_to_start(rec, cdir, f"cannot prepare the container dir {cdir}: {exc.strerror or exc}",
                                infra=True)
            return
        image = self._images.get(rec.container_id)
        if image is not None:
            await self._launch_image(rec, cdir, env, who, image)
            return
        cwd = Path(rec.workdir) if rec.workdir else cdir / WORK_DIR
        rec.workdir = str(cwd)
        if not cwd.is_dir():
            why = "is not a directory" if cwd.exists() else "does not exist"
            self._fail_to_start(rec, cdir, f"cannot start: workdir {cwd} {why}", user=True)
            return
        env_all = container_env(
            passthrough=self.env_passthrough, agent_env=self._agent_env, launch_env=env,
            container_id=rec.container_id, node_id=self.node_id, kind=rec.kind, gpu_indices=rec.gpu_indices)
        if rec.share_milli:
            env_all.update(share_env(rec.share_milli, rec.gpu_memory_mib, mps_pipe_dir(self._agent_env)))
        env_all.update(extra_env)
        if who.switches:
            # A home that does not exist (nobody's /nonexistent) is replaced by the container's work dir.
            home = who.home if who.home and Path(who.home).is_dir() else str(cdir / WORK_DIR)
            for name, value in (("HOME", home), ("USER", who.user), ("LOGNAME", who.user)):
                if name not in env and value:
                    env_all[name] = value
        env_all[MARKER_ENV] = self.marker(rec.container_id)
        gpus = rec.share_milli / 1000 if rec.share_milli else len(rec.gpu_indices)
        limits = share_limits(gpus, self.node_gpus, self.node_cpus, self.node_memory_mib,
                              cpus=rec.cpus, memory_mib=rec.memory_mib)
        cgroup = self.cgroups.create(rec.container_id, limits)
        rec.cgroup = str(cgroup) if cgroup is not None else ""
        spec = launch_spec(argv=rec.argv, env=env_all, cwd=cwd, run_as=who, cgroup=cgroup,
                           log_max_size=self.log_max_size, log_keep=self.log_keep)
        await self._spawn(rec, cdir, spec, who)

    async def _launch_image(self, rec: ContainerRecord, cdir: Path, env: Mapping[str, str], who: RunAs,
                            image: ImageSpec) -> None:
        """An image job's learner: the image here (pulled if need be), then the engine's `run` under the
        launcher, which stays the agent's user; the container runs as the job's uid:gid."""
        env_all = container_env(passthrough=(), agent_env={}, launch_env=env, container_id=rec.container_id,
                                node_id=self.node_id, kind=rec.kind, gpu_indices=rec.gpu_indices)
        gpus = rec.share_milli / 1000 if rec.share_milli else len(rec.gpu_indices)
        limits = share_limits(gpus, self.node_gpus, self.node_cpus, self.node_memory_mib,
                              cpus=rec.cpus, memory_mib=rec.memory_mib)

        def pulling(note: str) -> None:
            rec.diagnostics = note
            with contextlib.suppress(OSError):
                append_private(cdir / LOG_FILE, f"gpurm: {note}\n".encode())
            self._changed(rec)
            event = self._pulling.get(rec.container_id)
            if event is not None:
                event.set()

        req = ImageRequest(image=image.image, argv=rec.argv, workdir=rec.workdir, mounts=image.mounts,
                           shm_size_mib=image.shm_size_mib, name=rec.engine_name, agent_marker=self.marker_prefix,
                           container_id=rec.container_id, job_id=rec.job_id, gpu_indices=rec.gpu_indices)
        plan = await plan_image_run(self.engine, req, who=who, env=env_all, work_dir=cdir / WORK_DIR, limits=limits,
                                    gpu_uuids=self.gpu_uuids, agent_env=self._agent_env, on_pull=pulling,
                                    cancel=self._pull_cancel.get(rec.container_id))
        rec.diagnostics = ""
        if rec.stopped:
            self._fail_to_start(rec, cdir, f"stopped before it started ({rec.stop_reason})")
            return
        if plan.problem:
            self._fail_to_start(rec, cdir, plan.problem, infra=plan.infra, user=plan.user_error)
            return
        uid = who.uid if who.uid is not None else os.geteuid()
        spec = launch_spec(argv=plan.argv, env=plan.client_env, cwd=Path("/"), run_as=RunAs(user=who.user),
                           cgroup=None, log_max_size=self.log_max_size, log_keep=self.log_keep, engine_uid=uid)
        await self._spawn(rec, cdir, spec, who)

    async def _spawn(self, rec: ContainerRecord, cdir: Path, spec: bytes, who: RunAs) -> None:
        try:
            proc, handshake_fd = spawn_shim(cdir, os.environ, spec)
        except OSError as exc:
            self._cleanup_cgroup(rec)
            self._fail_to_start(rec, cdir, f"cannot start the container's launcher: {exc.strerror or exc}",
                                infra=True)
            return
        answer = await asyncio.to_thread(read_handshake, handshake_fd, HANDSHAKE_TIMEOUT_S)
        if answer.cgroup_error:
            self._cgroup_problem(rec, answer)
        if answer.launcher_failed or answer.error:
            if answer.launcher_failed:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
            self._cleanup_cgroup(rec)
            problem = answer.error
            if answer.launcher_failed:
                problem += _tail(cdir / LAUNCHER_LOG)
            self._fail_to_start(rec, cdir, problem, infra=answer.launcher_failed,
                                user=answer.user_error and not answer.launcher_failed)
            return
        rec.pid = answer.pid
        rec.pgid = rec.shim_pid = proc.pid  # the launcher leads the container's session and group
        rec.shim_start = start_time(proc.pid)
        rec.state = pb.CONTAINER_RUNNING
        self._procs[rec.container_id] = proc
        log.info("container %s (job %s) started as %s%s: pid %d, GPUs %s%s", rec.container_id, rec.job_id,
                 who.user, f" (the job's user: {rec.user or 'none'})" if rec.user != who.user else "", rec.pid,
                 rec.gpu_indices or "none", f", cgroup {rec.cgroup}" if rec.cgroup else "")
        self._changed(rec)
        self._spawn_task(self._watch(rec, proc))

    def _prepare_dir(self, rec: ContainerRecord, cdir: Path, who: RunAs) -> dict[str, str]:
        """Hand the container dir to its user: `work/` (the default working directory) and, for an AM under
        mTLS, `tls/` (its client certificate), then the dir itself, all 0700 / 0600 and owned by that user; made
        by the agent before the user owns anything there. Returns env for the container (GPURM_TLS_*)."""
        uid, gid = (who.uid, who.gid) if who.switches else (None, None)
        env: dict[str, str] = {}
        work = cdir / WORK_DIR
        make_dir(work, PRIVATE_DIR_MODE)
        give_to(work, uid, gid)
        if rec.kind == pb.CONTAINER_AM and self.am_tls is not None:
            tdir = cdir / TLS_DIR
            make_dir(tdir, PRIVATE_DIR_MODE)
            tls = self.am_tls
            for name, data, var in (("ca.pem", tls.ca_pem, ENV_CA), ("cert.pem", tls.cert_pem, ENV_CERT),
                                    ("key.pem", tls.key_pem, ENV_KEY)):
                write_private(tdir / name, data, uid, gid)
                env[var] = str(tdir / name)
            give_to(tdir, uid, gid)
        if rec.container_id not in self._images:   # an image job's dir stays the agent's: only work/ is mounted
            give_to(cdir, uid, gid)
        return env

    def _cgroup_problem(self, rec: ContainerRecord, answer: Handshake) -> None:
        if not self._cgroup_warned:
            log.warning("container %s: %s; it runs without its cgroup (further such failures are logged at "
                        "debug level)", rec.container_id, answer.cgroup_error)
            self._cgroup_warned = True
        else:
            log.debug("container %s: %s", rec.container_id, answer.cgroup_error)
        self._cleanup_cgroup(rec)

    def _cleanup_cgroup(self, rec: ContainerRecord) -> None:
        if rec.cgroup and self.cgroups.remove(Path(rec.cgroup)):
            rec.cgroup = ""

    def _fail_to_start(self, rec: ContainerRecord, cdir: Path, problem: str, *, infra: bool = False,
                       user: bool = False) -> None:
        rec.state = pb.CONTAINER_FAILED_TO_START
        rec.diagnostics = problem
        rec.infra_failure = infra
        rec.user_error = user
        rec.end_ms = self._clock_ms()
        # Also in the log, so `gpurm logs` shows why nothing ran.
        with contextlib.suppress(OSError):
            append_private(cdir / LOG_FILE, f"gpurm: {problem}\n".encode())
        log.warning("container %s (job %s) failed to start: %s", rec.container_id, rec.job_id, problem)
        self._changed(rec)
        self._ended[rec.container_id].set()

    # ------------------------------------------------------------------ exit and stop

    def _members(self, rec: ContainerRecord) -> set[int]:
        """The container's live processes. The group is trusted while its leader is our child or verified
        by start time; otherwise its id may have been reused, and only marked members count."""
        trust = rec.container_id in self._procs or (
            rec.shim_pid > 0 and same_process(rec.shim_pid, rec.shim_start))
        return container_processes(rec.pgid, Path(rec.cgroup) if rec.cgroup else None,
                                   self.marker(rec.container_id), trust_group=trust)

    async def _watch(self, rec: ContainerRecord, proc: subprocess.Popen[bytes] | None) -> None:
        cid = rec.container_id
        shim_rc: int | None = None
        if proc is not None:
            try:
                shim_rc = await wait_for_exit(proc)
            except OSError as exc:  # the pidfd route failed: fall back to a thread blocked in waitpid
                log.warning("container %s: watching its exit through a thread (%s)", cid, exc)
                shim_rc = await asyncio.to_thread(proc.wait)
        elif rec.shim_pid > 0:
            await wait_pid_exit(rec.shim_pid, rec.shim_start)
        # Processes can outlive the command (forked, or escaped into their own session): the container ends
        # when all of them are gone.
        if self._members(rec):
            loop = asyncio.get_running_loop()
            kill_at = self._kill_at.get(cid)
            if kill_at is None:
                signal_pids(self._members(rec), signal.SIGTERM)
                kill_at = loop.time() + self.stop_grace_s
            if not await self._wait_members_gone(rec, max(0.0, kill_at - loop.time())):
                log.warning("container %s: killing what is left of its processes", cid)
                if not await self._kill_all(rec):
                    log.error("container %s: processes %s survive SIGKILL", cid, sorted(self._members(rec)))
        self._cleanup_cgroup(rec)
        if rec.engine_name and self.engine is not None:
            await oci.remove(self.engine, rec.engine_name)   # gone already (--rm) unless its launcher was killed
        rc = read_exit(self.container_dir(cid))
        rec.end_ms = self._clock_ms()
        if rc is None and shim_rc is None:
            rec.state = pb.CONTAINER_LOST
            rec.infra_failure = True
            rec.diagnostics = ("ended while the agent was down, and its exit status was not recorded (its "
                               "launcher was killed)")
        else:
            rec.state = pb.CONTAINER_EXITED
            if rc is None:
                assert shim_rc is not None
                rc = shim_rc if shim_rc < 0 else -signal.SIGKILL
                note = " (its exit status was not recorded: its launcher was killed)"
            else:
                note = ""
            if rec.image and rc >= 0:
                rc, engine_says, rec.user_error, rec.infra_failure = oci.image_exit(rc, rec.stopped)
                note = f": {engine_says}{note}" if engine_says else note
            if rc < 0:
                rec.signal = -rc
                rec.exit_code = 0
                what = f"killed by signal {-rc} ({_signame(-rc)})"
            else:
                rec.exit_code = rc
                what = f"exited with code {rc}"
                shell_says = _shell_user_error(rec.argv, rc) if not rec.stopped else ""
                if shell_says:
                    rec.user_error = True
                    what += f": {shell_says}"
            what += note
            rec.diagnostics = f"{what} after stop: {rec.stop_reason}" if rec.stopped and rec.stop_reason else what
        self._procs.pop(cid, None)
        self._kill_at.pop(cid, None)
        log.info("container %s (job %s) %s", cid, rec.job_id, rec.diagnostics)
        self._changed(rec)
        self._ended[cid].set()

    async def _wait_members_gone(self, rec: ContainerRecord, timeout_s: float) -> bool:
        return await wait_gone(lambda: self._members(rec), timeout_s)

    async def _kill_all(self, rec: ContainerRecord, timeout_s: float = 10.0) -> bool:
        """SIGKILL every process of the container until none is left (one may fork while we kill). The
        launcher is spared while anything else lives, so it can record the command's end; it goes too if it
        lingers past LAUNCHER_LINGER_S. False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        alone_since: float | None = None
        while members := self._members(rec):
            others = members - {rec.shim_pid}
            if others:
                alone_since = None
                signal_pids(leader_first(others, rec.pid), signal.SIGKILL)
            else:
                alone_since = alone_since if alone_since is not None else loop.time()
                if loop.time() - alone_since >= LAUNCHER_LINGER_S:
                    signal_pids(members, signal.SIGKILL)
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(KILL_POLL_S)
        return True

    async def stop(self, container_id: str, grace_s: float | None = None,
                   reason: str = "") -> ContainerRecord:
        """SIGTERM every process of the container, SIGKILL after `grace_s`; returns once all are gone.

        Idempotent: a second call (or one on an ended container) waits for / returns the same end.
        """
        rec = self._records.get(container_id)
        if rec is None:
            raise UnknownContainerError(f"unknown container {container_id}")
        pending = self._starting.get(container_id)
        cancel = self._pull_cancel.get(container_id)
        if cancel is not None and pending is not None and not rec.stopped:
            rec.stopped, rec.stop_reason = True, reason or "stop requested"   # a pull in progress ends now
            cancel.set()
        if pending is not None:
            await asyncio.shield(pending)
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
        # The launcher gets the TERM too and ignores it (it must record the exit).
        signal_pids(self._members(rec), signal.SIGTERM)
        if await wait_set(ended, grace_s):
            return
        log.info("container %s: grace over, SIGKILL to its processes", rec.container_id)
        if rec.engine_name and self.engine is not None:
            await oci.kill(self.engine, rec.engine_name)   # the engine's client does not pass SIGKILL on
        await self._kill_all(rec)
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
        rec.reported = True
        self._persist(rec)              # so a restarted agent does not report it again
        del self._records[container_id]
        self._ended.pop(container_id, None)
        return True

    async def close(self) -> None:
        """Stop watching; the processes keep running (keep_on_shutdown), their launchers record their ends
        for the next agent process to adopt."""
        await stop_tasks(list(self._tasks) + list(self._stops.values()))
        self.cgroups.remove_base_if_empty()  # fails, as it should, while kept containers run in it

    # ------------------------------------------------------------------ logs

    def read_log(self, container_id: str, offset: int, max_bytes: int) -> LogChunk:
        """Up to max_bytes of the output from logical offset `offset` (negative: that many bytes before the
        end). Offsets count every byte the container wrote, across rotations; bytes rotated away are skipped
        (next_offset - len(data) is then past `offset`)."""
        cdir = self.container_dir(container_id)
        rec = self._records.get(container_id)
        if rec is None and not (cdir / RECORD_FILE).exists():
            raise UnknownContainerError(f"unknown container {container_id}")
        done = rec is None or rec.terminal  # decided before reading, so done=True means nothing follows
        got = read_range(cdir, offset, max_bytes)
        return LogChunk(data=got.data, next_offset=got.start + len(got.data), size=got.size, done=done)

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


def supervisor_for(cfg: AgentConfig, node_gpus: int) -> ContainerSupervisor:
    """The agent daemon's supervisor, configured from `cfg.containers`; call `open()` once the agent serves
    (it sets up cgroups, logs whom containers run as, and adopts the previous agent process's containers)."""
    cc = cfg.containers
    supervisor = ContainerSupervisor(
        cfg.node_id, cfg.state_dir, env_passthrough=cc.env_passthrough, stop_grace_s=cc.stop_grace_s,
        run_as=cfg.run_as_policy(), log_max_size=cc.log_max_size, log_keep=cc.log_keep,
        node_gpus=node_gpus, node_cpus=cfg.cpus, node_memory_mib=cfg.memory_mib)
    supervisor.cgroup_root = cc.cgroup_root
    supervisor.am_tls = cfg.am_tls
    return supervisor
