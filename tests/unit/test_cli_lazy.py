"""The CLI loads only what the command asked for needs: a `gpurm status` is a process the tests (and users' scripts)
start hundreds of times, so it must not import the simulator, the scheduler, the PKI or an MQTT client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpurm.cli.main import build_parser

HEAVY = ("gpurm.sim", "gpurm.rm", "gpurm.am", "gpurm.nodeagent", "cryptography", "aiomqtt", "aiohttp", "matplotlib")


def _modules_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\nimport json\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    return list(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("argv", [["status", "job-1"], ["submit", "--gpus", "1"], ["logs", "-f", "job-1"], ["agent"],
                                  []])
def test_parsing_a_client_command_imports_nothing_heavy(argv: list[str]) -> None:
    code = ("from gpurm.cli.main import build_parser\n"
            f"build_parser({(argv[0] if argv else '')!r}).parse_args({argv!r})")
    assert _modules_after(code) == []


def test_the_jobs_commands_module_needs_no_mqtt_client() -> None:
    assert _modules_after("import gpurm.cli.jobs") == []


def test_every_command_is_listed_whichever_was_asked_for() -> None:
    full = build_parser()
    for command in ("status", "", "sim"):
        narrow = build_parser(command)
        assert narrow.format_help() == full.format_help()


@pytest.mark.parametrize("command", ["sim", "acct", "admin", "dev-cluster", "submit"])
def test_the_command_asked_for_gets_all_its_arguments(command: str) -> None:
    def subparser(parser: object) -> str:
        import argparse

        assert isinstance(parser, argparse.ArgumentParser)
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return action.choices[command].format_help()

    assert subparser(build_parser(command)) == subparser(build_parser())


def test_a_command_runs_the_function_of_its_module() -> None:
    args = build_parser("completion").parse_args(["completion", "bash"])
    assert args.func.__name__ == "cmd_completion"
