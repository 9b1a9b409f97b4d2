"""The compiled hot paths (setup.py's mypyc build): what `gpurm.native` reports, and that they decide exactly what
the interpreted code decides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpurm import native

ROOT = Path(__file__).resolve().parents[2]

# Run in a child: with PURE, the import system is told to load no extension module from the gpurm tree (a test
# device only: gpurm itself never steers imports), so the same sources run interpreted.
PURE = """
import importlib.machinery as m, sys
sys.path_hooks[:] = [h for h in sys.path_hooks if "FileFinder" not in repr(h)]
sys.path_hooks.append(m.FileFinder.path_hook((m.SourceFileLoader, m.SOURCE_SUFFIXES),
                                             (m.SourcelessFileLoader, m.BYTECODE_SUFFIXES)))
sys.path_importer_cache.clear()
"""
# Replays the first 400 Philly jobs under LAS (preemptions, back-offs, relaxing) and prints every job's outcome.
REPLAY = """
import json
from pathlib import Path
from gpurm.queues.tree import Policy
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import load_trace
import gpurm.rm.state.core
trace = load_trace(Path("tests/data/philly/jobs-2017-10-02_to_10-15.csv"), "philly-csv")
trace.jobs = trace.jobs[:400]
r = Engine(trace, parse_cluster("2x4x8"), trace_tree(trace.queues()), SimOptions(policy=Policy.LAS)).run()
print(json.dumps({"compiled": not gpurm.rm.state.core.__file__.endswith(".py"),
                  "events": r.events, "jobs": [[j.job_id, j.start_s, j.finish_s, j.preemptions] for j in r.results]}))
"""


def replay(pure: bool) -> dict[str, object]:
    code = (PURE if pure else "") + REPLAY
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=300)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_status_matches_what_python_imports() -> None:
    import gpurm.rm.state.core
    compiled = not str(gpurm.rm.state.core.__file__).endswith(".py")
    st = native.status()
    assert st.active == compiled, st
    assert st.build in ("compiled", "partly compiled", "interpreted") and st.reason


def test_the_build_is_not_stale() -> None:
    # ./scripts/setup-venv recompiles after an edit; a stale module would run code that is no longer in the tree.
    assert native.status().stale == [], native.status().reason


@pytest.mark.skipif(not native.status().active, reason=f"no compiled build: {native.status().reason}")
def test_compiled_and_interpreted_replays_decide_the_same() -> None:
    compiled, interpreted = replay(pure=False), replay(pure=True)
    assert compiled["compiled"] is True and interpreted["compiled"] is False
    assert compiled["events"] == interpreted["events"] and compiled["jobs"] == interpreted["jobs"]
    assert any(j[3] for j in compiled["jobs"])          # preemptions happened: the replay exercised them


def test_an_edited_source_is_reported_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A build record whose hash for gpurm.rm.state.core is not the source's: reported (when compiled) and rebuilt.
    info = {"group": "gpurm_native", "modules": {"gpurm.rm.state.core": {"source_sha256": "0" * 64, "compiled": True}}}
    record = tmp_path / "build.json"
    record.write_text(json.dumps(info))
    monkeypatch.setattr(native, "BUILD_INFO", record)
    assert native.sources_changed() == ["gpurm.rm.state.core"]
    st = native.status()
    if st.active:
        assert st.stale == ["gpurm.rm.state.core"] and "STALE" in st.reason
    monkeypatch.setattr(native, "BUILD_INFO", tmp_path / "missing.json")
    assert native.sources_changed() == ["(no build record)"]
    assert native.status().build == "interpreted" and "no build record" in native.status().reason
