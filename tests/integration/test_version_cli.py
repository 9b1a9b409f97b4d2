"""`gpurm version` says which build runs: compiled, or interpreted and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.integration.harness import ROOT


def version(**env: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "version", "-o", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True, env={**os.environ, **env})
    info: dict[str, str] = json.loads(done.stdout)
    return info


def test_version_names_the_build_in_use() -> None:
    off = version(GPURM_NATIVE="0")
    assert off["build"] == "interpreted" and "GPURM_NATIVE=0" in off["detail"]
    assert off["gpurm"] and off["python"].startswith("CPython 3.")
    on = version(GPURM_NATIVE="1")
    assert on["build"] in ("compiled", "interpreted") and on["detail"]
    if on["build"] == "interpreted":
        assert "not built" in on["detail"] or "stale" in on["detail"], on
