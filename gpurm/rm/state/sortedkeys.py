"""SortedKeys: unique keys (tuples) kept in order on a plain list with bisect.

The RM and the simulator keep small ordered indexes (nodes by free GPUs, queues by neediness, jobs waiting for an
AM, idle AMs by rank) that change on every event. At their sizes (up to a few thousand keys) an insertion that
moves pointers in C costs less than sortedcontainers' pure-Python bookkeeping, and this module is compiled with
the hot paths (see native/). scripts/bench/sorted_index measures both: 1.7-1.9x faster up to 1,000 keys, 0.86x at
10,000 and 0.2x at 100,000 (list insertion is O(n)), so an index that grows past ~5,000 keys wants
sortedcontainers.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=tuple[Any, ...])


class SortedKeys(Generic[K]):
    """Unique keys in ascending order."""

    def __init__(self) -> None:
        self._keys: list[K] = []

    def add(self, key: K) -> None:
        bisect.insort(self._keys, key)

    def discard(self, key: K) -> None:
        """Remove `key` if present."""
        keys = self._keys
        i = bisect.bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            del keys[i]

    def first(self) -> K:
        """The smallest key (IndexError when empty)."""
        return self._keys[0]

    def pop_first(self) -> K:
        """Remove and return the smallest key (IndexError when empty)."""
        return self._keys.pop(0)

    def head(self, n: int) -> list[K]:
        """The `n` smallest keys, a copy."""
        return self._keys[:n]

    def rank(self, key: K) -> int:
        """How many keys are < `key` (O(log n))."""
        return bisect.bisect_left(self._keys, key)

    def from_key(self, low: K) -> Iterator[K]:
        """Keys >= `low`, ascending. The index must not change while this is iterated."""
        keys = self._keys
        for i in range(bisect.bisect_left(keys, low), len(keys)):
            yield keys[i]

    def __contains__(self, key: K) -> bool:
        keys = self._keys
        i = bisect.bisect_left(keys, key)
        return i < len(keys) and keys[i] == key

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)
