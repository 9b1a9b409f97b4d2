"""`gpurm sim` finds a missing matplotlib before the replay (which may take minutes), not after it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from gpurm.cli.main import main


def test_missing_matplotlib_fails_before_the_trace_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    # The trace does not exist: had the replay started, the error would name the trace.
    code = main(["sim", "--trace", str(tmp_path / "missing.jsonl"), "--format", "jsonl", "--cluster", "2x2x8",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "the plots need matplotlib" in err and "-m pip install 'matplotlib>=3.8'" in err, err
    assert "--no-plots" in err and not (tmp_path / "out").exists()
    # --no-plots needs no matplotlib: it goes on to the replay (and stops at the missing trace).
    code = main(["sim", "--trace", str(tmp_path / "missing.jsonl"), "--format", "jsonl", "--cluster", "2x2x8",
                 "--out", str(tmp_path / "out"), "--no-plots"])
    err = capsys.readouterr().err
    assert code == 2 and "the plots need" not in err and "missing.jsonl: file" in err, err
