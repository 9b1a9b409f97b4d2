"""`gpurm rm` and `gpurm agent`: run the daemons in the foreground."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from gpurm.cli.basics import CliError
from gpurm.common.fields import ConfigError
from gpurm.common.textsafe import setup_logging


def _logging(level: str) -> None:
    setup_logging(getattr(logging, level.upper(), logging.INFO))


def _config_path(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if not path.is_file():
        raise CliError(f"--config: {value} does not exist or is not a file")
    return path


def cmd_rm(args: argparse.Namespace) -> int:
    from gpurm.rm.config import load_rm_config
    from gpurm.rm.server.process import run_rm

    overrides: dict[str, Any] = {}
    if args.listen:
        overrides["listen"] = args.listen
    if args.state_dir:
        overrides["state_dir"] = args.state_dir
    try:
        config = load_rm_config(_config_path(args.config), overrides)
    except ConfigError as exc:
        raise CliError("rm config: " + "; ".join(exc.problems)) from None
    if args.mqtt_url:
        config.mqtt_url = args.mqtt_url
    _logging(args.log_level)
    return run_rm(config)


def cmd_agent(args: argparse.Namespace) -> int:
    from gpurm.nodeagent.config import load_agent_config
    from gpurm.nodeagent.daemon import main as agent_main

    overrides: dict[str, object] = {}
    for flag, key in (("node_id", "node_id"), ("rm", "rm"), ("listen", "listen"), ("rack", "rack"),
                      ("state_dir", "state_dir")):
        value = getattr(args, flag)
        if value:
            overrides[key] = value
    if getattr(args, "discover", False) and not args.config:
        overrides["gpus"] = {"nvml": True}
    try:
        config = load_agent_config(_config_path(args.config), overrides)
    except ConfigError as exc:
        raise CliError("agent config: " + "; ".join(exc.problems)) from None
    if getattr(args, "discover", False):
        return discover_gpus(config, args.output)
    _logging(args.log_level)
    return int(agent_main(config))


def discover_gpus(config: Any, output: str) -> int:
    """`gpurm agent --discover`: the provider's GPUs and topology on stdout; one line on stderr if none."""
    import json

    from gpurm.nodeagent import discover
    from gpurm.nodeagent.gpus import GpuDiscoveryError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        found = discover.discover(config)
    except GpuDiscoveryError as exc:
        raise CliError(str(exc)) from None
    if output == "json":
        print(json.dumps(discover.as_json(found), indent=2))
    else:
        sys.stdout.write(discover.as_text(found))
    return 0


__all__ = ["cmd_agent", "cmd_rm", "sys"]
