"""The RM's memory of GPU telemetry (the web UI's charts): latest reading, bounded history, bad payloads ignored;
and the pages' SVG and grid pieces escape what they are given."""

from __future__ import annotations

import json

from gpurm.rm.http import pages
from gpurm.rm.server.telemetrybook import HISTORY, TelemetryBook


def reading(t: int, utils: dict[int, float]) -> bytes:
    return json.dumps({"node_id": "n1", "time_ms": t,
                       "gpus": [{"index": i, "util_pct": u} for i, u in utils.items()]}).encode()


def test_latest_and_history_per_gpu() -> None:
    book = TelemetryBook()
    book.record("n1", reading(1000, {0: 10.0, 1: 20.0}))
    book.record("n1", reading(2000, {0: 30.0, 1: 40.0}))
    assert book.latest("n1")["time_ms"] == 2000
    assert book.series("n1") == [{"time_ms": 1000, "util_pct": {"0": 10.0, "1": 20.0}},
                                 {"time_ms": 2000, "util_pct": {"0": 30.0, "1": 40.0}}]
    assert book.series("n1", {1}) == [{"time_ms": 1000, "util_pct": {"1": 20.0}},
                                      {"time_ms": 2000, "util_pct": {"1": 40.0}}]
    assert book.series("other") == [] and book.latest("other") == {}


def test_history_is_bounded_and_bad_payloads_are_ignored() -> None:
    book = TelemetryBook()
    for t in range(HISTORY + 50):
        book.record("n1", reading(t, {0: 1.0}))
    assert len(book.series("n1")) == HISTORY and book.series("n1")[0]["time_ms"] == 50
    for junk in (b"not json", b"[1, 2]", json.dumps({"gpus": [{"index": "x", "util_pct": "y"}]}).encode()):
        book.record("n2", junk)
    assert book.series("n2") == [] and book.series("n1")[-1]["time_ms"] == HISTORY + 49


def test_page_pieces_escape_their_input() -> None:
    node = {"gpus": [{"index": 0, "state": "used", "jobs": ['"><script>x</script>'], "healthy": True,
                      "health_reason": "<b>"}]}
    cells = pages.gpu_cells(node)
    assert "<script>" not in cells and "&lt;script&gt;" in cells and "&lt;b&gt;" in cells
    svg = pages.chart({"<img src=x>": [{"time_ms": 1, "util_pct": {"0": 50.0}},
                                       {"time_ms": 2, "util_pct": {"0": 60.0}}]})
    assert "<img" not in svg and "&lt;img src=x&gt;" in svg
    assert pages.tally(node["gpus"]) == "1 used" and pages.tally([]) == "0 free"
    assert "<rect" in pages.bar([(3, "seg-used", "<u>")], 8) and "<u>" not in pages.bar([(3, "seg-used", "<u>")], 8)
