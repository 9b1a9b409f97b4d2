"""Terminal output: aligned tables, JSON for scripts, short times."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from google.protobuf.message import Message

from gpurm.common.fields import format_duration
from gpurm.common.jsonshape import ITEM_SEPARATOR, to_json_text, to_plain


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO | None = None,
          max_last: int = 0) -> None:
    """Columns padded to their widest cell; the last column is left ragged (it holds free text)."""
    StreamTable(headers, out, max_last).add(rows, header_if_empty=True)


class StreamTable:
    """An aligned table printed a page of rows at a time (`gpurm nodes` and `gpurm jobs` print each page as it
    comes): the first page sets the column widths; a later page with a wider cell widens its columns and prints
    the header again above itself, so every block of rows stays aligned under a header without holding all rows.
    The last column is left ragged (free text)."""

    def __init__(self, headers: Sequence[str], out: TextIO | None = None, max_last: int = 0) -> None:
        self.headers = [str(h) for h in headers]
        self.out = out or sys.stdout
        self.max_last = max_last
        self.widths: list[int] | None = None
        self._format = ""          # a line's format for these widths (the last column ragged)
        self.rows = 0

    def add(self, rows: Sequence[Sequence[object]], header_if_empty: bool = False) -> None:
        """Print a page of rows (an empty page prints nothing, not even the header, unless asked)."""
        if not rows and (self.widths is not None or not header_if_empty):
            return
        cells = [["" if c is None else str(c) for c in row] for row in rows]
        if self.max_last:
            for row in cells:
                if len(row[-1]) > self.max_last:
                    row[-1] = row[-1][: self.max_last - 1] + "…"
        n = len(self.headers)
        need = [max([len(self.headers[i])] + [len(r[i]) for r in cells]) for i in range(n)]
        if self.widths is None or any(need[i] > self.widths[i] for i in range(n - 1)):
            self.widths = need if self.widths is None else [max(a, b) for a, b in zip(self.widths, need, strict=True)]
            self._format = "  ".join([f"{{:<{w}}}" for w in self.widths[:-1]] + ["{}"])
            if self.rows:
                self.out.write("\n")
            self._line(self.headers)
        # A page's lines in one write, each formatted by str.format (a 100,000-job table spent a third of its time
        # padding cells one by one).
        fmt = self._format.format
        self.out.write("".join([fmt(*row).rstrip() + "\n" for row in cells]))
        self.rows += len(cells)
        self.out.flush()

    def _line(self, row: Sequence[str]) -> None:
        self.out.write(self._format.format(*row).rstrip() + "\n")


class JsonArray:
    """One JSON array written an item at a time (a listing printed as its pages come): the same text
    `print_json` writes for the whole list, without holding it: one item a line. Use as a context manager: `]`
    closes the array even when a later page fails (the error goes to stderr), so stdout stays one valid JSON
    document."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.count = 0

    def __enter__(self) -> JsonArray:
        return self

    def add(self, value: Any) -> None:
        self.out.write(("[\n  " if not self.count else SEPARATOR) + item_json(value))
        self.count += 1

    def extend(self, values: Sequence[Any]) -> None:
        """Items of a page, in one write."""
        if values:
            self.out.write(("[\n  " if not self.count else SEPARATOR) + SEPARATOR.join([item_json(v) for v in values]))
            self.count += len(values)

    def extend_text(self, items: bytes, count: int, most: int | None = None) -> None:
        """`count` items written already (JSON text, one a line, joined by SEPARATOR: a ListJobs page the RM
        wrote), the first `most` of them (None: all), written as they are."""
        if most is not None and count > most:
            parts = items.split(SEPARATOR_BYTES)[:most]      # an item is one line: the separator is never inside one
            items, count = SEPARATOR_BYTES.join(parts), len(parts)
        if not count:
            return
        head = b"[\n  " if not self.count else SEPARATOR_BYTES
        raw = getattr(self.out, "buffer", None)
        if raw is not None:             # stdout: the bytes as they are, after what the text layer holds
            self.out.flush()
            raw.write(head + items)
        else:
            self.out.write((head + items).decode())
        self.count += count

    def __exit__(self, *exc: object) -> None:
        self.out.write("[]\n" if not self.count else "\n]\n")
        self.out.flush()


def to_json(value: Any) -> str:
    """A value as `-o json` prints it: a list one item a line (a listing of 10,000 servers is then one line a
    server, written by the json module's C encoder: indenting every field made it five times the size and took
    seconds), anything else indented."""
    if isinstance(value, list):
        return "[\n" + ",\n".join("  " + item_json(v) for v in value) + "\n]" if value else "[]"
    if isinstance(value, Message):
        value = message_dict(value)
    return json.dumps(value, indent=2, sort_keys=False, default=str)


SEPARATOR = ITEM_SEPARATOR
SEPARATOR_BYTES = SEPARATOR.encode()
_ITEM = json.JSONEncoder(default=str).encode     # one encoder for every item (json.dumps makes one a call)


def item_json(value: Any) -> str:
    """One item of a listed array, on one line (what json.dumps(value, default=str) writes; a message's text
    written straight from it, gpurm/common/jsonshape.py)."""
    if isinstance(value, Message):
        return to_json_text(value)
    return _ITEM(value)


def message_dict(msg: Message) -> dict[str, Any]:
    """A message in gpurm's one JSON shape (gpurm/common/jsonshape.py: enums without their prefix, numbers as
    numbers)."""
    return to_plain(msg)


def print_json(value: Any) -> None:
    sys.stdout.write(to_json(value) + "\n")


def ago(ms: int, now: float | None = None) -> str:
    if not ms:
        return "-"
    return format_duration(max(0.0, (now or time.time()) - ms / 1000))


def span(start_ms: int, end_ms: int, now: float | None = None) -> str:
    if not start_ms:
        return "-"
    end = end_ms / 1000 if end_ms else (now or time.time())
    return format_duration(max(0.0, end - start_ms / 1000))


def clock(ms: int) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def ranges(indices: Sequence[int]) -> str:
    """[0,1,2,3,6] -> "0-3,6"."""
    out: list[str] = []
    items = sorted(indices)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out) or "-"


class Progress:
    """One self-rewriting status line on stderr when it is a terminal; plain lines otherwise."""

    def __init__(self, enabled: bool = True) -> None:
        self.tty = sys.stderr.isatty()
        self.enabled = enabled
        self._last = ""

    def update(self, text: str) -> None:
        if not self.enabled or text == self._last:
            return
        self._last = text
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text[:200])
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty and self._last:
            sys.stderr.write("\n")
            sys.stderr.flush()
