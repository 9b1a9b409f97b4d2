"""Jittered exponential back-off for reconnect loops: the shared rule lives in `gpurm.common.retry`."""

from __future__ import annotations

from gpurm.common.retry import Backoff

__all__ = ["Backoff"]
