"""`gpurm dev-cluster --agent-option KEY=VALUE` lands in every agent's agent.yaml (and is refused without '=')."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpurm.cli.basics import CliError
from gpurm.cli.devcluster import DevCluster
from gpurm.cli.main import build_parser


def test_agent_options_reach_every_agent_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(["dev-cluster", "--nodes", "2", "--agent-option",
                                      "telemetry.container_interval=250ms", "--agent-option", "cpus=4"])
    _, agents = DevCluster(args, tmp_path).write_configs()
    assert len(agents) == 2
    for path in agents:
        cfg = yaml.safe_load(path.read_text())
        assert cfg["telemetry"] == {"container_interval": "250ms"} and cfg["cpus"] == 4


def test_an_agent_option_without_a_value_is_refused(tmp_path: Path) -> None:
    args = build_parser().parse_args(["dev-cluster", "--agent-option", "telemetry.interval"])
    with pytest.raises(CliError, match="--agent-option: expected KEY=VALUE"):
        DevCluster(args, tmp_path).write_configs()


def test_one_node_fits_the_default_racks(capsys: pytest.CaptureFixture[str]) -> None:
    from gpurm.cli.devcluster import check_args

    args = build_parser().parse_args(["dev-cluster", "--nodes", "1"])
    check_args(args)                       # the default --racks 2 was refused for one node
    assert args.racks == 1 and capsys.readouterr().err == ""
    args = build_parser().parse_args(["dev-cluster", "--nodes", "2", "--racks", "5"])
    check_args(args)
    assert args.racks == 2 and "using 2, one per node" in capsys.readouterr().err
    with pytest.raises(CliError, match="--racks: must be at least 1"):
        check_args(build_parser().parse_args(["dev-cluster", "--racks", "0"]))
