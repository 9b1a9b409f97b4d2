"""Files and folders the agent (often root) makes for itself and for a container's user, safely.

A container dir belongs to its job's user (0700), who may plant symlinks in it; the agent, as root, must never
follow one. So every file the agent writes there is created with O_EXCL | O_NOFOLLOW (or appended with
O_NOFOLLOW) and handed over with fchown; a folder that turns out to be a symlink or someone else's is refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR_MODE = 0o700     # a container dir, its work/ and tls/, the agent's own folders
TRAVERSE_DIR_MODE = 0o711    # the state dir and containers/: each user reaches its own container dir, lists none
PRIVATE_FILE_MODE = 0o600


def state_dir_mode(euid: int | None = None) -> int:
    """The agent's state dir and containers/: 0711 for a root agent (each job's user must reach its own container
    dir below), else 0700 (its jobs run as the agent itself)."""
    return TRAVERSE_DIR_MODE if (os.geteuid() if euid is None else euid) == 0 else PRIVATE_DIR_MODE


class UnsafePathError(OSError):
    """A path the agent was to create or write is a symlink or not a folder."""


def make_dir(path: Path, mode: int) -> None:
    """Create `path` (and missing parents, 0700) unless it exists as a real folder; then set `mode`. Raises
    UnsafePathError when it is a symlink or not a folder, OSError when it cannot be made."""
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} is not a folder (a symlink or a file)")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode, follow_symlinks=False)


def give_to(path: Path, uid: int | None, gid: int | None) -> None:
    """chown without following a symlink; nothing when uid is None (the agent's own user keeps it)."""
    if uid is not None:
        os.chown(path, uid, -1 if gid is None else gid, follow_symlinks=False)


def write_private(path: Path, data: bytes, uid: int | None = None, gid: int | None = None) -> None:
    """A new file, 0600, owned by uid/gid (when given): fails when anything exists at `path` already."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        if uid is not None:
            os.fchown(fd, uid, -1 if gid is None else gid)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def open_append(path: Path) -> int:
    """An fd appending to `path` (created 0600), never through a symlink, and only to a plain file (a FIFO planted
    there would block the agent: O_NONBLOCK makes that open fail instead)."""
    return _plain(path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
                                | os.O_NONBLOCK, PRIVATE_FILE_MODE))


def open_read(path: Path) -> int:
    """An fd reading `path`, never through a symlink (ELOOP when it is one), and only a plain file."""
    return _plain(path, os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK))


def _plain(path: Path, fd: int) -> int:
    """`fd` back in blocking mode when it is a plain file; otherwise closed, and UnsafePathError."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path} is not a plain file")
    os.set_blocking(fd, True)
    return fd
