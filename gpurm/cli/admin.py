"""Security-related operator commands: `gpurm admin info`, `gpurm admin node-secret` (and the mTLS PKI)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurm.cli.basics import CliError
from gpurm.cli.client import connect
from gpurm.cli.output import ago, message_dict, print_json, table
from gpurm.common.textsafe import escape_controls
from gpurm.common.tokens import ClusterKeys, write_secret_file
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.config import default_state_dir
from gpurm.rm.security import pki

Sub = Callable[..., argparse.ArgumentParser]


def add_parsers(asubs: Any, sub: Sub) -> None:
    p = sub(asubs, "info", "what the RM is: version, security mode, who it thinks you are, store health",
            "  gpurm admin info\n  gpurm admin info -o json")
    p.set_defaults(func=cmd_info)
    p = sub(asubs, "node-secret", "print (or write) a node's secret for its agent.yaml node_secret_file "
            "(run on the RM host; insecure mode's proof of a node)",
            "  gpurm admin node-secret node-7 --out /etc/gpurm/node.secret   # then copy it to node-7, mode 0600\n"
            "  gpurm admin node-secret node-7 --state-dir /var/lib/gpurm/rm", common=False)
    p.add_argument("node", help="the node id (agent.yaml node_id)")
    p.add_argument("--state-dir", help=f"the RM's state dir (default {default_state_dir('rm')})")
    p.add_argument("--out", help="write the secret to this file (mode 0600) instead of printing it")
    p.set_defaults(func=cmd_node_secret)
    pki = sub(asubs, "pki", "a small CA for the cluster's mTLS: init, then issue one certificate per RM, node, "
              "AM role and user",
              "  gpurm admin pki init /etc/gpurm/ca\n"
              "  gpurm admin pki issue /etc/gpurm/ca rm --host rm.example.org --host 10.0.0.1 --out /etc/gpurm/rm\n"
              "  gpurm admin pki issue /etc/gpurm/ca node:node-7 --host node-7.example.org --out node-7\n"
              "  gpurm admin pki issue /etc/gpurm/ca am:cluster --out am   # agent.yaml am_tls\n"
              "  gpurm admin pki issue /etc/gpurm/ca alice --out alice     # GPURM_TLS_* for alice's CLI",
              common=False)
    psubs = pki.add_subparsers(dest="pki_command", metavar="SUBCOMMAND")
    p = sub(psubs, "init", "make a CA (ca.pem, ca-key.pem 0600) in DIR", "  gpurm admin pki init /etc/gpurm/ca",
            common=False)
    p.add_argument("dir", help="where the CA goes (must not hold one)")
    p.add_argument("--days", type=int, default=3650, help="validity (default 3650)")
    p.set_defaults(func=cmd_pki_init)
    p = sub(psubs, "issue", "issue a certificate: CN NAME (a user; node:<id>; am:<name>; the RM's any name)",
            "  gpurm admin pki issue /etc/gpurm/ca node:node-7 --host node-7.example.org --out node-7",
            common=False)
    p.add_argument("dir", help="the CA's directory")
    p.add_argument("name", help="the certificate's common name")
    p.add_argument("--out", required=True, help="file prefix: writes OUT.pem and OUT-key.pem (0600)")
    p.add_argument("--host", action="append", default=[],
                   help="a DNS name or IP the holder serves at (RM, agents); repeatable")
    p.add_argument("--days", type=int, default=365, help="validity (default 365)")
    p.set_defaults(func=cmd_pki_issue)
    pki.set_defaults(func=lambda a: _usage(pki))


def cmd_info(args: argparse.Namespace) -> int:
    rm = connect(args)
    info = rm.call(rm.client.GetClusterInfo, pb.ClusterInfoRequest())
    if args.output == "json":
        print_json(message_dict(info))
        return 0
    rows = [
        ["RM", f"{rm.address} (version {info.version}, started {ago(info.started_ms)} ago)"],
        ["security", "INSECURE: no mTLS, identity is the client's claim" if info.insecure else "mTLS"],
        ["you are", escape_controls(info.caller) + (" (RM admin)" if info.caller_admin else "")],
        ["cluster", f"{info.nodes} nodes, {info.gpus_total} GPUs"],
        ["epoch", str(info.epoch)],
        ["store", escape_controls(info.store_error) if info.store_error else "ok"],
        ["broker", info.mqtt_url or "-"],
        ["web UI", escape_controls(info.http_url) if info.http_url else "off (rm.yaml http.enabled)"],
    ]
    table(["", ""], rows, max_last=100)
    for line in info.warnings:
        print(f"warning: {escape_controls(line)}", file=sys.stderr)
    return 0


def cmd_node_secret(args: argparse.Namespace) -> int:
    state = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir("rm")
    path = state / "token.key"
    if not path.exists():
        raise CliError(f"no cluster secret at {path}: pass the RM's --state-dir, or start the RM once "
                       "(it makes the secret on its first start)")
    if not args.node or len(args.node) > 128:
        raise CliError("node: a node id of 1-128 characters")
    try:
        secret = ClusterKeys.load(path).node_key(args.node).secret.hex()
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the cluster secret {path}: {exc}") from None
    if args.out:
        out = write_secret_file(Path(args.out).expanduser(), secret)
        print(f"wrote {args.node}'s secret to {out} (mode 0600); copy it to the node and set "
              f"node_secret_file: {out.name} in its agent.yaml")
        return 0
    print(secret)
    return 0


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_pki_init(args: argparse.Namespace) -> int:
    if args.days < 1:
        raise CliError("--days: at least 1")
    try:
        cert = pki.init_ca(Path(args.dir).expanduser(), days=args.days)
    except (pki.PkiError, OSError) as exc:
        raise CliError(str(exc)) from None
    print(f"CA made: {cert} (its key {cert.parent / pki.CA_KEY} is 0600: keep it off the cluster's nodes)")
    return 0


def cmd_pki_issue(args: argparse.Namespace) -> int:
    if args.days < 1:
        raise CliError("--days: at least 1")
    try:
        issued = pki.issue(Path(args.dir).expanduser(), args.name, Path(args.out).expanduser(), args.host,
                           days=args.days)
    except (pki.PkiError, OSError) as exc:
        raise CliError(str(exc)) from None
    print(f"issued {args.name}: {issued.cert}, key {issued.key} (0600); tls: {{ca: {issued.ca}, "
          f"cert: {issued.cert}, key: {issued.key}}}")
    return 0
