"""Several RMs, one leader (gpurm.common.rmlist): parsing the list, following a standby's hint, and the CLI's calls
across the list. No sockets, no sleeps."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from gpurm.cli.basics import CliError
from gpurm.cli.client import EXIT_UNREACHABLE, RM, rm_addresses
from gpurm.cli.main import main as cli_main
from gpurm.common.retry import ANSWERED
from gpurm.common.rmlist import LEADER_KEY, MAX_RMS, Channels, LeaderFollower, classify, leader_hint, parse_rm_list

# ---------------------------------------------------------------- the list


def test_a_list_is_comma_separated_or_a_sequence() -> None:
    assert parse_rm_list("rm-a:7070") == ("rm-a:7070",)
    assert parse_rm_list(" rm-a:7070 , rm-b:7071") == ("rm-a:7070", "rm-b:7071")
    assert parse_rm_list(["rm-a:7070", "rm-b:7070,rm-c:7070"]) == ("rm-a:7070", "rm-b:7070", "rm-c:7070")
    assert parse_rm_list("[::1]:7070,10.0.0.2:7070") == ("[::1]:7070", "10.0.0.2:7070")


@pytest.mark.parametrize(("value", "why"), [
    ("", "item 1 is empty"),
    ("a:7070,,b:7070", "item 2 is empty"),
    ("a:7070,", "item 2 is empty"),
    ("a", "expected HOST:PORT"),
    ("a:70x0", "port must be a number"),
    ("a:99999", "port must be a number"),
    ("a:0", "port must be from 1 to 65535"),
    (":7070", "a host is required"),
    ("a:7070,b:7070,A:7070", "listed twice"),
    (["a:7070", 7070], "item 2: expected HOST:PORT, got int"),
    (",".join(f"rm{i}:7070" for i in range(MAX_RMS + 1)), f"at most {MAX_RMS} RM addresses"),
])
def test_a_bad_list_says_why(value: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_rm_list(value)


def test_the_cli_names_the_flag_or_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPURM_RM", "a:7070,a:7070")
    with pytest.raises(CliError, match=r"^GPURM_RM: 'a:7070' is listed twice") as err:
        rm_addresses(None)
    assert err.value.code == 2
    with pytest.raises(CliError, match=r"^--rm: item 2 is empty"):
        rm_addresses("a:7070,")
    assert rm_addresses("a:1,b:2") == ("a:1", "b:2")
    monkeypatch.delenv("GPURM_RM")
    assert rm_addresses(None) == ("127.0.0.1:7070",)


def test_a_bad_rm_flag_is_a_usage_error_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["jobs", "--rm", "a:7070,,b:7070"]) == 2
    assert "--rm: item 2 is empty" in capsys.readouterr().err


# ---------------------------------------------------------------- what a failure says


def test_a_standby_names_the_leader_in_trailing_metadata() -> None:
    assert leader_hint(((LEADER_KEY, "b:7070"),)) == "b:7070"
    assert leader_hint(((LEADER_KEY, b"b:7070"),)) == "b:7070"
    assert leader_hint((("x-other", "1"),)) == "" and leader_hint(None) == "" and leader_hint([1, 2]) == ""
    standby = classify("UNAVAILABLE", "standby: the leader is b:7070", ((LEADER_KEY, "b:7070"), *ANSWERED))
    assert standby.failover and standby.hint == "b:7070" and standby.why == "standby, leader b:7070"
    unknown = classify("UNAVAILABLE", "standby; no leader elected yet", ANSWERED)
    assert unknown.failover and unknown.hint == "" and unknown.why == "standby, leader not known yet"
    dead = classify("UNAVAILABLE", "failed to connect to all addresses", ())
    assert dead.failover and dead.hint == ""
    grpc_refused = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to "
                    "remote host: Connection refused")
    assert classify("UNAVAILABLE", grpc_refused, ()).why == "Failed to connect to remote host: Connection refused"
    # The RM's own refusals stay refusals: no failover.
    assert not classify("UNAVAILABLE", "cannot read the log of c-1", ANSWERED).failover
    assert not classify("UNAVAILABLE", "the RM's store cannot be written", ()).failover
    assert not classify("PERMISSION_DENIED", "standby", ((LEADER_KEY, "b:7070"),)).failover


# ---------------------------------------------------------------- the follower


def test_the_follower_goes_round_the_list_and_backs_off_after_a_whole_round() -> None:
    f = LeaderFollower(("a:1", "b:1", "c:1"))
    assert f.current == "a:1"
    assert f.failed("refused") is False and f.current == "b:1"
    assert f.failed("refused") is False and f.current == "c:1"
    assert f.failed("refused") is True and f.current == "a:1"      # a whole round failed: back off
    assert f.tried() == "a:1 (refused), b:1 (refused), c:1 (refused)"
    f.failed("refused")
    f.succeeded()
    assert f.current == "b:1" and not f.failed_now and f.tried() == "a:1, b:1, c:1"   # stays on who answered


def test_a_hint_in_the_list_is_followed_and_one_outside_it_ignored() -> None:
    f = LeaderFollower(("a:1", "b:1", "c:1"))
    assert f.failed("standby", hint="C:1") is False and f.current == "c:1"       # the leader, case aside
    g = LeaderFollower(("a:1", "b:1", "c:1"))
    assert g.failed("standby", hint="evil.example:1") is False and g.current == "b:1"   # not configured: next
    h = LeaderFollower(("a:1", "b:1"))
    assert h.failed("standby", hint="a:1") is False and h.current == "b:1"       # itself: next
    assert h.failed("standby", hint="not an address") is True and h.current == "a:1"


def test_a_stale_hint_cannot_keep_an_rm_from_being_tried() -> None:
    f = LeaderFollower(("a:1", "b:1", "c:1"))
    assert f.failed("standby", hint="c:1") is False and f.current == "c:1"
    assert f.failed("refused") is False and f.current == "b:1"         # not back to a: b is still untried
    assert f.failed("refused") is True                                 # the round: a, c, b
    g = LeaderFollower(("a:1", "b:1", "c:1"))
    g.failed("refused")                                                # a
    assert g.failed("standby", hint="a:1") is False and g.current == "c:1"   # a failed this round: c instead


def test_a_single_rm_backs_off_after_every_failure() -> None:
    f = LeaderFollower(("a:1",))
    assert not f.several
    assert f.failed("refused") is True and f.failed("refused", hint="a:1") is True and f.current == "a:1"
    with pytest.raises(ValueError):
        LeaderFollower(())


def test_following_stubs_call_the_current_rm() -> None:
    f = LeaderFollower(("a:1", "b:1"))
    made: list[str] = []

    def make(address: str) -> str:
        made.append(address)
        return address

    class Stub:
        def __init__(self, channel: str) -> None:
            self.channel = channel

        def Ping(self, request: str) -> str:
            return f"{self.channel} answers {request}"

    channels = Channels(f, make)
    stub = channels.stub(Stub)
    assert stub.Ping("x") == "a:1 answers x"
    f.failed("refused")
    assert stub.Ping("y") == "b:1 answers y" and stub.Ping("z") == "b:1 answers z"
    assert made == ["a:1", "b:1"]       # one channel per RM, made once


# ---------------------------------------------------------------- the CLI across the list


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


REFUSED = Failure(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; connection refused")


def cluster(rm: RM, behaviour: dict[str, Any]) -> list[str]:
    """Points the RM's stubs at fakes: behaviour[address] is an exception to raise or an answer to give."""
    calls: list[str] = []

    class Stub:
        def __init__(self, address: str) -> None:
            self.address = address

        def ListJobs(self, request: Any, metadata: Any = None, timeout: float = 0) -> Any:
            calls.append(self.address)
            what = behaviour[self.address]
            if isinstance(what, Exception):
                raise what
            return what

    rm.channels = Channels(rm.follower, lambda a: a)
    rm.client = rm.channels.stub(Stub)
    return calls


def test_a_dead_first_rm_costs_no_back_off(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    rm = RM("dead:1,live:2", retry_for=60, clock=clock, sleep=clock.sleep)
    calls = cluster(rm, {"dead:1": REFUSED, "live:2": "jobs"})
    assert rm.call(rm.client.ListJobs, "req") == "jobs"
    assert calls == ["dead:1", "live:2"] and clock.slept == [] and capsys.readouterr().err == ""
    assert rm.call(rm.client.ListJobs, "req") == "jobs" and calls[-1] == "live:2"    # stays on the leader


def test_a_standby_sends_the_cli_to_the_leader_it_names() -> None:
    clock = FakeClock()
    rm = RM("a:1,b:1,c:1", retry_for=0, clock=clock, sleep=clock.sleep)
    standby = Failure(grpc.StatusCode.UNAVAILABLE, "standby", ((LEADER_KEY, "c:1"), *ANSWERED))
    calls = cluster(rm, {"a:1": standby, "b:1": REFUSED, "c:1": "jobs"})
    assert rm.call(rm.client.ListJobs, "req") == "jobs" and calls == ["a:1", "c:1"]


def test_a_hint_outside_the_list_is_not_followed() -> None:
    clock = FakeClock()
    rm = RM("a:1,b:1", retry_for=0, clock=clock, sleep=clock.sleep)
    standby = Failure(grpc.StatusCode.UNAVAILABLE, "standby", ((LEADER_KEY, "evil:1"),))
    calls = cluster(rm, {"a:1": standby, "b:1": "jobs", "evil:1": "stolen"})
    assert rm.call(rm.client.ListJobs, "req") == "jobs" and calls == ["a:1", "b:1"]


def test_with_no_leader_the_cli_fails_listing_what_it_tried(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    rm = RM("a:1,b:1", retry_for=0, clock=clock, sleep=clock.sleep)
    calls = cluster(rm, {"a:1": REFUSED, "b:1": Failure(grpc.StatusCode.UNAVAILABLE, "standby: no leader yet")})
    with pytest.raises(CliError) as err:
        rm.call(rm.client.ListJobs, "req")
    assert calls == ["a:1", "b:1"] and clock.slept == []         # each RM once, no waiting
    assert err.value.code == EXIT_UNREACHABLE
    message = err.value.message
    assert message.startswith("no RM answered as leader: tried a:1 (failed to connect to all addresses; "
                              "connection refused), b:1 (standby, leader not known yet); are they running")
    assert "--rm / GPURM_RM" in message and "--retry-for" in message


def test_rounds_of_the_list_back_off_within_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    rm = RM("a:1,b:1", retry_for=20, clock=clock, sleep=clock.sleep)
    calls = cluster(rm, {"a:1": REFUSED, "b:1": REFUSED})
    with pytest.raises(CliError) as err:
        rm.call(rm.client.ListJobs, "req")
    assert clock.now == pytest.approx(20.0) and max(clock.slept) <= 5.0
    assert len(calls) == 2 * (len(clock.slept) + 1)              # a back-off per whole round, not per RM
    assert "after retrying for 20s: tried a:1" in err.value.message
    assert capsys.readouterr().err.startswith("no RM answers as leader (tried a:1 (failed to connect")


def test_a_refusal_from_the_leader_is_not_a_failover() -> None:
    clock = FakeClock()
    rm = RM("a:1,b:1", retry_for=60, clock=clock, sleep=clock.sleep)
    calls = cluster(rm, {"a:1": Failure(grpc.StatusCode.NOT_FOUND, "no job job-9"), "b:1": "jobs"})
    with pytest.raises(CliError) as err:
        rm.call(rm.client.ListJobs, "req")
    assert err.value.code == 4 and calls == ["a:1"]

