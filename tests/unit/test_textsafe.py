"""Learner output and other outside text cannot forge log lines or drive a terminal."""

from __future__ import annotations

import logging

from gpurm.common.textsafe import SafeFormatter, escape_controls


def test_controls_become_visible_escapes() -> None:
    assert escape_controls("ok\x1b[2J\rfake\nINFO root: forged\x00") == "ok\\x1b[2J\\rfake\\nINFO root: forged\\x00"
    assert escape_controls("a\nb", keep_newlines=True) == "a\nb"
    assert escape_controls("tab\there") == "tab\\there"
    assert escape_controls("rtl\u202eevil") == "rtl\\u202eevil"
    assert escape_controls("plain ünïcode ✓") == "plain ünïcode ✓"


def test_a_log_record_stays_one_line() -> None:
    record = logging.LogRecord("gpurm", logging.INFO, __file__, 1, "learner said %s", ("x\n2026 ERROR fake",), None)
    line = SafeFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO learner said x\\n2026 ERROR fake"


def test_the_safe_formatter_writes_logging_s_own_time_text() -> None:
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    safe, plain = SafeFormatter(fmt), logging.Formatter(fmt)
    record = logging.LogRecord("gpurm.x", logging.INFO, "p", 1, "job %s", ("job-1",), None)
    for created in (1.0, 1795866989.0004, 1795866989.3557968, 1795866989.9999, 1795866990.5):
        record.created, record.msecs = created, float(int((created - int(created)) * 1000))
        assert safe.format(record) == plain.format(record)
