"""Each live container's usage series, kept in memory and mirrored to `<container dir>/usage.jsonl`.

Bounded: the agent keeps the newest `SERIES_MAX_SAMPLES` samples (2880: 12 hours at the default 15 s). Lines are
appended; once the file holds twice that many it is rewritten (atomically: a new file renamed over it) with the
newest `SERIES_MAX_SAMPLES`, so it never grows past 2 x 2880 lines (about 350 KiB) however long the job runs.

The container dir belongs to the job's user, who could plant a symlink or rewrite the file: the agent appends
only through `open_append` (never through a symlink, only to a plain file), replaces it through
`write_json_atomic`'s way (a new O_EXCL file, renamed), and never reads it back: what it reports (phases, in
`gpurm/rightsize/`) comes from its own in-memory copy. A write that fails is logged once and the series goes on
in memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from pathlib import Path

from gpurm.nodeagent.private import open_append, write_private
from gpurm.rightsize.series import SERIES_FILE, Sample, format_series

log = logging.getLogger(__name__)

SERIES_MAX_SAMPLES = 2880


class ContainerSeries:
    def __init__(self, path: Path | None, max_samples: int = SERIES_MAX_SAMPLES) -> None:
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self.path = path                         # None: in memory only
        self.max_samples = max_samples
        self.samples: deque[Sample] = deque(maxlen=max_samples)
        self.lines_in_file = 0
        self.origin: float | None = None         # wall time of the first sample
        self._failed = False

    def add(self, now: float, cpu: float, mem_mib: float, gpu: float | None) -> Sample:
        if self.origin is None:
            self.origin = now
        sample = Sample(t=max(0.0, now - self.origin), cpu=cpu, mem_mib=mem_mib, gpu=gpu)
        self.samples.append(sample)
        if self.path is not None and not self._failed:
            try:
                if self.lines_in_file + 1 > 2 * self.max_samples:
                    self._rewrite(self.path)
                else:
                    self._append(self.path, sample)
            except OSError as exc:
                self._failed = True
                log.warning("usage series %s: cannot write (%s); kept in memory only", self.path, exc)
        return sample

    def _append(self, path: Path, sample: Sample) -> None:
        fd = open_append(path)
        try:
            os.write(fd, (sample.line() + "\n").encode())
        finally:
            os.close(fd)
        self.lines_in_file += 1

    def _rewrite(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        write_private(tmp, format_series(self.samples).encode())
        os.replace(tmp, path)
        self.lines_in_file = len(self.samples)


def series_path(container_dir: Path) -> Path:
    return container_dir / SERIES_FILE
