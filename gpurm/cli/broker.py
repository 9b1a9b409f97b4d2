"""`gpurm admin broker-files DIR`: mosquitto's password file, ACL file and a mosquitto.conf snippet, written from
the RM's broker credentials (brokerauth.py), so an external mosquitto enforces the same two roles as the
embedded broker. Reads (or makes) `broker.secret` in the RM's state dir; runs offline, on the RM's host."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpurm.cli.basics import CliError
from gpurm.common.fields import parse_address
from gpurm.rm.config import default_state_dir
from gpurm.rm.security import brokerauth

DEFAULT_LISTEN = "127.0.0.1:1883"


def add_broker_parser(admin_subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = admin_subparsers.add_parser(
        "broker-files", help="write mosquitto password/ACL files and a conf snippet for the RM's broker logins",
        description="Write DIR/passwd (mosquitto $7$ hashes), DIR/acl and DIR/mosquitto.conf for an external "
                    "mosquitto, from the broker credentials in the RM's state dir (made there when absent). "
                    "Then point the RM at it with mqtt.url in rm.yaml.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  gpurm admin broker-files /etc/mosquitto/gpurm --state-dir /var/lib/gpurm/rm "
               "--listen 10.0.0.5:1883\n  # then, in mosquitto.conf: include_dir /etc/mosquitto/gpurm")
    p.add_argument("dir", help="where to write passwd, acl and mosquitto.conf")
    p.add_argument("--state-dir", help=f"the RM's state dir (default: {default_state_dir('rm')})")
    p.add_argument("--listen", default=DEFAULT_LISTEN,
                   help=f"HOST:PORT for mosquitto's listener line (default {DEFAULT_LISTEN})")
    p.set_defaults(func=cmd_broker_files)


def cmd_broker_files(args: argparse.Namespace) -> int:
    try:
        host, port = parse_address(args.listen)
    except ValueError as exc:
        raise CliError(f"--listen: {exc}") from None
    if not 0 < port < 65536:
        raise CliError(f"--listen: port must be 1-65535, got {port}")
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir("rm")
    try:
        auth = brokerauth.load_or_create(state_dir)
        files = brokerauth.write_mosquitto_files(auth, Path(args.dir), host, port)
    except brokerauth.BrokerAuthError as exc:
        raise CliError(f"--state-dir: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot write to {args.dir}: {exc.strerror or exc}") from None
    sys.stdout.write(f"wrote {files.passwd}, {files.acl} and {files.conf} (users {auth.rm.username}, "
                     f"{auth.reader.username}; credentials in {state_dir / brokerauth.SECRET_FILE})\n")
    return 0
