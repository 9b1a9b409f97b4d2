"""`gpurm admin store check|backup|restore`: look after an RM's store on disk (no RM needed).

Exit codes: check 0 when every record reads, 1 when something is damaged (each listed), 2 bad input; backup and
restore 0 done, 2 refused (one line says why).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpurm.cli.client import CliError

EPILOG = """example:
  gpurm admin store check --state-dir /var/lib/gpurm/rm
  gpurm admin store backup --state-dir /var/lib/gpurm/rm --to /srv/backups/rm-$(date +%F).db
  gpurm admin store restore --state-dir /var/lib/gpurm/rm /var/lib/gpurm/rm/backups/state-20260101-120000.db"""


def add_store_parser(admin_subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fmt = argparse.RawDescriptionHelpFormatter
    store = admin_subparsers.add_parser(
        "store", help="check, back up or restore the RM's store", formatter_class=fmt, epilog=EPILOG,
        description="check, back up or restore the RM's store (state.db in its state dir); the RM keeps "
                    "automatic backups in STATE_DIR/backups")
    subs = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND")

    p = subs.add_parser("check", help="read every record and list what is damaged (exit 1 if anything is)",
                        formatter_class=fmt, epilog=EPILOG)
    p.add_argument("--state-dir", required=True, help="the RM's state dir")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_check)

    p = subs.add_parser("backup", help="copy the store (safe while the RM runs)", formatter_class=fmt,
                        epilog=EPILOG)
    p.add_argument("--state-dir", required=True, help="the RM's state dir")
    p.add_argument("--to", metavar="FILE", help="where to write it (default: a new file in STATE_DIR/backups)")
    p.set_defaults(func=cmd_backup)

    p = subs.add_parser("restore", help="make a backup the store (the RM must be stopped)", formatter_class=fmt,
                        epilog=EPILOG)
    p.add_argument("--state-dir", required=True, help="the RM's state dir")
    p.add_argument("file", metavar="FILE", help="a backup (see `gpurm admin store backup`)")
    p.set_defaults(func=cmd_restore)

    store.set_defaults(func=lambda a: _missing(store))


def _missing(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_check(args: argparse.Namespace) -> int:
    from gpurm.rm.storeadmin import StoreAdminError, check_store

    try:
        result = check_store(Path(args.state_dir))
    except StoreAdminError as exc:
        raise CliError(str(exc)) from None
    if args.output == "json":
        print(json.dumps({"store": str(result.path), "jobs": result.jobs, "containers": result.containers,
                          "nodes": result.nodes, "damaged": [{"where": d.where, "reason": d.reason}
                                                             for d in result.damage]}, indent=2))
    else:
        print(f"{result.path}: {result.jobs} jobs, {result.containers} containers, {result.nodes} nodes")
        for d in result.damage:
            print(f"DAMAGED {d}")
        if result.damage:
            print(f"{len(result.damage)} damaged; restore a backup with `gpurm admin store restore --state-dir "
                  f"{args.state_dir} FILE` (backups in {Path(args.state_dir) / 'backups'})")
        else:
            print("every record reads")
    return 1 if result.damage else 0


def cmd_backup(args: argparse.Namespace) -> int:
    from gpurm.rm.storeadmin import StoreAdminError, backup_store

    try:
        target = backup_store(Path(args.state_dir), Path(args.to) if args.to else None)
    except StoreAdminError as exc:
        raise CliError(str(exc)) from None
    print(target)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from gpurm.rm.storeadmin import StoreAdminError, restore_store

    try:
        kept = restore_store(Path(args.state_dir), Path(args.file))
    except StoreAdminError as exc:
        raise CliError(str(exc)) from None
    print(f"restored {args.file} into {args.state_dir}; the store it replaced is kept as {kept}")
    return 0
