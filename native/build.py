"""Compile the hot modules (gpurm.native.MODULES) with mypyc into .native/, unless the build there is fresh.

    python -m gpurm.native.build           # build if the sources changed (a no-op otherwise)
    python -m gpurm.native.build --force   # build anyway

mypyc needs every module it compiles laid out under its real name (gpurm.rm.core ...), so the sources are copied
into a scratch tree shaped like the installed namespace; only the built libraries are kept. Exit 0 when the
compiled modules are fresh afterwards, 1 when building failed (gpurm still works, interpreted).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from gpurm.native import (
    GROUP,
    LIB_DIR,
    MODULES,
    NATIVE_DIR,
    ROOT,
    SHARED_DIR,
    STAMP,
    build_key,
    source_hashes,
    stamp_matches,
)
from gpurm.native.dataclass_inits import write_inits

# Every package a compiled module imports from must be in the scratch tree for mypy to type it.
PACKAGES = ("proto", "queues", "rm", "am", "nodeagent", "sim", "cli", "native")

SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(name="gpurm-native", ext_modules=mypycify({paths!r}, opt_level="3", multi_file=True, group_name={group!r}))
"""


def build() -> None:
    sources = source_hashes()                  # taken first: an edit during the build leaves the stamp stale
    with tempfile.TemporaryDirectory(prefix="gpurm-native-") as tmp:
        scratch = Path(tmp)
        for pkg in PACKAGES:
            shutil.copytree(ROOT / pkg, scratch / "gpurm" / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        shutil.copy(ROOT / "pyproject.toml", scratch / "pyproject.toml")     # the mypy settings
        for pkg, name in MODULES:
            copy = scratch / "gpurm" / pkg / name
            copy.write_text(write_inits(copy.read_text()))
        paths = [f"gpurm/{pkg}/{name}" for pkg, name in MODULES]
        (scratch / "setup.py").write_text(SETUP.format(paths=paths, group=GROUP))
        jobs = str(max(1, len(os.sched_getaffinity(0))))
        cmd = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", "out", "--build-temp", "tmp", "-j", jobs]
        done = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"mypyc failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
        built = sorted((scratch / "out").rglob("*.so"))
        if len(built) != len(MODULES) + 1:
            raise RuntimeError(f"mypyc built {len(built)} libraries, expected {len(MODULES) + 1}")
        new_lib, new_shared = NATIVE_DIR / "lib.new", NATIVE_DIR / "shared.new"
        for d in (new_lib, new_shared):
            shutil.rmtree(d, ignore_errors=True)
        for so in built:
            rel = so.relative_to(scratch / "out")
            dest = (new_lib / rel) if rel.parts[0] == "gpurm" else (new_shared / rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, dest)
    STAMP.unlink(missing_ok=True)              # no stamp while the libraries change: nobody loads a half swap
    for new, final in ((new_lib, LIB_DIR), (new_shared, SHARED_DIR)):
        shutil.rmtree(final, ignore_errors=True)
        new.rename(final)
    STAMP.write_text(json.dumps({"key": build_key(), "sources": sources}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpurm.native.build", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compile gpurm's scheduling hot paths with mypyc (used only while they match the sources).",
        epilog=textwrap.dedent("""\
            example:
              python -m gpurm.native.build          # after editing rm/core.py: rebuild (about a minute)
              GPURM_NATIVE=0 gpurm sim ...          # run interpreted anyway"""))
    parser.add_argument("--force", action="store_true", help="build even if the build is fresh")
    args = parser.parse_args(argv)
    if not args.force and stamp_matches():
        return 0
    NATIVE_DIR.mkdir(exist_ok=True)
    t0 = time.monotonic()
    sys.stderr.write(f"compiling {len(MODULES)} modules with mypyc into {NATIVE_DIR} ...\n")
    try:
        build()
    except (RuntimeError, OSError) as exc:
        sys.stderr.write(f"warning: the compiled build failed; gpurm runs interpreted (slower).\n{exc}\n")
        return 1
    sys.stderr.write(f"compiled in {time.monotonic() - t0:.0f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
