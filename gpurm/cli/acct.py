"""`gpurm acct`: what finished jobs used (GPU-hours, job counts, queueing time, outcomes) per user, queue and/or
day over a time window, from the RM's records (rm/accounting.py sums them; Client.GetAccounting serves them)."""

from __future__ import annotations

import argparse
import csv
import sys
import time

from gpurm.cli.basics import CliError
from gpurm.cli.client import connect
from gpurm.cli.output import print_json, table
from gpurm.common.fields import format_duration
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.accounting import GROUPS, by_fields, parse_when

EXAMPLE = ("  gpurm acct                                  # everything finished in the last 7 days, one total\n"
           "  gpurm acct --by user,queue --since 30d\n"
           "  gpurm acct --by day --since 2026-11-01 --until 2026-11-08 --user alice\n"
           "  gpurm acct --by queue --queue research -o csv > usage.csv")

COUNTS = ("jobs", "succeeded", "failed", "killed", "preempted", "preemptions")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rm", metavar="HOST:PORT[,...]",
                   help="the RM, or an active/standby RM list a:7070,b:7070 whose leader is followed (default: "
                        "$GPURM_RM, else 127.0.0.1:7070)")
    p.add_argument("-o", "--output", choices=("table", "json", "csv"), default="table",
                   help="table for people (default), json or csv for scripts and spreadsheets")
    p.add_argument("--retry-for", metavar="DURATION",
                   help="while the RM is unreachable, retry for this long, then exit 3 (default: $GPURM_RETRY_FOR, "
                        "else 60s)")
    p.add_argument("--by", default="", metavar="FIELDS",
                   help=f"group by any of {', '.join(GROUPS)} (comma-separated; day: the UTC day a job finished); "
                        "default: one total")
    p.add_argument("--since", default="7d", metavar="WHEN",
                   help="jobs that finished at or after: a duration back from now (7d, 12h), a date (2026-11-01) or "
                        "date and time (2026-11-01T08:00), UTC; `all` for no start (default 7d)")
    p.add_argument("--until", default="now", metavar="WHEN", help="... and before (same forms; default now)")
    p.add_argument("--user", action="append", default=[], help="only this user's jobs (repeatable)")
    p.add_argument("--queue", action="append", default=[],
                   help="only jobs of this queue or the queues below it, e.g. research (repeatable)")


def request_from_args(args: argparse.Namespace, now: float) -> pb.AccountingRequest:
    by = by_fields(args.by)
    bad = [g for g in by if g not in GROUPS]
    if bad:
        raise CliError(f"--by: unknown grouping {bad[0]!r}; choose from {', '.join(GROUPS)}, e.g. --by user,day")
    if len(set(by)) != len(by):
        raise CliError(f"--by: a grouping is named twice: {args.by}")
    since = until = 0.0
    for flag, text in (("since", args.since), ("until", args.until)):
        if flag == "since" and text == "all":
            continue
        try:
            value = parse_when(text, now)
        except ValueError as exc:
            raise CliError(f"--{flag}: {exc}") from None
        if flag == "since":
            since = value
        else:
            until = value
    if since and until and until <= since:
        raise CliError(f"--until ({args.until}) must be after --since ({args.since})")
    return pb.AccountingRequest(by=list(by), since_ms=round(since * 1000), until_ms=round(until * 1000),
                                users=args.user, queues=[q.removeprefix("root.") for q in args.queue])


def row_dict(row: pb.AccountingRow, by: list[str]) -> dict[str, object]:
    out: dict[str, object] = {g: row.key.get(g, "") for g in by}
    out.update({c: getattr(row, c) for c in COUNTS})
    out["gpu_hours"] = round(row.gpu_seconds / 3600, 4)
    out["wait_mean_s"] = round(row.wait_total_s / row.waited, 1) if row.waited else 0.0
    out["wait_max_s"] = round(row.wait_max_s, 1)
    return out


def cmd_acct(args: argparse.Namespace) -> int:
    request = request_from_args(args, time.time())
    rm = connect(args)
    reply = rm.call(rm.client.GetAccounting, request)
    by = list(request.by)
    rows = [row_dict(r, by) for r in reply.rows]
    total = row_dict(reply.total, [])
    window = {"since": _iso(reply.since_ms), "until": _iso(reply.until_ms)}
    if args.output == "json":
        print_json({**window, "by": by, "rows": rows, "total": total})
        return 0
    columns = [*by, *COUNTS, "gpu_hours", "wait_mean_s", "wait_max_s"]
    if args.output == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return 0
    print(f"finished jobs from {window['since'] or 'the first'} to {window['until'] or 'now'} (UTC)")
    if not rows:
        print("no finished jobs match")
        return 0
    headers = [g.upper() for g in by] + ["JOBS", "OK", "FAILED", "KILLED", "PREEMPTED", "GPU-HOURS", "WAIT-AVG",
                                         "WAIT-MAX"]
    cells = [_cells(r, by) for r in rows]
    if by and len(rows) > 1:
        cells.append(_cells({**{g: "" for g in by}, **total}, by, label="total"))
    table(headers, cells)
    return 0


def _cells(r: dict[str, object], by: list[str], label: str = "") -> list[object]:
    keys: list[object] = [r[g] for g in by]
    if label and keys:
        keys[0] = label
    return [*keys, r["jobs"], r["succeeded"], r["failed"], r["killed"], r["preempted"], _hours(r["gpu_hours"]),
            _dur(r["wait_mean_s"]), _dur(r["wait_max_s"])]


def _hours(value: object) -> str:
    hours = float(value) if isinstance(value, int | float) else 0.0
    return "<0.01" if 0 < hours < 0.005 else f"{hours:.2f}"


def _dur(seconds: object) -> str:
    return format_duration(float(seconds)) if isinstance(seconds, int | float) else "-"


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000)) if ms else ""
