"""Text from outside (learner output, job names, diagnostics, claimed names) made safe for a log line or a
terminal: control characters (ESC sequences, carriage returns, newlines that would forge a log line, NULs)
become visible escapes, so nothing a job prints can rewrite a terminal or inject a fake log record."""

from __future__ import annotations

import logging
import re
import sys

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROLS_AND_NEWLINES = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    ch = m.group(0)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 0x100
                                                         else f"\\u{ord(ch):04x}")


def escape_controls(text: str, keep_newlines: bool = False) -> str:
    """`text` with every control character (and, unless kept, every newline) shown as an escape."""
    pattern = _CONTROLS if keep_newlines else _CONTROLS_AND_NEWLINES
    return pattern.sub(_escape, text)


class SafeFormatter(logging.Formatter):
    """A formatter whose message part never carries control characters or extra lines (tracebacks, which
    the process itself writes, keep theirs)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | int = "INFO", fmt: str = LOG_FORMAT) -> None:
    """Every daemon's logging: one safe line per record on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
