"""How a container's end reads: a shell's own exit codes, the launcher's last words, signal names."""

from __future__ import annotations

import os
import signal
from pathlib import Path

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def shell_user_error(argv: list[str], rc: int) -> str:
    """Why a shell command's exit is the job's own fault, or "": a shell exits 127 when it cannot find the
    command and 126 when it cannot run it (POSIX), and a retry, here or elsewhere, would do the same."""
    if len(argv) < 3 or os.path.basename(argv[0]) not in SHELLS or argv[1] != "-c":
        return ""
    if rc == 127:
        return "the shell could not find the command (see its output)"
    if rc == 126:
        return "the shell found the command but could not run it (not executable?)"
    return ""


def launcher_tail(path: Path, max_bytes: int = 2000) -> str:
    """The end of the launcher's own error output, for a diagnostic ('' when it wrote nothing)."""
    try:
        data = path.read_bytes()[-max_bytes:].decode(errors="replace").strip()
    except OSError:
        return ""
    lines = [ln for ln in data.splitlines() if ln.strip()]
    return f": {lines[-1]}" if lines else ""


def signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
