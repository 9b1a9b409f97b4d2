"""A learner that goes through the phases of a deep-learning job, for right-sizing (docs/jobs.md, "Right-sizing").

    python scripts/workloads/phased_learner.py --scale 1.0 --epochs 2 --mem-mib 300

Per epoch: load data (allocate and touch memory, little CPU), train (busy CPU on every worker, steady memory),
evaluate (one busy worker, a smaller buffer), checkpoint (write the buffer to a file, then drop it). Durations
are `--scale` seconds times the phase's weight, so a test can run one in a couple of seconds. Uses only the
standard library: it runs anywhere the agent runs a command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

PAGE = 4096


def touch(buf: bytearray) -> None:
    for i in range(0, len(buf), PAGE):
        buf[i] = 1


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="seconds per unit of phase length (default 1)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--mem-mib", type=int, default=300, help="the training buffer (default 300 MiB)")
    p.add_argument("--workers", type=int, default=2, help="busy processes while training (default 2)")
    p.add_argument("--out", default="checkpoint.bin", help="checkpoint file (default ./checkpoint.bin)")
    a = p.parse_args()
    if not (0 < a.scale <= 600 and 1 <= a.epochs <= 100 and 1 <= a.mem_mib <= 65536 and 1 <= a.workers <= 64):
        p.error("--scale 0-600, --epochs 1-100, --mem-mib 1-65536, --workers 1-64")
    mib = 1024 * 1024
    for epoch in range(a.epochs):
        print(f"epoch {epoch}: load", flush=True)
        steps = 10                                 # load: memory grows step by step, CPU mostly idle
        chunks = []
        for _ in range(steps):
            chunk = bytearray(a.mem_mib * mib // steps)
            touch(chunk)
            chunks.append(chunk)
            time.sleep(3 * a.scale / steps)
        print(f"epoch {epoch}: train", flush=True)
        # Busy workers in fresh interpreters (small, and sharing no pages with this one: summed RSS stays true).
        code = f"import time\nend = time.monotonic() + {6 * a.scale}\nwhile time.monotonic() < end: sum(range(1000))"
        workers = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(a.workers)]
        for w in workers:
            w.wait()
        print(f"epoch {epoch}: evaluate", flush=True)
        evalbuf = bytearray(a.mem_mib * mib // 4)   # a batch of evaluation data beside the model
        touch(evalbuf)
        spin(2 * a.scale)
        del evalbuf
        print(f"epoch {epoch}: checkpoint", flush=True)
        with open(Path(a.out), "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            with contextlib.suppress(OSError):   # /dev/null and pipes cannot be synced
                os.fsync(f.fileno())
        del chunks
        time.sleep(1 * a.scale)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
