"""Compiled builds of the scheduling hot paths, used only while they match the sources.

The simulator replays tens of thousands of jobs through the real RM core, queue math and AM planner; interpreted,
that is about twice too slow. `python -m gpurm.native.build` (run by ./scripts/setup-venv) compiles the modules in
`MODULES` with mypyc, the same sources, into `.native/` at the repository root, with a stamp of the sources' hashes.

Each of those packages' `__init__` calls `extend_path`: when the stamp matches the sources on disk (and the build is
for this interpreter), the compiled modules' folder goes first on the package's `__path__`, so they are imported
instead of the .py files; otherwise nothing changes and everything runs interpreted, only slower. An edited
source therefore never runs stale compiled code. `GPURM_NATIVE=0` turns the compiled modules off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# The modules compiled, as (package, module file). Chosen by profile: the simulator spends its time here.
MODULES: tuple[tuple[str, str], ...] = (
    ("queues", "fairshare.py"), ("queues", "tree.py"),
    ("rm", "admission.py"), ("rm", "amlaunch.py"), ("rm", "attempts.py"), ("rm", "cluster.py"),
    ("rm", "containers.py"), ("rm", "core.py"), ("rm", "inqueue.py"), ("rm", "messages.py"), ("rm", "model.py"),
    ("rm", "nodes.py"), ("rm", "preemption.py"), ("rm", "priority.py"), ("rm", "queuebook.py"), ("rm", "reclaim.py"),
    ("rm", "scheduler.py"), ("rm", "sortedkeys.py"), ("rm", "standing.py"), ("rm", "stops.py"),
    ("am", "master.py"), ("am", "placement.py"),
    ("sim", "engine.py"),
)
BUILD_REWRITE = ("native", "dataclass_inits.py")   # what the build does to their copies (see there)
GROUP = "gpurm_native"                 # mypyc's shared library: .native/shared/gpurm_native__mypyc.*.so
ROOT = Path(__file__).resolve().parent.parent
NATIVE_DIR = ROOT / ".native"
LIB_DIR = NATIVE_DIR / "lib"           # lib/gpurm/rm/core.*.so ...: reached through the packages' __path__ only
# The shared library the compiled modules import as a top-level module. Its own folder goes on sys.path: were
# lib/ there, its gpurm/ folder would turn gpurm.rm ... into namespace packages hiding the real ones.
SHARED_DIR = NATIVE_DIR / "shared"
STAMP = NATIVE_DIR / "stamp.json"


@dataclass(frozen=True)
class Status:
    active: bool
    reason: str                        # why not, or what is in use


def source_hashes() -> dict[str, str]:
    """sha256 of each compiled module's source, and of the build's rewriting of them, keyed "package/file"."""
    return {f"{pkg}/{name}": hashlib.sha256((ROOT / pkg / name).read_bytes()).hexdigest()
            for pkg, name in (*MODULES, BUILD_REWRITE)}


def build_key() -> dict[str, object]:
    """What a build must match besides the sources: the interpreter it was compiled for."""
    return {"python": sys.implementation.cache_tag, "platform": sys.platform}


def stamp_matches() -> bool:
    """Whether .native/stamp.json was written for these sources and this interpreter (False if missing)."""
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp.get("key") == build_key() and stamp.get("sources") == source_hashes())


@functools.cache
def status() -> Status:
    """Whether the compiled modules are in use in this process (decided once, at the first import)."""
    if os.environ.get("GPURM_NATIVE", "1") == "0":
        return Status(False, "off (GPURM_NATIVE=0)")
    if not STAMP.exists():
        return Status(False, "not built (./scripts/setup-venv builds it)")
    try:
        fresh = stamp_matches()
    except OSError as exc:
        return Status(False, f"sources unreadable: {exc}")
    if not fresh:
        return Status(False, "stale: the sources changed since the build (./scripts/setup-venv rebuilds it)")
    shared = str(SHARED_DIR)
    if shared not in sys.path:
        sys.path.append(shared)
    return Status(True, f"compiled ({len(MODULES)} modules, mypyc)")


def extend_path(path: list[str], package: str) -> list[str]:
    """The package's `__path__`, with the compiled modules' folder first when they are in use."""
    st = status()
    if not st.active:
        log.debug("%s: interpreted (%s)", package, st.reason)
        return path
    return [str(LIB_DIR.joinpath(*package.split("."))), *path]
