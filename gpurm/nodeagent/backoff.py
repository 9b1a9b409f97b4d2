"""Jittered exponential back-off for reconnect loops: the shared rule lives in `gpurm.rm.retry`."""

from __future__ import annotations

from gpurm.rm.retry import Backoff

__all__ = ["Backoff"]
