"""`gpurm acct` on its own: flags to the request, and the table / JSON / CSV it prints (a fake RM, no sockets)."""

from __future__ import annotations

import argparse
import calendar
import json
import time
from typing import Any

import pytest

from gpurm.cli import acct
from gpurm.cli.basics import CliError
from gpurm.cli.main import build_parser
from gpurm.proto import gpurm_pb2 as pb

NOW = float(calendar.timegm(time.strptime("2026-11-10T12:00", "%Y-%m-%dT%H:%M")))


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["acct", *argv])


def test_flags_become_the_request() -> None:
    r = acct.request_from_args(args(), NOW)
    assert (list(r.by), r.since_ms, r.until_ms) == ([], round((NOW - 7 * 86400) * 1000), round(NOW * 1000))
    r = acct.request_from_args(args("--by", "user,day", "--since", "2026-11-01", "--until", "2026-11-08",
                                    "--user", "alice", "--queue", "root.research"), NOW)
    assert list(r.by) == ["user", "day"] and list(r.users) == ["alice"] and list(r.queues) == ["research"]
    assert r.since_ms == calendar.timegm(time.strptime("2026-11-01", "%Y-%m-%d")) * 1000
    assert acct.request_from_args(args("--since", "all"), NOW).since_ms == 0


@pytest.mark.parametrize(("argv", "message"), [
    (("--by", "month"), "--by: unknown grouping 'month'"),
    (("--by", "user,user"), "--by: a grouping is named twice"),
    (("--since", "yesterday"), "--since: expected a duration back from now like 7d"),
    (("--since", "1d", "--until", "2d"), "--until (2d) must be after --since (1d)"),
])
def test_bad_flags_are_one_line(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(CliError, match=message.replace("(", r"\(").replace(")", r"\)")):
        acct.request_from_args(args(*argv), NOW)


class FakeRM:
    def __init__(self, reply: pb.AccountingResponse) -> None:
        self.reply = reply
        self.asked: list[pb.AccountingRequest] = []
        self.client = self

    def GetAccounting(self, request: pb.AccountingRequest) -> pb.AccountingResponse:
        return self.reply

    def call(self, method: Any, request: pb.AccountingRequest) -> pb.AccountingResponse:
        self.asked.append(request)
        return method(request)  # type: ignore[no-any-return]


REPLY = pb.AccountingResponse(
    rows=[pb.AccountingRow(key={"user": "alice"}, jobs=3, succeeded=2, failed=1, gpu_seconds=7200, waited=2,
                           wait_total_s=120, wait_max_s=100),
          pb.AccountingRow(key={"user": "bob"}, jobs=1, killed=1, preempted=1, preemptions=2, gpu_seconds=10)],
    total=pb.AccountingRow(jobs=4, succeeded=2, failed=1, killed=1, preempted=1, preemptions=2, gpu_seconds=7210,
                           waited=2, wait_total_s=120, wait_max_s=100),
    since_ms=round((NOW - 86400) * 1000), until_ms=round(NOW * 1000))


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    monkeypatch.setattr(acct, "connect", lambda a: FakeRM(REPLY))
    assert acct.cmd_acct(args("--by", "user", *argv)) == 0
    return capsys.readouterr().out


def test_table_json_and_csv(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lines = run(monkeypatch, capsys).splitlines()
    assert lines[0] == "finished jobs from 2026-11-09T12:00:00Z to 2026-11-10T12:00:00Z (UTC)"
    assert lines[1].split() == ["USER", "JOBS", "OK", "FAILED", "KILLED", "PREEMPTED", "GPU-HOURS", "WAIT-AVG",
                                "WAIT-MAX"]
    assert lines[2].split() == ["alice", "3", "2", "1", "0", "0", "2.00", "60s", "100s"]
    assert lines[3].split() == ["bob", "1", "0", "0", "1", "1", "<0.01", "0s", "0s"]
    assert lines[4].split()[:2] == ["total", "4"] and len(lines) == 5
    data = json.loads(run(monkeypatch, capsys, "-o", "json"))
    assert data["rows"][0] == {"user": "alice", "jobs": 3, "succeeded": 2, "failed": 1, "killed": 0, "preempted": 0,
                               "preemptions": 0, "gpu_hours": 2.0, "wait_mean_s": 60.0, "wait_max_s": 100.0}
    assert data["total"]["jobs"] == 4 and data["by"] == ["user"] and data["since"] == "2026-11-09T12:00:00Z"
    csv_lines = run(monkeypatch, capsys, "-o", "csv").splitlines()
    assert csv_lines[0] == "user,jobs,succeeded,failed,killed,preempted,preemptions,gpu_hours,wait_mean_s,wait_max_s"
    assert csv_lines[2] == "bob,1,0,0,1,1,2,0.0028,0.0,0.0" and len(csv_lines) == 3
