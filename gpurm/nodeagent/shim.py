"""`python -m gpurm.nodeagent.shim CONTAINER_DIR HANDSHAKE_FD SPEC_FD`: the launcher that stands between the
agent and a container's command, and outlives the agent.

The agent starts it as a session leader (the container's process group is the shim's); the shim, still the
agent's user:

1. reads the launch spec (argv, env, workdir, user / groups, cgroup, log rotation) from SPEC_FD (an unnamed
   file: nothing in the container dir, which belongs to the job's user, can change it);
2. joins the container's cgroup, so the command and all it forks start inside it;
3. refuses to go on as uid 0 (the agent's own check comes first; this is the second), then becomes the
   container's user (setgroups / setgid / setuid) when asked, so every file it writes from here on is that
   user's and no symlink in the container dir can make it write elsewhere; for an image job's learner the
   command is the OCI engine's `run` (engine.py), which stays the agent's user, and the container's own user
   (`engine_uid`) must not be 0 instead (the container dir then stays the agent's: only `work/` is the user's);
4. starts the command, its stdout and stderr a pipe the shim reads;
5. tells the agent on HANDSHAKE_FD: `{"pid": N}` or `{"error": "...", "errno": E}` (exec failed, refused),
   with `"user_error": true` when exec failed for the job's own reason (command not found or not executable,
   workdir missing): retrying it anywhere would fail the same way;
6. copies the output into output.log (0600), rotating it by size (`logfiles.LogWriter`);
7. when the command ends, writes `exit.json` (`{"returncode": rc}`, negative = killed by that signal) and exits.

Because the shim, not the agent, holds the pipe and waits for the command, an agent that is killed or
upgraded costs the container nothing: the restarted agent adopts it and still learns its exit code from
`exit.json`. SIGTERM / SIGINT / SIGHUP sent to the process group do not stop the shim (it must record the
exit); the handlers it installs are reset by exec, so the command gets default dispositions.
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpurm.nodeagent.logfiles import LogWriter

EXIT_FILE = "exit.json"
# exec failures that are the job's own (its command or workdir), the same on every node and every retry
USER_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ENOEXEC, errno.EISDIR})
DRAIN_S = 0.2       # after the command's exit: read what is still buffered, not what stragglers write later


def _ignore(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: ignored dispositions survive exec, handlers do not."""


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data) + "\n")
    os.replace(tmp, path)


def become(uid: int | None, gid: int | None, groups: list[int] | None, engine_uid: int | None = None) -> str:
    """Refuse root, then drop to the container's user (uid None: stay the agent's). '' or why not.
    `engine_uid`: the command is an OCI engine's `run`, which stays the agent's user; the container's own user,
    that uid, is the one that must not be root."""
    if engine_uid is not None:
        if uid is not None or engine_uid == 0:
            return "refused: an image container never runs as root (uid 0)"
        return ""
    target = os.geteuid() if uid is None else uid
    if target == 0:
        return ("refused: the launcher never runs a command as root (uid 0); run as a user with uid >= 1000, "
                "or set containers.min_uid in agent.yaml")
    if uid is None:
        return ""
    try:
        os.setgroups(groups if groups is not None else [])
        if gid is not None:
            os.setgid(gid)
        os.setuid(uid)
    except OSError as exc:
        return f"cannot switch to uid {uid}: {exc.strerror or exc}"
    if os.getuid() == 0 or os.geteuid() == 0:
        return "refused: still root after switching user"
    return ""


def describe_exec_error(exc: OSError, program: str, cwd: str = "", path: str | None = None) -> str:
    """One line saying why `program` (to run in `cwd`, looked up in `path` when it has no '/') could not be
    started. A PATH entry the user may not enter makes exec say EACCES for a command that is nowhere."""
    if exc.errno == errno.ENOENT and cwd and exc.filename == cwd:
        return f"cannot start: workdir {cwd} does not exist"
    if exc.errno in (errno.EACCES, errno.EPERM) and cwd and exc.filename == cwd:
        return f"cannot start: workdir {cwd} is not accessible to the container's user"
    if exc.errno == errno.ENOENT or (exc.errno in (errno.EACCES, errno.EPERM) and path is not None
                                     and "/" not in program and shutil.which(program, path=path) is None):
        return f"cannot start {program!r}: command not found"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"cannot start {program!r}: permission denied"
    if exc.errno == errno.ENOEXEC:
        return f"cannot start {program!r}: not an executable format"
    return f"cannot start {program!r}: {exc.strerror or exc}"


def run(cdir: Path, handshake_fd: int, spec_fd: int) -> int:
    with os.fdopen(spec_fd, "rb") as f:
        spec: dict[str, Any] = json.loads(f.read())
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    answer: dict[str, Any] = {}
    cgroup = spec.get("cgroup") or ""
    if cgroup:
        try:
            Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
            answer["cgroup"] = cgroup
        except OSError as exc:
            answer["cgroup_error"] = f"cannot join cgroup {cgroup}: {exc.strerror or exc}"
    refused = become(spec.get("uid"), spec.get("gid"), spec.get("groups"), spec.get("engine_uid"))
    if refused:
        answer.update(error=f"cannot start: {refused}", errno=errno.EPERM)
        os.write(handshake_fd, (json.dumps(answer) + "\n").encode())
        return 126
    writer = LogWriter(cdir, int(spec.get("log_max_size", 0)), int(spec.get("log_keep", 3)))
    r, w = os.pipe()
    argv: list[str] = spec["argv"]
    try:
        proc = subprocess.Popen(
            argv, env=spec["env"], cwd=spec["cwd"], stdin=subprocess.DEVNULL, stdout=w, stderr=w,
            close_fds=True)
    except OSError as exc:
        why = describe_exec_error(exc, argv[0] if argv else "", spec["cwd"], spec["env"].get("PATH", os.defpath))
        answer.update(error=why, errno=exc.errno or 0, user_error=exc.errno in USER_ERRNOS)
        os.write(handshake_fd, (json.dumps(answer) + "\n").encode())
        return 127
    finally:
        os.close(w)
    answer["pid"] = proc.pid
    try:
        os.write(handshake_fd, (json.dumps(answer) + "\n").encode())
        os.close(handshake_fd)
    except OSError:
        pass  # the agent died while we started: the command runs anyway, a new agent adopts it
    rc = _pump(proc, r, writer)
    writer.close()
    _write_json(cdir / EXIT_FILE, {"returncode": rc, "pid": proc.pid, "end_ms": int(time.time() * 1000)})
    return rc if rc >= 0 else 128 - rc


def _pump(proc: subprocess.Popen[bytes], r: int, writer: LogWriter) -> int:
    """Copy output until the command has exited and its pipe is drained (or only stragglers hold it)."""
    os.set_blocking(r, False)
    sel = selectors.DefaultSelector()
    sel.register(r, selectors.EVENT_READ)
    pidfd = -1
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pass
    rc: int | None = None
    deadline = 0.0
    pipe_open = True
    while True:
        if rc is None:
            rc = proc.poll()
            if rc is not None:
                deadline = time.monotonic() + DRAIN_S
        if rc is not None and (not pipe_open or time.monotonic() >= deadline):
            break
        timeout = 0.5 if pidfd < 0 else None
        if rc is not None:
            timeout = max(0.0, deadline - time.monotonic())
        for key, _ in sel.select(timeout):
            if key.fd == pidfd:
                sel.unregister(pidfd)
                os.close(pidfd)
                pidfd = -1
                continue
            for _ in range(64):  # bounded: a straggler that writes without pause must not hold us here
                try:
                    data = os.read(r, 65536)
                except BlockingIOError:
                    break
                except InterruptedError:
                    continue
                if not data:
                    pipe_open = False
                    sel.unregister(r)
                    break
                try:
                    writer.write(data)
                except OSError:
                    pass  # disk full: the command keeps running, its output is lost
        if pidfd < 0 and rc is None and not pipe_open:
            rc = proc.wait()
            deadline = time.monotonic()
    if pidfd >= 0:
        os.close(pidfd)
    os.close(r)
    return rc


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: python -m gpurm.nodeagent.shim CONTAINER_DIR HANDSHAKE_FD SPEC_FD\n")
        return 2
    return run(Path(argv[0]), int(argv[1]), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
