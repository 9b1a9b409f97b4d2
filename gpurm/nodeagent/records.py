"""The agent's record of one container, in memory and mirrored to `<state_dir>/containers/<cid>/record.json`.

The JSON file is rewritten atomically on every change so a restarted agent can find the processes it launched
(`ContainerSupervisor.adopt`) and what became of them (`exit.json`, written by the container's launcher).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpurm.nodeagent.logfiles import LOG_FILE
from gpurm.nodeagent.private import open_read, write_private
from gpurm.proto import gpurm_pb2 as pb

__all__ = ["LOG_FILE", "RECORD_FILE", "ContainerRecord", "read_record", "safe_container_id", "write_json_atomic"]

RECORD_FILE = "record.json"
TERMINAL_STATES = frozenset({pb.CONTAINER_EXITED, pb.CONTAINER_FAILED_TO_START, pb.CONTAINER_LOST})
# Container ids become directory names: nothing that could climb out of the containers dir.
_SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}$")


def safe_container_id(container_id: str) -> bool:
    return bool(_SAFE_ID.match(container_id)) and ".." not in container_id


@dataclass
class ContainerRecord:
    container_id: str
    job_id: str
    kind: pb.ContainerKind
    state: pb.ContainerState
    gpu_indices: list[int]
    node_id: str = ""
    attempt: int = 0
    user: str = ""
    argv: list[str] = field(default_factory=list)
    workdir: str = ""
    pid: int = 0
    pgid: int = 0
    exit_code: int = 0
    signal: int = 0
    stopped: bool = False
    stop_reason: str = ""
    diagnostics: str = ""
    infra_failure: bool = False
    user_error: bool = False      # the job's own fault, the same on any node (command not found, no workdir)
    start_ms: int = 0
    end_ms: int = 0
    cpus: int = 0                 # share granted by the token (0: node CPUs * GPUs / node GPUs)
    memory_mib: int = 0
    run_as: str = ""              # the Unix user the command runs as
    shim_pid: int = 0             # the launcher (gpurm.nodeagent.shim): session and group leader = pgid
    shim_start: int = 0           # its start time (/proc/<pid>/stat), so a reused pid is never adopted
    cgroup: str = ""              # the container's cgroup v2 directory, "" without one
    rightsize: bool = False       # its queue has `rightsize: on`: memory.high follows its phases (monitor.py)
    share_milli: int = 0          # a share of its one GPU (thousandths; 0 = whole GPUs): others may share it
    gpu_memory_mib: int = 0       # a shared GPU's memory limit for it (its share of the GPU's memory)
    image: str = ""               # an image job's learner: the OCI image it runs in ("" = a host process)
    engine_name: str = ""         # its name in the engine (labelled with the agent and container id)
    version: int = 0              # bumped on every change; the heartbeat's pending set compares it
    reported: bool = False        # its end reached an RM (acknowledged): a restarted agent need not report it

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def live(self) -> bool:
        return not self.terminal

    def to_proto(self) -> pb.ContainerStatus:
        return pb.ContainerStatus(
            container_id=self.container_id, job_id=self.job_id, kind=self.kind, state=self.state,
            pid=self.pid, exit_code=self.exit_code, signal=self.signal, stopped=self.stopped,
            diagnostics=self.diagnostics, start_ms=self.start_ms, end_ms=self.end_ms,
            gpu_indices=self.gpu_indices, node_id=self.node_id, infra_failure=self.infra_failure,
            user_error=self.user_error,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = pb.ContainerKind.Name(self.kind)
        data["state"] = pb.ContainerState.Name(self.state)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContainerRecord:
        values = dict(data)
        values["kind"] = pb.ContainerKind.Value(values["kind"])
        values["state"] = pb.ContainerState.Value(values["state"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in values.items() if k in known})


def write_json_atomic(path: Path, data: object) -> None:
    """Write via a temp file and rename, so a reader (or a restarted agent) never sees half a file.

    No fsync: after a power loss the containers are gone too, so a lost record costs nothing.
    The file is 0600 and written through a new temp file (O_EXCL | O_NOFOLLOW): a container dir belongs to the
    job's user, and a symlink planted there must never make the agent write elsewhere.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    write_private(tmp, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    os.replace(tmp, path)


def read_record(container_dir: Path) -> ContainerRecord | None:
    """The record in a container dir; None when missing, damaged, a symlink, written by someone else than the
    agent's user (the dir's owner, a job's user, could forge one) or naming another container."""
    try:
        fd = open_read(container_dir / RECORD_FILE)
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.geteuid():
                return None
            rec = ContainerRecord.from_json(json.loads(f.read()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rec if rec.container_id == container_dir.name else None
