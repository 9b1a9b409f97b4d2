"""`gpurm admin store check|backup|restore`: look after an RM's store on disk (no RM needed).

Exit codes: check 0 when every record reads, 1 when something is damaged (each listed), 2 bad input; backup and
restore 0 done, 2 refused (one line says why).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpurm.cli.basics import CliError

EPILOG = """example:
  gpurm admin store check --state-dir /var/lib/gpurm/rm
  gpurm admin store backup --state-dir /var/lib/gpurm/rm --to /srv/backups/rm-$(date +%F).db
  gpurm admin store restore --state-dir /var/lib/gpurm/rm /var/lib/gpurm/rm/backups/state-20260101-120000.db
  gpurm admin store backup --url postgresql://gpurm@db1:5432/gpurm --to /srv/backups/rm-$(date +%F).pgdump
  gpurm admin store restore --url postgresql://gpurm@db1:5432/gpurm /srv/backups/rm-2026-01-01.pgdump

A PostgreSQL store (rm.yaml store.url) is named by --url (its password from PGPASSWORD or ~/.pgpass, or in the
URL); backup and restore run pg_dump / pg_restore, which must be installed."""


def add_store_parser(admin_subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fmt = argparse.RawDescriptionHelpFormatter
    store = admin_subparsers.add_parser(
        "store", help="check, back up or restore the RM's store", formatter_class=fmt, epilog=EPILOG,
        description="check, back up or restore the RM's store: state.db in its state dir (--state-dir; the RM "
                    "keeps automatic backups in STATE_DIR/backups), or a PostgreSQL database (--url; "
                    "docs/operations.md)")
    subs = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND")

    p = subs.add_parser("check", help="read every record and list what is damaged (exit 1 if anything is)",
                        formatter_class=fmt, epilog=EPILOG)
    _where(p)
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_check)

    p = subs.add_parser("backup", help="copy the store (safe while the RM runs)", formatter_class=fmt,
                        epilog=EPILOG)
    _where(p)
    p.add_argument("--to", metavar="FILE", help="where to write it (default: a new file in STATE_DIR/backups; "
                                                "required with --url)")
    p.set_defaults(func=cmd_backup)

    p = subs.add_parser("restore", help="make a backup the store (the RM must be stopped)", formatter_class=fmt,
                        epilog=EPILOG)
    _where(p)
    p.add_argument("file", metavar="FILE", help="a backup (see `gpurm admin store backup`)")
    p.set_defaults(func=cmd_restore)

    store.set_defaults(func=lambda a: _missing(store))


def _where(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--state-dir", help="the RM's state dir (a SQLite store: STATE_DIR/state.db)")
    group.add_argument("--url", help="a PostgreSQL store: postgresql://USER@HOST:PORT/DBNAME (rm.yaml store.url)")


def _missing(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_check(args: argparse.Namespace) -> int:
    from gpurm.rm.storage.admin import StoreAdminError, check_store, check_url

    try:
        result = check_url(args.url) if args.url else check_store(Path(args.state_dir))
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
        if result.damage and args.url:
            print(f"{len(result.damage)} damaged; restore a backup with `gpurm admin store restore --url URL FILE`")
        elif result.damage:
            print(f"{len(result.damage)} damaged; restore a backup with `gpurm admin store restore --state-dir "
                  f"{args.state_dir} FILE` (backups in {Path(args.state_dir) / 'backups'})")
        else:
            print("every record reads")
    return 1 if result.damage else 0


def cmd_backup(args: argparse.Namespace) -> int:
    from gpurm.rm.storage.admin import StoreAdminError, backup_store, backup_url

    try:
        if args.url:
            if not args.to:
                raise StoreAdminError("--to: required with --url (a PostgreSQL store has no state dir for backups)")
            target = backup_url(args.url, Path(args.to))
        else:
            target = backup_store(Path(args.state_dir), Path(args.to) if args.to else None)
    except StoreAdminError as exc:
        raise CliError(str(exc)) from None
    print(target)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from gpurm.rm.storage.admin import StoreAdminError, restore_store, restore_url

    try:
        if args.url:
            restore_url(args.url, Path(args.file))
            print(f"restored {args.file} into the store")
            return 0
        kept = restore_store(Path(args.state_dir), Path(args.file))
    except StoreAdminError as exc:
        raise CliError(str(exc)) from None
    print(f"restored {args.file} into {args.state_dir}; the store it replaced is kept as {kept}")
    return 0
