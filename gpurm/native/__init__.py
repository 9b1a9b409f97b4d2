"""Which build runs: the scheduling hot paths compiled by mypyc, or pure Python.

setup.py compiles them when the wheel is built (`pip install .`, `pip install -e .`, ./scripts/setup-venv) and
writes build.json beside this file: each compiled module and the sha256 of the source it was compiled from. This
module only reads: nothing here changes what Python imports. Where the sources sit next to the compiled modules (an
editable install), an edited source that no longer matches its compiled module is reported as stale;
./scripts/setup-venv rebuilds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUILD_INFO = Path(__file__).with_name("build.json")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent      # the gpurm/ folder


@dataclass(frozen=True)
class Status:
    build: str                          # "compiled", "partly compiled" or "interpreted"
    reason: str                         # what runs, and why
    stale: list[str] = field(default_factory=list)     # compiled modules whose source changed since the build

    @property
    def active(self) -> bool:
        return self.build != "interpreted"


def _is_compiled(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return bool(spec and spec.origin and not spec.origin.endswith(".py"))


def _source_of(module: str) -> Path:
    return PACKAGE_ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")


def _build_record() -> dict[str, Any] | None:
    """build.json as setup.py wrote it: {"group": ..., "modules": {name: {"source_sha256", "compiled"}}}; None when
    it is missing or unreadable."""
    try:
        record = json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("modules"), dict) else None


def _changed(name: str, recorded: dict[str, object]) -> bool:
    source = _source_of(name)
    return source.exists() and hashlib.sha256(source.read_bytes()).hexdigest() != recorded.get("source_sha256")


def sources_changed() -> list[str]:
    """The hot modules whose source differs from the one the build saw (["(no build record)"] without a build):
    what ./scripts/setup-venv recompiles."""
    record = _build_record()
    if record is None:
        return ["(no build record)"]
    return [name for name, recorded in record["modules"].items() if _changed(name, recorded)]


def drop_compiled() -> None:
    """Remove the compiled modules and the build record, so that everything runs interpreted (after a failed
    rebuild: compiled modules call each other directly, so one stale module cannot be left among fresh ones)."""
    record = _build_record() or {"modules": {}}
    group = record.get("group", "")
    for name in [*record["modules"], *([f"{group}__mypyc"] if group else [])]:
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and not spec.origin.endswith(".py"):
            Path(spec.origin).unlink(missing_ok=True)
    BUILD_INFO.unlink(missing_ok=True)


def status() -> Status:
    """What this installation runs, read from build.json and the import system (without importing the modules)."""
    record = _build_record()
    if record is None:
        return Status("interpreted", "interpreted: built without mypyc (no build record)")
    modules: dict[str, dict[str, object]] = record["modules"]
    compiled = [m for m in modules if _is_compiled(m)]
    stale = [name for name in compiled if _changed(name, modules[name])]
    if not compiled:
        return Status("interpreted", "interpreted: the compiled build failed or was skipped (a type error "
                      "mypyc refused, no C compiler, or GPURM_PURE=1: see the install's warnings)")
    build = "compiled" if len(compiled) == len(modules) else "partly compiled"
    reason = f"{build} ({len(compiled)} of {len(modules)} hot modules, mypyc)"
    if stale:
        reason += (f"; STALE: {', '.join(stale)} changed since the build and still run"
                   " as built: run ./scripts/setup-venv")
    return Status(build, reason, stale)
