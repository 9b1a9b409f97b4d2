"""A container's output files: `output.log` rotated by size to `output.log.1` ... `output.log.<keep>`.

Offsets are *logical*: the number of bytes the container wrote before that byte, across rotations, so a reader
(`gpurm logs`, the MQTT stream) never sees an offset go back. `output.log.index` says which file is current
(its inode) and at which logical offset it starts; the writer (the container's launcher, `shim.py`) rewrites
it after every rotation, and a reader that finds it naming another inode than the `output.log` it opened
caught a rotation half done and reads again.

The files are 0600, written by the launcher as the container's user; the agent (root) reads them never through
a symlink (the container dir is the user's).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpurm.nodeagent.private import PRIVATE_FILE_MODE, open_append, open_read

LOG_FILE = "output.log"
INDEX_FILE = "output.log.index"


@dataclass(frozen=True)
class LogRange:
    data: bytes
    start: int          # logical offset of data[0] (after `offset` when older bytes were rotated away)
    size: int           # logical end of the output so far


class LogWriter:
    """Appends to output.log and rotates it once it reaches `max_size` (0 = never)."""

    def __init__(self, cdir: Path, max_size: int = 0, keep: int = 3) -> None:
        self.cdir = cdir
        self.max_size = max_size
        self.keep = keep
        self.base = 0
        self._fd = -1
        self._size = 0
        self._open()

    def _open(self) -> None:
        path = self.cdir / LOG_FILE
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
        st = os.fstat(self._fd)
        self._size = st.st_size
        old = _read_index(self.cdir)
        if old is not None and old[0] == st.st_ino:
            self.base = old[1]
        self._write_index(st.st_ino)

    def _write_index(self, ino: int) -> None:
        tmp = self.cdir / f".{INDEX_FILE}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"ino": ino, "base": self.base}))
        os.replace(tmp, self.cdir / INDEX_FILE)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
            self._size += n
        if self.max_size and self._size >= self.max_size:
            self.rotate()

    def rotate(self) -> None:
        os.close(self._fd)
        path = self.cdir / LOG_FILE
        if self.keep > 0:
            for k in range(self.keep - 1, 0, -1):  # oldest first, so a reader never meets a wrong .k
                src = self.cdir / f"{LOG_FILE}.{k}"
                if src.exists():
                    os.replace(src, self.cdir / f"{LOG_FILE}.{k + 1}")
            os.replace(path, self.cdir / f"{LOG_FILE}.1")
        else:
            path.unlink(missing_ok=True)
        self.base += self._size
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW,
                           PRIVATE_FILE_MODE)
        self._size = 0
        self._write_index(os.fstat(self._fd).st_ino)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def append_private(path: Path, data: bytes) -> None:
    """Append to a log file (created 0600), never through a symlink."""
    fd = open_append(path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _open(path: Path) -> BinaryIO:
    return os.fdopen(open_read(path), "rb")


def _read_index(cdir: Path) -> tuple[int, int] | None:
    try:
        with _open(cdir / INDEX_FILE) as f:
            data = json.loads(f.read())
        return int(data["ino"]), int(data["base"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_range(cdir: Path, offset: int, max_bytes: int) -> LogRange:
    """Up to `max_bytes` from logical `offset` (negative: that many bytes before the end). Bytes rotated away
    are skipped: `start` is then later than `offset`."""
    for _ in range(20):
        got = _try_read(cdir, offset, max_bytes)
        if got is not None:
            return got
        time.sleep(0.005)  # a rotation is half done: it takes microseconds
    return LogRange(b"", max(offset, 0), max(offset, 0))


def logical_size(cdir: Path) -> int:
    return read_range(cdir, 0, 0).size


def _try_read(cdir: Path, offset: int, max_bytes: int) -> LogRange | None:
    index = _read_index(cdir)
    try:
        f = _open(cdir / LOG_FILE)
    except FileNotFoundError:
        return LogRange(b"", 0, 0) if index is None else None
    except OSError:  # a symlink planted in the container dir: nothing is read through it
        return LogRange(b"", 0, 0)
    with f:
        st = os.fstat(f.fileno())
        if index is not None and index[0] != st.st_ino:
            return None
        base = index[1] if index is not None else 0
        size = base + st.st_size
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        if max_bytes <= 0 or start >= size:
            return LogRange(b"", start, size)
        if start >= base:
            f.seek(start - base)
            return LogRange(f.read(min(max_bytes, size - start)), start, size)
    # The range begins in rotated files: walk back from output.log.1 until it is covered (or files run out).
    files: list[tuple[Path, int]] = []   # (path, logical start), newest first
    end = base
    k = 1
    while end > start:
        p = cdir / f"{LOG_FILE}.{k}"
        try:
            n = p.lstat().st_size
        except FileNotFoundError:
            break
        files.append((p, end - n))
        end -= n
        k += 1
    out = bytearray()
    first = start
    for p, fstart in reversed(files):
        if not out:
            first = max(start, fstart)
        try:
            with _open(p) as rf:
                rf.seek(max(0, first + len(out) - fstart))
                out += rf.read(max_bytes - len(out))
        except OSError:
            return None
        if len(out) >= max_bytes:
            break
    if len(out) < max_bytes:
        try:
            with _open(cdir / LOG_FILE) as cf:
                if os.fstat(cf.fileno()).st_ino != st.st_ino:
                    return None
                if not out:
                    first = base
                cf.seek(max(0, first + len(out) - base))
                out += cf.read(max_bytes - len(out))
        except OSError:
            return None
    if _read_index(cdir) != index:
        return None  # rotated while we read: the files moved under us
    return LogRange(bytes(out), first, size)
