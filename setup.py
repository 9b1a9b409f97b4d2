"""Build hook: compiles the scheduling hot paths with mypyc when the wheel is built.

`pip install .`, `pip install -e .` and `./scripts/setup-venv` all come through here, so they give the same
compiled modules. The simulator replays tens of thousands of jobs through the real RM core, queue math and AM
planner; interpreted, that is about twice too slow. Everything else (the metadata, the packages) is in
pyproject.toml.

The build is pure Python, with a warning, when mypyc is missing, when there is no C compiler (each extension is
optional: one that fails to compile leaves its .py in charge), or when GPURM_PURE=1 asks for it. `gpurm version`
says which build runs. The build writes gpurm/native/build.json (the modules, their sources' sha256) so that
`gpurm version` and the suite can tell a compiled module that no longer matches an edited source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

log = logging.getLogger("gpurm.setup")
ROOT = Path(__file__).resolve().parent

# The modules compiled, chosen by profile: the simulator spends its time here.
COMPILED = (
    "gpurm/common/gpus.py", "gpurm/common/model.py",
    "gpurm/queues/fairshare.py", "gpurm/queues/tree.py",
    "gpurm/rm/state/admission.py", "gpurm/rm/state/agentreports.py", "gpurm/rm/state/allocate.py",
    "gpurm/rm/state/amlaunch.py", "gpurm/rm/state/attempts.py", "gpurm/rm/state/granting.py",
    "gpurm/rm/state/lifecycle.py", "gpurm/rm/state/timers.py", "gpurm/rm/state/backfilling.py",
    "gpurm/rm/state/planview.py",
    "gpurm/rm/state/cluster.py", "gpurm/rm/state/containers.py", "gpurm/rm/state/core.py",
    "gpurm/rm/state/messages.py", "gpurm/rm/state/nodes.py", "gpurm/rm/state/queuebook.py",
    "gpurm/rm/state/sortedkeys.py", "gpurm/rm/state/stops.py",
    "gpurm/rm/sched/inqueue.py", "gpurm/rm/sched/preemption.py", "gpurm/rm/sched/priority.py",
    "gpurm/rm/sched/reclaim.py", "gpurm/rm/sched/scheduler.py", "gpurm/rm/sched/standing.py",
    "gpurm/rm/sched/history.py", "gpurm/rm/sched/reservations.py", "gpurm/rm/sched/waiting.py",
    "gpurm/rm/sched/backfill.py", "gpurm/rm/sched/gittins.py",
    "gpurm/am/acquire.py", "gpurm/am/attempts.py", "gpurm/am/launch.py", "gpurm/am/levels.py", "gpurm/am/master.py",
    "gpurm/am/placement.py", "gpurm/am/records.py", "gpurm/am/resize.py", "gpurm/am/waiting.py",
    "gpurm/sim/agents.py", "gpurm/sim/amshell.py", "gpurm/sim/clock.py", "gpurm/sim/clusterview.py",
    "gpurm/sim/engine.py", "gpurm/sim/failures.py", "gpurm/sim/options.py", "gpurm/sim/progress.py",
    "gpurm/sim/recorder.py", "gpurm/sim/simam.py", "gpurm/sim/waking.py",
)
GROUP = "gpurm_native"      # mypyc's shared runtime library: gpurm_native__mypyc.*.so, next to gpurm/
BUILD_INFO = "gpurm/native/build.json"


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def drop_stale_build() -> None:
    """Remove an earlier build's compiled modules from the source tree (an editable install loads them from there):
    a pure build must not leave them to be imported beside sources they no longer match, nor without the shared
    library they call."""
    for path in COMPILED:
        for so in (ROOT / path).parent.glob(Path(path).stem + ".*.so"):
            so.unlink(missing_ok=True)
    for so in ROOT.glob(f"{GROUP}__mypyc.*.so"):
        so.unlink(missing_ok=True)
    (ROOT / BUILD_INFO).unlink(missing_ok=True)


def compiled_extensions() -> list[Any]:
    if os.environ.get("GPURM_PURE") == "1":
        log.warning("GPURM_PURE=1: building gpurm as pure Python")
        drop_stale_build()
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        log.warning("mypyc is not installed: building gpurm as pure Python (slower)")
        drop_stale_build()
        return []
    # The sources as mypyc reads them now: build.json must name what was compiled, not a file edited during the
    # minutes the build takes (that module would run as built while `gpurm version` called it current).
    BuildExt.source_hashes = {module_name(p): hashlib.sha256((ROOT / p).read_bytes()).hexdigest() for p in COMPILED}
    try:
        extensions: list[Any] = mypycify(list(COMPILED), opt_level="3", multi_file=True, group_name=GROUP)
    except (SystemExit, Exception) as exc:     # mypyc exits on a type error: still install, interpreted
        log.warning("mypyc could not compile gpurm (%s): building it as pure Python (slower)", exc)
        drop_stale_build()
        return []
    for ext in extensions:
        ext.optional = True     # no C compiler: a warning, and that module stays pure Python
    return extensions


class BuildExt(build_ext):
    """build_ext that keeps only what this build compiled, and records it for `gpurm version` and the suite."""

    source_hashes: dict[str, str] = {}     # module -> sha256 of the source mypyc compiled (compiled_extensions)

    def initialize_options(self) -> None:
        super().initialize_options()
        self.compiled_now: set[str] = set()

    def build_extension(self, ext: Any) -> None:
        super().build_extension(ext)    # raises when it fails (then, ext being optional, only a warning)
        self.compiled_now.add(ext.name)

    def run(self) -> None:
        super().run()
        compiled = {module_name(p): module_name(p) in self.compiled_now for p in COMPILED}
        if f"{GROUP}__mypyc" not in self.compiled_now:
            # Every compiled module imports the shared library: without it, none of them may stay.
            if any(compiled.values()):
                log.warning("mypyc's shared library did not build: gpurm is installed as pure Python")
            compiled = dict.fromkeys(compiled, False)
        for name, done in [*compiled.items(), (f"{GROUP}__mypyc", any(compiled.values()))]:
            if not done:                # an earlier build's module must not outlive its source's change
                Path(self.get_ext_fullpath(name)).unlink(missing_ok=True)
        info = {"group": GROUP, "modules": {
            name: {"source_sha256": self.source_hashes.get(name)
                   or hashlib.sha256((ROOT / path).read_bytes()).hexdigest(), "compiled": compiled[name]}
            for name, path in zip(compiled, COMPILED, strict=True)}}
        where = ROOT if self.inplace else Path(self.build_lib)
        (where / BUILD_INFO).parent.mkdir(parents=True, exist_ok=True)
        (where / BUILD_INFO).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": BuildExt})
