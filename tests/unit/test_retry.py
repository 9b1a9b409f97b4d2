"""The shared retry rule (gpurm.common.retry) and the CLI's calls that ride out an RM restart: no sockets, no sleeps."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpurm.cli.basics import CliError
from gpurm.cli.client import EXIT_UNREACHABLE, RM, retry_window
from gpurm.common.retry import AGENT_POLICY, AM_POLICY, ANSWERED, CLI_POLICY, Outage, RetryPolicy, transient


def test_backoff_grows_is_capped_and_jittered() -> None:
    outage = Outage(RetryPolicy(base_s=0.25, max_s=2.0, give_up_s=0), started=0.0, rng=random.Random(3))
    delays = [outage.next_delay(0.0) for _ in range(8)]
    ceilings = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert all(d is not None and c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert len(set(delays)) == len(delays)       # jittered: no two alike
    assert outage.left(1e9) is None              # give_up_s 0: never gives up


def test_outage_gives_up_at_its_deadline_and_never_sleeps_past_it() -> None:
    outage = Outage(RetryPolicy(base_s=1.0, max_s=30.0, give_up_s=10.0), started=100.0, rng=random.Random(1))
    assert outage.deadline == 110.0
    assert outage.next_delay(109.5) == pytest.approx(0.5)   # the back-off would be longer: clipped to what is left
    assert outage.next_delay(110.0) is None
    assert outage.elapsed(112.0) == 12.0


def test_what_counts_as_the_rm_being_away() -> None:
    assert transient("UNAVAILABLE", "failed to connect to all addresses")
    assert transient("DEADLINE_EXCEEDED")
    assert not transient("UNAVAILABLE", "the RM's store cannot be written: disk full")   # up, but refusing
    assert not transient("PERMISSION_DENIED") and not transient("NOT_FOUND")
    assert not transient("UNAVAILABLE", "a refusal", answered=True)        # the RM's own UNAVAILABLE
    # A client whose security does not match the RM's: retrying cannot help.
    assert not transient("UNAVAILABLE", "last error: UNKNOWN: Tls handshake failed (TSI_PROTOCOL_FAILURE)")
    closed = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:7070: Socket closed"
    assert not transient("UNAVAILABLE", closed, reached=False)   # a plaintext client to an mTLS RM
    assert transient("UNAVAILABLE", closed, reached=True)        # an RM that answered before and went away


def test_defaults_and_policy_checks() -> None:
    assert CLI_POLICY.give_up_s == 60 and AM_POLICY.give_up_s > CLI_POLICY.give_up_s and AGENT_POLICY.give_up_s == 0
    assert RetryPolicy(base_s=0, max_s=1, give_up_s=-1).problems() == [
        "base: must be above 0, got 0", "give_up_after: must be 0 (never) or more, got -1"]
    assert RetryPolicy(base_s=2, max_s=1).problems() == ["max: must be at least base (2s), got 1"]


class Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "", trailer: tuple[tuple[str, str], ...] = ()) -> None:
        self._code, self._details, self._trailer = code, details, trailer

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailer

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def rm_with(clock: FakeClock, retry_for: float) -> RM:
    return RM("127.0.0.1:1", retry_for=retry_for, clock=clock, sleep=clock.sleep)


def flaky(failures: list[Exception]) -> Any:
    calls = []

    def method(request: Any, metadata: Any = None, timeout: float = 0) -> str:
        calls.append(request)
        if failures:
            raise failures.pop(0)
        return "answer"

    method.calls = calls  # type: ignore[attr-defined]
    return method


def test_a_call_rides_out_an_rm_restart(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    rm = rm_with(clock, 60)
    method = flaky([Failure(grpc.StatusCode.UNAVAILABLE, "connection refused")] * 5)
    assert rm.call(method, "req") == "answer"
    assert len(method.calls) == 6 and len(clock.slept) == 5
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "RM at 127.0.0.1:1 unreachable (connection refused); retrying for 60s ..."
    assert err[1].startswith("RM at 127.0.0.1:1 answers again after") and len(err) == 2
    rm.close()


def test_on_a_terminal_the_time_left_is_rewritten_in_place(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    rm = rm_with(clock, 60)
    rm.tty = True
    assert rm.call(flaky([Failure(grpc.StatusCode.UNAVAILABLE, "refused")] * 4), "req") == "answer"
    err = capsys.readouterr().err
    assert err.startswith("RM at 127.0.0.1:1 unreachable (refused); retrying for 60s ...\n")
    assert err.count("\r\x1b[2K  still unreachable, ") == 3 and "s left ..." in err
    assert " left ...\nRM at 127.0.0.1:1 answers again after " in err and err.endswith("\n")
    rm.close()


def test_a_call_gives_up_after_its_window_with_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    rm = rm_with(clock, 20)
    method = flaky([Failure(grpc.StatusCode.UNAVAILABLE, "connection refused")] * 1000)
    with pytest.raises(CliError) as err:
        rm.call(method, "req")
    assert err.value.code == EXIT_UNREACHABLE == 3
    assert "cannot reach the RM at 127.0.0.1:1 after retrying for 20s (connection refused)" in err.value.message
    assert clock.now == pytest.approx(20.0) and max(clock.slept) <= 5.0
    rm.close()


@pytest.mark.parametrize(("failure", "code"), [
    (Failure(grpc.StatusCode.NOT_FOUND, "no job job-9"), 4),
    (Failure(grpc.StatusCode.PERMISSION_DENIED, "bob may not kill job-9"), 5),
    (Failure(grpc.StatusCode.UNAVAILABLE, "cannot read the log of c-1 from node-2", ANSWERED), 2),
    (Failure(grpc.StatusCode.UNAVAILABLE, "the RM's store cannot be written"), 2)])
def test_refusals_are_not_retried_and_exit_with_their_own_code(failure: Failure, code: int) -> None:
    clock = FakeClock()
    rm = rm_with(clock, 60)
    method = flaky([failure])
    with pytest.raises(CliError) as err:
        rm.call(method, "req")
    assert len(method.calls) == 1 and clock.slept == [] and err.value.code == code
    assert "cannot reach the RM" not in err.value.message
    rm.close()


def test_retry_for_zero_fails_at_once() -> None:
    clock = FakeClock()
    rm = rm_with(clock, 0)
    with pytest.raises(CliError) as err:
        rm.call(flaky([Failure(grpc.StatusCode.UNAVAILABLE, "refused")]), "req")
    assert err.value.code == 3 and clock.slept == [] and "after retrying" not in err.value.message
    rm.close()


def test_retry_window_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPURM_RETRY_FOR", raising=False)
    assert retry_window(None) == 60
    monkeypatch.setenv("GPURM_RETRY_FOR", "2m")
    assert retry_window(None) == 120 and retry_window("0") == 0 and retry_window("5s") == 5
    with pytest.raises(CliError, match="--retry-for"):
        retry_window("soon")


def test_the_ams_window_comes_from_rm_yaml(tmp_path: Path) -> None:
    from gpurm.common.fields import ConfigError
    from gpurm.rm.config import load_rm_config

    path = tmp_path / "rm.yaml"
    path.write_text("listen: 127.0.0.1:7070\n")
    assert load_rm_config(path).am_rm_retry_for_s == AM_POLICY.give_up_s == 600
    path.write_text("am: {rm_retry_for: 30m}\n")
    assert load_rm_config(path).am_rm_retry_for_s == 1800
    path.write_text("am: {rm_retry_for: soon}\n")
    with pytest.raises(ConfigError, match=r"am\.rm_retry_for"):
        load_rm_config(path)
