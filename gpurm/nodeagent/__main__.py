"""`python -m gpurm.nodeagent --config agent.yaml [--set KEY=VALUE ...]`: the agent without the gpurm CLI.

For tests and debugging; operators run `gpurm agent`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from gpurm.common.textsafe import setup_logging
from gpurm.nodeagent.config import AgentConfig, ConfigError, load_agent_config
from gpurm.nodeagent.daemon import EXIT_CONFIG, main
from gpurm.nodeagent.gpus import GpuDiscoveryError

log = logging.getLogger("gpurm.nodeagent")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpurm.nodeagent")
    parser.add_argument("--config", type=Path, help="agent.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a top-level key; VALUE is read as YAML (e.g. gpus={fake: 4})")
    parser.add_argument("--discover", action="store_true", help="print the GPUs and topology found, then exit")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="with --discover")
    args = parser.parse_args(argv)
    setup_logging(logging.INFO)
    overrides: dict[str, object] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    try:
        cfg = load_agent_config(args.config, overrides)
    except ConfigError as exc:
        for problem in exc.problems:
            log.error("agent config: %s", problem)
        return EXIT_CONFIG
    if args.discover:
        return _discover(cfg, args.output)
    return main(cfg)


def _discover(cfg: AgentConfig, output: str) -> int:
    import json

    from gpurm.nodeagent import discover

    try:
        found = discover.discover(cfg)
    except GpuDiscoveryError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    text = json.dumps(discover.as_json(found), indent=2) + "\n" if output == "json" else discover.as_text(found)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
