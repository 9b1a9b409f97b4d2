"""Typed config fields shared by every gpurm YAML document (queues, job specs, rm.yaml, agent.yaml).

A `Reader` walks one mapping and collects every problem instead of stopping at the first, so a rejected
document comes back with all its errors, each naming where it is (`queues.research.nlp`), the field and why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


class ConfigError(ValueError):
    """A config document was rejected; `problems` lists every reason, one line each."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def parse_duration(value: object) -> float:
    """Seconds from `90s`, `5m`, `1.5h`, `500ms`, `2d` or a bare number of seconds.

    Raises ValueError with the reason; callers add the field's name.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 90s or 5m, got {value!r}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(f"must be a duration below 1e300 seconds, got {value!r:.40}") from None
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"expected a duration like 90s, 5m or 500ms, got {value!r}")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise ValueError(f"expected a duration like 90s or 5m, got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"must be a non-negative duration, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Short human form: 45s, 12m, 3h05m, 2d04h."""
    s = round(seconds)
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 and s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def parse_address(value: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """`host:port`, `:port` or `[v6]:port` → (host, port). Raises ValueError naming the reason."""
    text = value.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"expected [ipv6]:PORT, got {value!r}")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be a number from 0 to 65535, got {port_text!r}")
    return (host or default_host, int(port_text))


@dataclass
class Problems:
    """Collects problems across a whole document."""

    items: list[str] = field(default_factory=list)

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}" if where else message)

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError(self.items)


_MISSING: Any = object()


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:   # an int too large for a float
        return False


class Reader:
    """Reads fields of one mapping, recording problems under `where` instead of raising."""

    def __init__(self, data: object, where: str, problems: Problems) -> None:
        self.where = where
        self.problems = problems
        self.seen: set[str] = set()
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            problems.add(where, f"expected a mapping of fields, got {type(data).__name__}")
            data = {}
        self.data: Mapping[str, Any] = data

    def _at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return self.data.get(key, default)

    def error(self, key: str, message: str) -> None:
        self.problems.add(self._at(key), message)

    def text(self, key: str, default: str | None = _MISSING, *, choices: Iterable[str] = ()) -> str:
        self.seen.add(key)
        allowed = list(choices)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                self.error(key, "is required")
                return ""
            return default or ""
        value = self.data[key]
        if not isinstance(value, str) or isinstance(value, bool):
            self.error(key, f"must be a string, got {type(value).__name__}")
            return default if isinstance(default, str) else ""
        if allowed and value not in allowed:
            self.error(key, f"must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def integer(self, key: str, default: int | None = _MISSING, *, minimum: int | None = None,
                maximum: int | None = None) -> int:
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                self.error(key, "is required")
                return minimum or 0
            return default if default is not None else 0
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(key, f"must be an integer, got {value!r}")
            return minimum or 0
        if minimum is not None and value < minimum:
            self.error(key, f"must be at least {minimum}, got {value!r:.40}")
            return minimum
        if maximum is not None and value > maximum:
            self.error(key, f"must be at most {maximum}, got {value!r:.40}")
            return maximum
        return value

    def optional_int(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
        if key not in self.data or self.data[key] is None:
            self.seen.add(key)
            return None
        return self.integer(key, minimum=minimum, maximum=maximum)

    def number(self, key: str, default: float = _MISSING, *, minimum: float | None = None,
               maximum: float | None = None) -> float:
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                self.error(key, "is required")
                return minimum or 0.0
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            self.error(key, f"must be a number, got {value!r:.40}")
            return default if default is not _MISSING else 0.0
        if minimum is not None and value < minimum:
            self.error(key, f"must be at least {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            self.error(key, f"must be at most {maximum:g}, got {value:g}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            self.error(key, f"must be true or false, got {value!r}")
            return default
        return value

    def duration(self, key: str, default: float | None = _MISSING, *, maximum: float | None = None) -> float:
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                self.error(key, "is required")
                return 0.0
            return default if default is not None else 0.0
        try:
            seconds = parse_duration(self.data[key])
        except ValueError as exc:
            self.error(key, str(exc))
            return default if isinstance(default, float | int) else 0.0
        if maximum is not None and seconds > maximum:
            self.error(key, f"must be at most {format_duration(maximum)}, got {self.data[key]!r:.40}")
            return maximum
        return seconds

    def strings(self, key: str, default: list[str] | None = None) -> list[str]:
        self.seen.add(key)
        value = self.data.get(key)
        if value is None:
            return list(default or [])
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.error(key, "must be a list of strings")
            return list(default or [])
        return list(value)

    def mapping(self, key: str) -> dict[str, str]:
        self.seen.add(key)
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(key, f"must be a mapping of NAME: value, got {type(value).__name__}")
            return {}
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                self.error(key, f"names must be non-empty strings, got {k!r}")
                continue
            if isinstance(v, Mapping | list) or v is None:
                self.error(f"{key}.{k}", f"must be a string or number, got {type(v).__name__}")
                continue
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    def section(self, key: str) -> Reader:
        self.seen.add(key)
        return Reader(self.data.get(key), self._at(key), self.problems)

    def reject_unknown(self, extra_allowed: Iterable[str] = ()) -> None:
        """Every key not read (nor allowed) is an error: a typo must not be silently ignored."""
        allowed = self.seen | set(extra_allowed)
        known = sorted(allowed)
        for key in self.data:
            if key not in allowed:
                hint = _closest(str(key), known)
                suffix = f" (did you mean {hint!r}?)" if hint else f" (known: {', '.join(known)})"
                self.error(str(key), f"unknown field{suffix}")


def _closest(word: str, candidates: list[str]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return matches[0] if matches else None
