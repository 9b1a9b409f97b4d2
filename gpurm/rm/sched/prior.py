"""The history's prior: finished jobs from before this RM (or simulation) started, read from a CSV file, so that
`gittins` ranks and the run-time estimates start from a learned distribution instead of plain `las`
(rm.yaml `scheduler.history.prior`, `gpurm sim --history-prior`).

The file has a header row. Columns: `gpus` and either `size_gpu_s` (GPUs x seconds attained) or `duration_s`
(seconds; `run_s` is read the same way, so a `gpurm sim` jobs.csv serves as is); `queue`, `user`, `name` are
optional (the history conditions on them where present). Rows of unfinished jobs (`state` UNFINISHED, REJECTED)
and rows without a positive size are skipped.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from gpurm.rm.sched.history import Finished

MAX_ROWS = 2_000_000          # a prior larger than this is refused (memory: each row is kept)
SKIPPED_STATES = ("UNFINISHED", "REJECTED")


class PriorError(ValueError):
    """The prior file cannot be read: the message names the file, the row and the field."""


def load_prior(path: Path) -> tuple[Finished, ...]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            columns = set(reader.fieldnames or ())
            if "gpus" not in columns or not columns & {"size_gpu_s", "duration_s", "run_s"}:
                raise PriorError(f"{path}: needs a header with `gpus` and one of `size_gpu_s`, `duration_s`, "
                                 f"`run_s`; it has {', '.join(sorted(columns)) or 'none'}")
            out: list[Finished] = []
            for row in reader:
                if len(out) >= MAX_ROWS:
                    raise PriorError(f"{path}: more than {MAX_ROWS:,} rows; keep the most recent jobs")
                finished = _row(path, reader.line_num, row)
                if finished is not None:
                    out.append(finished)
    except OSError as exc:
        raise PriorError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return tuple(out)


def _row(path: Path, line: int, row: dict[str, str]) -> Finished | None:
    if (row.get("state") or "").upper() in SKIPPED_STATES:
        return None
    gpus = _number(path, line, row, "gpus")
    if gpus is None or gpus <= 0:
        return None
    size = _number(path, line, row, "size_gpu_s")
    if size is None:
        duration = _number(path, line, row, "duration_s")
        if duration is None:
            duration = _number(path, line, row, "run_s")
        size = duration * gpus if duration is not None else None
    if size is None or size <= 0:
        return None
    return Finished(queue=_queue(row.get("queue") or ""), user=row.get("user") or "", name=row.get("name") or "",
                    gpus=gpus, size_gpu_s=size)


def _number(path: Path, line: int, row: dict[str, str], key: str) -> float | None:
    raw = (row.get(key) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise PriorError(f"{path}, line {line}: {key} must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(value):
        raise PriorError(f"{path}, line {line}: {key} must be finite, got {raw[:40]!r}")
    return value


def _queue(name: str) -> str:
    """Queues as the RM names them (root.x.y); a simulator's jobs.csv writes them below root."""
    return name if not name or name == "root" or name.startswith("root.") else f"root.{name}"
