"""`gpurm completion`: the generated bash script, run in a real bash, completes commands, nested subcommands,
flags and a flag's choices."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpurm.cli.completion import bash_script, zsh_script
from gpurm.cli.main import build_parser


def complete(script: Path, *words: str) -> list[str]:
    """What bash offers for the command line `words` (the last one is being typed)."""
    line = " ".join(f"'{w}'" for w in words)
    probe = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; PATH=/nonexistent; "
             "_gpurm; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, timeout=30).stdout
    return sorted(w for w in out.split() if w)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "gpurm.bash"
    path.write_text(bash_script(build_parser()))
    return path


def test_commands_subcommands_flags_and_choices(script: Path) -> None:
    assert {"submit", "jobs", "kill", "completion", "admin"} <= set(complete(script, "gpurm", ""))
    assert complete(script, "gpurm", "sub") == ["submit"]
    assert {"init", "issue"} <= set(complete(script, "gpurm", "admin", "pki", ""))
    assert {"--gpus", "--placement", "--queue"} <= set(complete(script, "gpurm", "submit", "--"))
    assert complete(script, "gpurm", "submit", "--placement", "") == ["pack", "spread"]
    assert complete(script, "gpurm", "kill", "--state", "R") == ["RUNNING"]
    assert complete(script, "gpurm", "kill", "job-3", "--y") == ["--yes"]


def test_zsh_gets_the_same_through_bashcompinit() -> None:
    text = zsh_script(build_parser())
    assert "bashcompinit" in text and "complete -F _gpurm gpurm" in text
