"""Text from outside (learner output, job names, diagnostics, claimed names) made safe for a log line or a
terminal: control characters (ESC sequences, carriage returns, newlines that would forge a log line, NULs)
become visible escapes, so nothing a job prints can rewrite a terminal or inject a fake log record."""

from __future__ import annotations

import logging
import re
import sys
import time

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

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._second = -1          # the second whose date and time text is kept (a busy RM logs many a second)
        self._stamp = ""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """logging's own `asctime` (local time, then milliseconds), the date and time formatted once a second."""
        if datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"      # logging.Formatter.default_msec_format


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | int = "INFO", fmt: str = LOG_FORMAT) -> None:
    """Every daemon's logging: one safe line per record on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter(fmt))
    # What a record would gather and no line of ours shows (the logging HOWTO's "Optimization"): the caller's file
    # and line (a walk up the stack per record), the thread and process. A submit logs a line; at 1,000 a second
    # these were most of its cost.
    if not any(f"%({name})" in fmt for name in ("pathname", "filename", "module", "funcName", "lineno")):
        logging._srcfile = None
    logging.logThreads = "%(thread" in fmt
    logging.logProcesses = "%(process" in fmt
    logging.logMultiprocessing = "%(processName" in fmt
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
