"""The committed generated modules must match gpurm/proto/gpurm.proto (run ./scripts/gen-proto after editing it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Version stamps differ between grpcio-tools releases without the code differing.
_VERSION_LINES = re.compile(r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s*\d+,\s*$)",
                            re.MULTILINE)


def _normalise(text: str) -> str:
    return _VERSION_LINES.sub("", text)


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run([str(ROOT / "scripts" / "gen-proto"), str(tmp_path)], check=True, env=env,
                   capture_output=True)
    for name in ("gpurm_pb2.py", "gpurm_pb2_grpc.py", "gpurm_pb2.pyi"):
        fresh = _normalise((tmp_path / "gpurm" / "proto" / name).read_text())
        committed = _normalise((ROOT / "gpurm" / "proto" / name).read_text())
        assert fresh == committed, f"gpurm/proto/{name} is stale: run ./scripts/gen-proto and commit the result"
