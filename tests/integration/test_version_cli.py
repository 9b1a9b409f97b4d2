"""`gpurm version` says which build runs: compiled by mypyc at install, or interpreted and why."""

from __future__ import annotations

import json
import subprocess
import sys

from gpurm import native
from tests.integration.harness import ROOT


def test_version_names_the_build_in_use() -> None:
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "version", "-o", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    info = json.loads(done.stdout)
    assert info["gpurm"] and info["python"].startswith("CPython 3.")
    import gpurm.rm.state.core
    compiled = not str(gpurm.rm.state.core.__file__).endswith(".py")
    assert (info["build"] != "interpreted") == compiled, info
    assert info["detail"] == native.status().reason and info["stale"] == []
