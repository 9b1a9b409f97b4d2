"""Stop orders (rm/state/stops.py): queued per node, taken once, repeated when the agent did not act."""

from __future__ import annotations

from gpurm.rm.state.stops import StopBook, StopOrder


def test_orders_are_taken_once_per_node() -> None:
    book = StopBook()
    book.order(StopOrder("n1", "c1", 10.0, "killed"))
    book.order(StopOrder("n1", "c1", 0.0, "killed again"))     # replaces the unsent one
    book.order(StopOrder("n2", "c2", 10.0, "x"))
    assert sorted(book.nodes()) == ["n1", "n2"]
    assert book.take("n1", 5.0) == [StopOrder("n1", "c1", 0.0, "killed again")]
    assert book.take("n1", 6.0) == []
    assert book.nodes() == ["n2"]
    book.drop_node("n2")
    assert book.nodes() == []


def test_an_order_is_repeated_only_after_the_resend_interval_and_not_while_one_waits() -> None:
    book = StopBook()
    assert book.resend_due("n1", "c1", 11.0, 10.0)           # never sent
    book.order(StopOrder("n1", "c1", 10.0, "x"))
    assert not book.resend_due("n1", "c1", 11.0, 10.0)       # one waits already
    book.take("n1", 11.0)
    assert not book.resend_due("n1", "c1", 20.0, 10.0)
    assert book.resend_due("n1", "c1", 21.5, 10.0)
    book.ended("c1")
    assert book.sent == {}
