"""`gpurm admin ha status`: which RM leads a highly available pair (or more) on one PostgreSQL, since when, at
which epoch, and how long its lease still runs. It reads the lease row itself (rm/server/leadership.py), so it answers
when every RM is down too.

Exit codes: 0 an RM leads, 1 none does (the lease is free or ran out), 2 bad input or the database cannot be
reached (one line says why).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from gpurm.cli.basics import CliError

EPILOG = """example:
  gpurm admin ha status --store postgresql://gpurm@db.cluster.internal:5432/gpurm
  gpurm admin ha status --store postgresql://gpurm@db:5432/gpurm -o json"""


def add_ha_parser(admin_subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fmt = argparse.RawDescriptionHelpFormatter
    ha = admin_subparsers.add_parser("ha", help="high availability: which RM leads", formatter_class=fmt,
                                     epilog=EPILOG, description="RMs sharing one PostgreSQL store (rm.yaml ha:)")
    subs = ha.add_subparsers(dest="ha_command", metavar="SUBCOMMAND")
    p = subs.add_parser("status", help="who leads, since when, the epoch and the lease left (exit 1: nobody)",
                        formatter_class=fmt, epilog=EPILOG)
    p.add_argument("--store", required=True, metavar="URL",
                   help="the RMs' store.url (postgresql://USER@HOST:PORT/DB; the password from PGPASSWORD or "
                        "~/.pgpass)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_status)
    ha.set_defaults(func=lambda a: _missing(ha))


def _missing(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _iso(t: datetime | None) -> str:
    return t.isoformat(timespec="seconds") if t is not None else ""


def cmd_status(args: argparse.Namespace) -> int:
    from gpurm.rm.server.leadership import Lease

    if not args.store.startswith(("postgresql://", "postgres://")):
        raise CliError(f"--store: expected a postgresql:// URL (HA needs a PostgreSQL store), got "
                       f"{args.store.split(':', 1)[0]}:...")
    try:
        import psycopg
    except ImportError:
        raise CliError("the psycopg package is missing; reinstall gpurm") from None
    try:
        with psycopg.connect(args.store, autocommit=True, connect_timeout=10) as conn:
            lease = Lease(conn, "", 0.0)
            lease.ensure_schema()
            info = lease.read()
    except psycopg.Error as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"cannot read the lease from the store: {detail}; check --store and that the database "
                       "server is up") from None
    left = (info.expires - info.db_now).total_seconds() if info.expires and info.db_now else 0.0
    if args.output == "json":
        print(json.dumps({"leader": info.address if info.held else "", "held": info.held, "epoch": info.epoch,
                          "since": _iso(info.since), "lease_left_s": round(left, 1),
                          "last_leader": info.address, "web_ui": info.http_url if info.held else ""},
                         indent=2))
    else:
        rows = [("leader", info.address if info.held else f"none (last: {info.address or 'never'})"),
                ("epoch", str(info.epoch)), ("since", _iso(info.since) if info.held else ""),
                ("lease", f"{left:.1f}s left" if info.held else
                 (f"ran out {-left:.1f}s ago" if info.address else "free"))]
        if info.held:
            rows.append(("web UI", info.http_url or "(not serving HTTP yet, or http.enabled: false)"))
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
    return 0 if info.held else 1
